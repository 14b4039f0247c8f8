// Dev driver for the Python comparison: renders a template file with the
// variables of a JSON file and prints the result with no newline added.
//   jinja_render TEMPLATE CONTEXT.json
// The context may hold "strftime_now": a fixed string strftime_now(fmt) returns.
// On a render error prints "ERROR <kind>: <message>" and exits 2.
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/jinja/template.h"

using namespace kvscope::jinja;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: jinja_render TEMPLATE CONTEXT.json\n";
    return 1;
  }
  std::ifstream tf(argv[1], std::ios::binary), cf(argv[2], std::ios::binary);
  if (!tf || !cf) {
    std::cerr << "cannot open input\n";
    return 1;
  }
  std::stringstream source, context;
  source << tf.rdbuf();
  context << cf.rdbuf();
  try {
    Template t = Template::parse(source.str(), "chat template");
    Value vars = from_json(nlohmann::ordered_json::parse(context.str()));
    vars.dict_mut().set(Value("raise_exception"), raise_exception_function());
    if (const Value* fixed = vars.dict_ref().find("strftime_now")) {
      Value text = *fixed;
      vars.dict_mut().set(Value("strftime_now"),
                          Value::function("strftime_now", [text](Args&) { return text; }));
    }
    std::cout << t.render(vars);
  } catch (const TemplateError& e) {
    std::cout << "ERROR " << e.kind() << ": " << e.what();
    return 2;
  }
  return 0;
}
