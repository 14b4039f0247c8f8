// Tokenizer::from_tokenizer_json: tokenizer.json (formats.md 4.1-4.7) plus,
// when they sit beside it, tokenizer_config.json (bos/eos token names, chat
// template) and chat_template.jinja.
#include <fstream>
#include <sstream>

#include "capture/tokenizer/hf_tokenizer.h"
#include "capture/tokenizer/json_fields.h"
#include "core/common/input_error.h"

namespace kvscope::tokenizer {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parse_json(const std::string& path) {
  std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e400
    throw InputError(path, "", std::string("malformed JSON: ") + e.what());
  }
}

std::string directory_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

std::vector<std::pair<std::string, std::string>> read_merges(const JsonAt& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  if (merges.is_null()) return out;
  out.reserve(merges.array().size());
  for (size_t i = 0; i < merges.value.size(); ++i) {
    JsonAt m = merges.at(i);
    if (m.value.is_string()) {
      // Legacy "left right": exactly two parts; "#version" lines are comments.
      const std::string& s = m.value.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        m.fail_value("expected \"left right\" (two tokens separated by one space), got \"" + s +
                     "\"");
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.value.is_array() && m.value.size() == 2 && m.value[0].is_string() &&
               m.value[1].is_string()) {
      out.emplace_back(m.value[0].get<std::string>(), m.value[1].get<std::string>());
    } else {
      m.fail("\"left right\" or [\"left\", \"right\"]");
    }
  }
  return out;
}

std::unique_ptr<BpeModel> read_model(const JsonAt& model) {
  if (model.is_null()) model.fail("the model object");
  // A file without "type" is read as BPE when it has merges (older files).
  std::string type =
      model.has("type") ? model.child("type").str() : (model.has("merges") ? "BPE" : "");
  if (type != "BPE")
    model.child("type").fail_value(
        "unsupported model type \"" + type +
        "\" (supported: BPE; WordPiece, WordLevel and Unigram are not implemented)");
  if (model.has("dropout")) {
    double p =
        model.child("dropout").value.is_number() ? model.child("dropout").value.get<double>() : -1;
    if (p < 0 || p > 1) model.child("dropout").fail("null or a number in [0, 1]");
    if (p > 0)
      model.child("dropout").fail_value(
          "BPE dropout is random at encode time; KVScope needs null or 0");
  }
  JsonAt vocab = model.child("vocab");
  if (!vocab.value.is_object()) vocab.fail("an object {token: id}");
  std::unordered_map<std::string, int32_t> tokens;
  tokens.reserve(vocab.value.size());
  for (auto it = vocab.value.begin(); it != vocab.value.end(); ++it) {
    JsonAt id{it.value(), model.file, vocab.field + "[\"" + it.key() + "\"]"};
    tokens.emplace(it.key(), id.token_id());
  }
  BpeOptions opt;
  opt.unk_token = model.str_or("unk_token", "");
  opt.continuing_subword_prefix = model.str_or("continuing_subword_prefix", "");
  opt.end_of_word_suffix = model.str_or("end_of_word_suffix", "");
  opt.fuse_unk = model.bool_or("fuse_unk", false);
  opt.byte_fallback = model.bool_or("byte_fallback", false);
  opt.ignore_merges = model.bool_or("ignore_merges", false);
  auto merges = read_merges(model.child("merges"));
  return std::make_unique<BpeModel>(std::move(tokens), merges, opt, model.file,
                                    model.field + ".merges");
}

std::vector<AddedToken> read_added_tokens(const JsonAt& list) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  for (size_t i = 0; i < list.array().size(); ++i) {
    JsonAt t = list.at(i);
    AddedToken a;
    a.id = t.child("id").token_id();
    a.content = t.child("content").str();
    a.special = t.bool_or("special", false);
    a.single_word = t.bool_or("single_word", false);
    a.lstrip = t.bool_or("lstrip", false);
    a.rstrip = t.bool_or("rstrip", false);
    a.normalized = t.bool_or("normalized", !a.special);
    out.push_back(std::move(a));
  }
  return out;
}

// "bos_token": "<s>" or {"content": "<s>", ...}
std::string token_name(const JsonAt& config, const std::string& key) {
  if (!config.has(key)) return {};
  JsonAt v = config.child(key);
  if (v.value.is_string()) return v.str();
  if (v.value.is_object() && v.has("content")) return v.child("content").str();
  return {};
}

// Reads tokenizer_config.json / chat_template.jinja beside the tokenizer.
void read_config(const std::string& dir, HfTokenizer* tok) {
  std::string config_path = dir + "/tokenizer_config.json";
  std::string bos, eos;
  if (file_exists(config_path)) {
    nlohmann::json config = parse_json(config_path);
    JsonAt c{config, config_path, ""};
    bos = token_name(c, "bos_token");
    eos = token_name(c, "eos_token");
    if (c.has("chat_template")) {
      JsonAt t = c.child("chat_template");
      if (t.value.is_string()) {
        tok->set_chat_template(t.str(), config_path + ": chat_template");
      } else if (t.value.is_array()) {
        for (size_t i = 0; i < t.value.size(); ++i)
          if (t.at(i).str_or("name", "") == "default")
            tok->set_chat_template(t.at(i).child("template").str(),
                                   config_path + ": chat_template[" + std::to_string(i) + "]");
      }
    }
  }
  std::string jinja = dir + "/chat_template.jinja";
  if (tok->chat_template().empty() && file_exists(jinja))
    tok->set_chat_template(read_file(jinja), jinja);

  if (!bos.empty() && tok->token_to_id(bos) >= 0) tok->set_bos(tok->token_to_id(bos));
  std::vector<int32_t> eos_ids;
  if (!eos.empty() && tok->token_to_id(eos) >= 0) {
    eos_ids.push_back(tok->token_to_id(eos));
  } else {
    // No config: the end-of-sequence names of the common families.
    for (const char* name :
         {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<eos>"}) {
      int32_t id = tok->token_to_id(name);
      if (id >= 0 && tok->is_special(id)) eos_ids.push_back(id);
    }
  }
  tok->set_eos(eos_ids);
}

std::string describe(const HfComponents& parts, const nlohmann::json& root) {
  std::string kind = "BPE";
  if (parts.model->options().byte_fallback) kind = "SentencePiece-style BPE (byte fallback)";
  const auto& dec = root.value("decoder", nlohmann::json());
  std::string dump = dec.is_null() ? "" : dec.dump();
  if (dump.find("\"ByteLevel\"") != std::string::npos) kind = "byte-level BPE";
  return kind + " (tokenizer.json)";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_tokenizer_json(const std::string& path) {
  nlohmann::json root = parse_json(path);
  JsonAt j{root, path, ""};
  if (!root.is_object()) j.fail("a JSON object at the top level");
  // "truncation" and "padding" are ignored: KVScope encodes one sequence at
  // a time and never truncates or pads it.
  HfComponents parts;
  parts.model = read_model(j.child("model"));
  parts.normalizer = normalizer_from_json(j.child("normalizer"));
  parts.pre_tokenizer = pre_tokenizer_from_json(j.child("pre_tokenizer"));
  parts.post_processor = post_processor_from_json(j.child("post_processor"));
  parts.decoder = decoder_from_json(j.child("decoder"));
  parts.added = read_added_tokens(j.child("added_tokens"));
  std::string kind = describe(parts, root);
  auto tok = std::make_unique<HfTokenizer>(std::move(parts), kind);
  read_config(directory_of(path), tok.get());
  return tok;
}

}  // namespace kvscope::tokenizer
