#include "capture/tokenizer/post_processor.h"

namespace kvscope::tokenizer {

namespace {

void add_template(const JsonAt& j, PostProcessor* out) {
  JsonAt single = j.child("single");
  JsonAt specials = j.child("special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.array().size(); ++i) {
    JsonAt item = single.at(i);
    if (item.has("Sequence")) {
      if (seen_sequence) item.fail_value("a single-sequence template with two sequences");
      seen_sequence = true;
      continue;
    }
    if (!item.has("SpecialToken")) item.fail("{\"Sequence\": ...} or {\"SpecialToken\": ...}");
    std::string name = item.child("SpecialToken").child("id").str();
    if (!specials.has(name))
      item.child("SpecialToken")
          .child("id")
          .fail_value("\"" + name + "\" is not listed in special_tokens");
    JsonAt ids = specials.child(name).child("ids");
    for (size_t k = 0; k < ids.array().size(); ++k)
      (seen_sequence ? out->suffix : out->prefix).push_back(ids.at(k).token_id());
  }
}

void add_cls_sep(const JsonAt& j, PostProcessor* out) {
  // "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]
  out->prefix.push_back(j.child("cls").at(1).token_id());
  out->suffix.push_back(j.child("sep").at(1).token_id());
}

void add_post_processor(const JsonAt& j, PostProcessor* out) {
  const std::string type = j.type();
  if (type == "TemplateProcessing") return add_template(j, out);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "BertProcessing" || type == "RobertaProcessing") return add_cls_sep(j, out);
  if (type == "Sequence") {
    JsonAt list = j.child("processors");
    for (size_t i = 0; i < list.array().size(); ++i) add_post_processor(list.at(i), out);
    return;
  }
  j.child("type").fail_value("unsupported post-processor \"" + type +
                             "\" (supported: TemplateProcessing, ByteLevel, BertProcessing, "
                             "RobertaProcessing, Sequence)");
}

}  // namespace

std::unique_ptr<PostProcessor> post_processor_from_json(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  auto out = std::make_unique<PostProcessor>();
  add_post_processor(j, out.get());
  return out;
}

}  // namespace kvscope::tokenizer
