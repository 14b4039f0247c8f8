// A self-contained Jinja2 engine for HuggingFace chat templates: renders as
// transformers' apply_chat_template(..., tokenize=False) does (jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks,
// loopcontrols and {% generation %}; tojson as json.dumps).
//
//   Template t = Template::parse(source, "chat template");
//   Value vars = Value::dict();
//   vars.dict_mut().set(Value("messages"), from_json(messages_json));
//   vars.dict_mut().set(Value("raise_exception"), raise_exception_function());
//   std::string text = t.render(vars, Limits{});
//
// Errors: TemplateSyntaxError (parse: "<name>: line L, column C: ..."),
// TemplateError (render; what() is jinja2's message, kind() its exception
// type), TemplateLimitError (a Limits bound was hit).
#pragma once

#include <memory>
#include <set>
#include <string>

#include "core/jinja/json.h"
#include "core/jinja/render.h"
#include "core/jinja/value.h"

namespace kvscope::jinja {

class Template {
 public:
  static Template parse(const std::string& source, const std::string& name,
                        const Limits& limits = {});
  // `globals` is a dict of the variables the template sees.
  std::string render(const Value& globals, const Limits& limits = {}) const;
  // Variables the template reads but never assigns (its inputs).
  std::set<std::string> free_variables() const;
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const Body> body_;
  std::string name_;
};

// transformers' raise_exception(message): throws TemplateError(message).
Value raise_exception_function();

}  // namespace kvscope::jinja
