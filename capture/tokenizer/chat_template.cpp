#include "capture/tokenizer/chat_template.h"

#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

#include "core/common/input_error.h"
#include "core/jinja/template.h"

namespace kvscope::tokenizer {

namespace {

using nlohmann::ordered_json;

// transformers' strftime_now(format): datetime.now().strftime(format).
jinja::Value strftime_now_function() {
  return jinja::Value::function("strftime_now", [](jinja::Args& args) -> jinja::Value {
    const jinja::Value* format = args.get(0, "format");
    if (format == nullptr || !format->is_string())
      throw jinja::TemplateError("strftime_now() takes a format string", "TypeError");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char out[512];
    const size_t n = std::strftime(out, sizeof out, format->str().c_str(), &local);
    return jinja::Value(std::string(out, n));
  });
}

void set(jinja::Value& dict, const std::string& name, jinja::Value v) {
  dict.dict_mut().set(jinja::Value(name), std::move(v));
}

// The variables transformers renders with: messages, tools, documents (None
// when absent), add_generation_prompt, the special tokens it has, the
// caller's variables (which may override any of them, as **kwargs do), and
// raise_exception / strftime_now.
jinja::Value template_globals(const ChatRequest& r) {
  jinja::Value g = jinja::Value::dict();
  set(g, "messages", jinja::from_json(r.messages));
  set(g, "tools", r.tools.is_null() ? jinja::Value(nullptr) : jinja::from_json(r.tools));
  set(g, "documents", jinja::Value(nullptr));
  set(g, "add_generation_prompt", jinja::Value(r.add_generation_prompt));
  if (!r.bos_token.empty()) set(g, "bos_token", jinja::Value(r.bos_token));
  if (!r.eos_token.empty()) set(g, "eos_token", jinja::Value(r.eos_token));
  for (auto it = r.vars.begin(); it != r.vars.end(); ++it)
    set(g, it.key(), jinja::from_json(it.value()));
  set(g, "raise_exception", jinja::raise_exception_function());
  set(g, "strftime_now", strftime_now_function());
  return g;
}

std::string read_text(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, field, "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

jinja::Template parse_chat_template(const ChatTemplate& t) {
  try {
    return jinja::Template::parse(t.source, t.origin);
  } catch (const jinja::TemplateError& e) {
    std::string what = e.what();  // "<origin>: line L, column C: ..."; the file is named once
    if (what.rfind(t.origin + ": ", 0) == 0) what.erase(0, t.origin.size() + 2);
    throw InputError(t.origin, "chat_template", what);
  }
}

std::vector<std::string> unread_vars(const jinja::Template& tmpl, const ChatTemplate& t,
                                     const ordered_json& vars) {
  const std::set<std::string> reads = tmpl.free_variables();
  std::vector<std::string> out;
  for (auto it = vars.begin(); it != vars.end(); ++it)
    if (reads.count(it.key()) == 0)
      out.push_back("the chat template never reads '" + it.key() + "' (" + t.origin + ")");
  return out;
}

}  // namespace

std::string render_chat(const ChatTemplate& t, const ChatRequest& r,
                        std::vector<std::string>* warnings) {
  const jinja::Template tmpl = parse_chat_template(t);
  if (warnings != nullptr) *warnings = unread_vars(tmpl, t, r.vars);
  try {
    return tmpl.render(template_globals(r));
  } catch (const jinja::TemplateLimitError& e) {
    throw InputError(t.origin, "chat_template",
                     std::string("the render passed a limit: ") + e.what());
  } catch (const jinja::TemplateError& e) {
    throw InputError(t.origin, "chat_template",
                     "the template raised " + e.kind() + ": " + e.what());
  }
}

std::vector<std::string> unread_chat_vars(const ChatTemplate& t, const ordered_json& vars) {
  return unread_vars(parse_chat_template(t), t, vars);
}

ChatTemplate read_chat_template_file(const std::string& path) {
  return {read_text(path, "chat template"), path};
}

ChatRequest read_chat_messages(const std::string& path) {
  ordered_json doc;
  try {
    doc = ordered_json::parse(read_text(path, "--messages"));
  } catch (const ordered_json::parse_error& e) {
    throw InputError(path, "", std::string("not JSON: ") + e.what());
  }
  ChatRequest r;
  if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it)
      if (it.key() != "messages" && it.key() != "tools")
        throw InputError(path, it.key(), "unknown key (expected messages, tools)");
    if (!doc.contains("messages")) throw InputError(path, "messages", "missing");
    r.tools = doc.value("tools", ordered_json());
    doc = doc["messages"];
  }
  if (!doc.is_array())
    throw InputError(path, "messages", "a list of messages expected, got " + doc.dump());
  for (size_t i = 0; i < doc.size(); ++i)
    if (!doc[i].is_object() || !doc[i].contains("role"))
      throw InputError(path, "messages[" + std::to_string(i) + "]",
                       "an object with a \"role\" expected, got " + doc[i].dump());
  if (!r.tools.is_null() && !r.tools.is_array())
    throw InputError(path, "tools", "a list of tool schemas expected, got " + r.tools.dump());
  r.messages = std::move(doc);
  return r;
}

void add_chat_var(const std::string& spec, const std::string& flag, ordered_json* vars) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InputError("", flag, "'" + spec + "': NAME=VALUE expected (e.g. enable_thinking=false)");
  const std::string name = spec.substr(0, eq), value = spec.substr(eq + 1);
  try {
    (*vars)[name] = ordered_json::parse(value);
  } catch (const ordered_json::parse_error&) {
    (*vars)[name] = value;  // a bare word: the string itself
  }
}

}  // namespace kvscope::tokenizer
