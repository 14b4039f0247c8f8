// Bring your own scorer: scorers written in Python and saved as TorchScript
// by the pinned PyPI torch (the one KVScope links) run under `scripted:` with
// no rebuild. A scorer equal to knorm keeps exactly knorm's sets; a file that
// is not TorchScript, or a scorer returning the wrong shape, is refused naming
// the file. docs/policies/scripted.md
#include <fstream>

#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

// Writes the scorers with the torch Python beside the LibTorch we link.
std::string write_scorers() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = temp_dir();
  std::ofstream py(dir + "/make_scorers.py");
  py << R"(import sys, torch
from torch import Tensor

class KeyNorm(torch.nn.Module):
    # knorm: -||k||_2 (higher = kept), the norm in double as KVScope's knorm.
    def forward(self, keys: Tensor, values: Tensor, queries: Tensor, positions: Tensor,
                received: Tensor, layer: int, step: int) -> Tensor:
        return -(keys.double() * keys.double()).sum(-1).sqrt().float()

class WrongShape(torch.nn.Module):
    def forward(self, keys: Tensor, values: Tensor, queries: Tensor, positions: Tensor,
                received: Tensor, layer: int, step: int) -> Tensor:
        return keys.sum(-1)[:-1]

torch.jit.script(KeyNorm()).save(sys.argv[1] + "/knorm.pt")
torch.jit.script(WrongShape()).save(sys.argv[1] + "/wrong_shape.pt")
)";
  py.close();
  std::string out;
  const int rc =
      run_command(std::string(KVSCOPE_TORCH_PYTHON) + " " + dir + "/make_scorers.py " + dir, &out);
  INFO(out);
  REQUIRE(rc == 0);
  return dir;
}

}  // namespace

TEST_CASE("a Python scorer equal to knorm keeps exactly knorm's sets", "[scripted]") {
  const std::string dir = write_scorers();
  std::vector<trace::Event> mine;
  const std::vector<EventKey> want = events_of_story_run("knorm:budget=12", 12);
  const std::vector<EventKey> got =
      events_of_story_run("scripted:file=" + dir + "/knorm.pt,budget=12", 12, &mine);
  int64_t evictions = 0;
  for (const trace::Event& e : mine) evictions += e.kind == trace::EventKind::Evict;
  CHECK(evictions > 0);
  CHECK((got == want));
  // And through a wrapper, as any built-in scorer.
  CHECK((events_of_story_run("scripted:file=" + dir + "/knorm.pt,budget=12+adakv:alpha=0.5", 6) ==
         events_of_story_run("adakv:scorer=knorm,budget=12,alpha=0.5", 6)));
}

TEST_CASE("scripted scorers that do not load or return the wrong shape name the file",
          "[scripted]") {
  const std::string dir = write_scorers();
  std::ofstream(dir + "/not_a_module.pt") << "hello";
  try {
    policy::make_policy("scripted:file=" + dir + "/not_a_module.pt");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()),
               Catch::Contains("not_a_module.pt") && Catch::Contains("not a TorchScript module"));
  }
  try {
    events_of_story_run("scripted:file=" + dir + "/wrong_shape.pt,budget=12", 1);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("wrong_shape.pt: forward") &&
                                          Catch::Contains("one float score per held entry"));
  }
  CHECK_THROWS_AS(policy::make_policy("scripted:budget=12"), InputError);
}

TEST_CASE("a scorer failing mid-capture stops it with exit 2 and leaves the trace so far readable",
          "[scripted][cli]") {
  const std::string dir = write_scorers();
  const std::string stories = shared_dir() + "/models/stories260K/";
  const std::string trace = dir + "/stopped.kvtrace.h5";
  std::string out;
  const int rc = run_command(
      kvscope_exe() + " capture --model " + stories + "stories260K.bin" + " --tokenizer " +
          stories + "tok512.bin --prompt 'Tom had a big dog'" +
          " --max-new 8 --policy scripted:file=" + dir + "/wrong_shape.pt,budget=2 -q -o " + trace,
      &out);
  CHECK(rc == 2);
  CHECK_THAT(out, Catch::Contains("wrong_shape.pt: forward") && Catch::Contains("kv head"));
  REQUIRE(run_command(kvscope_exe() + " info " + trace, &out) == 0);
  CHECK_THAT(out, Catch::Contains("complete  no"));
}

}  // namespace kvscope::test
