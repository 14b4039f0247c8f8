// Chat templates rendered as transformers' apply_chat_template(...,
// tokenize=False) renders them: the template's Jinja (core/jinja) with
// messages, tools, documents, add_generation_prompt, bos_token, eos_token,
// raise_exception, strftime_now and the caller's variables. docs/tokenizers.md
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvscope::tokenizer {

// A template's source and where it came from ("tokenizer_config.json
// chat_template", a file path), for messages.
struct ChatTemplate {
  std::string source;
  std::string origin;
};

// What the template is rendered with.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content", ...}]
  nlohmann::ordered_json tools;                                       // null: no tools
  bool add_generation_prompt = true;
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();  // --chat-var / --var
  std::string bos_token, eos_token;
};

// Renders; throws InputError(origin, "chat_template", ...) when the template
// does not parse (line and column), uses an unsupported construct, raises
// (its own message) or passes a limit. `warnings` gets a line per variable in
// `vars` the template never reads.
std::string render_chat(const ChatTemplate& t, const ChatRequest& r,
                        std::vector<std::string>* warnings = nullptr);

// A line per variable in `vars` the template never reads (a warning, not an
// error: a misspelt --chat-var). Throws InputError when it does not parse.
std::vector<std::string> unread_chat_vars(const ChatTemplate& t,
                                          const nlohmann::ordered_json& vars);

// A template file as is; throws InputError when unreadable.
ChatTemplate read_chat_template_file(const std::string& path);
// MSGS.json: a list of messages, or an object with "messages" and "tools".
ChatRequest read_chat_messages(const std::string& path);
// "NAME=JSON" (a bare word that is not JSON is taken as a string) into `vars`;
// throws InputError(flag, ...) naming the bad spec.
void add_chat_var(const std::string& spec, const std::string& flag, nlohmann::ordered_json* vars);

}  // namespace kvscope::tokenizer
