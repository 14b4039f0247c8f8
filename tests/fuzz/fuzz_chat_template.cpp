// libFuzzer target: chat templates (core/jinja through
// capture/tokenizer/chat_template.h), untrusted input a model file carries.
// A template must parse and render or be refused with an InputError: no
// crash, no hang (the render's limits), no unbounded output.
#include <cstddef>
#include <cstdint>
#include <string>

#include "capture/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::ordered_json;
  static const kvscope::tokenizer::ChatRequest request = [] {
    kvscope::tokenizer::ChatRequest r;
    r.messages = ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in {{ Paris }}?"},
      {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "call12345", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "{\"t\": 21}"},
      {"role": "user", "content": "Ünïcødé 🍂"}])");
    r.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
    r.vars = {{"enable_thinking", false}};
    r.bos_token = "<s>";
    r.eos_token = "</s>";
    return r;
  }();
  const kvscope::tokenizer::ChatTemplate t{
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.jinja"};
  kvscope::fuzz::accepts([&] { kvscope::tokenizer::render_chat(t, request); });
  return 0;
}
