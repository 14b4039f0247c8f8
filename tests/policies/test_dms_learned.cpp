// dms_learned on stories260K: the ragged cache under the DMS decisions reads
// exactly what the training-time hard mask lets through (the same logits as
// the dense forward the trainer evaluates), in one prefill, in chunks and
// token by token; what it evicts is what the decisions closed; bad files.
#include "capture/gates/gate_nets.h"
#include "capture/gates/gate_set.h"
#include "capture/train/gated_attention.h"
#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

constexpr int64_t kWindow = 4;

// Random decision weights (seeded) that close about half of the tokens.
std::string random_dms_gates(const model::ModelConfig& c, const std::string& name) {
  const gates::GateShape shape = gates::GateShape::of(c);
  gates::GateSet g = gates::init_gates(
      gates::GateKind::Dms,
      gates::resolve_hyperparameters(gates::GateKind::Dms, shape, {{"window", kWindow}}, "test"),
      shape, 0);
  torch::manual_seed(11);
  for (auto& [key, t] : g.params) t = torch::randn(t.sizes()) * 0.05;
  const std::string path = temp_dir() + "/" + name + ".safetensors";
  gates::save_gates(g, path);
  return path;
}

struct Dense {
  torch::Tensor logits;                // [N, V]
  std::vector<torch::Tensor> decided;  // per layer [K, N]: z > 0, unshifted
};

Dense dense_hard(model::Transformer& m, const std::string& path, const std::vector<int64_t>& ids) {
  const gates::GateSet g = gates::load_gates(path, m.config());
  gates::GatedDenseBackend hard(&g, gates::GatedDenseBackend::Mode::Hard);
  torch::NoGradGuard no_grad;
  Dense d;
  d.logits = m.logits(m.forward_hidden(torch::tensor(ids, torch::kInt64), 0, hard));
  d.decided = hard.flags;
  return d;
}

}  // namespace

TEST_CASE(
    "dms_learned: the ragged cache reads what the training mask lets through, prefilled at once, "
    "in chunks or token by token",
    "[policy][dms_learned]") {
  std::unique_ptr<model::Transformer> m = load_stories();
  const std::vector<int64_t> ids = story_prompt_ids();
  const int64_t N = int64_t(ids.size());
  REQUIRE(N > 40);
  const std::string path = random_dms_gates(m->config(), "dms-random");
  const Dense dense = dense_hard(*m, path, ids);
  const std::string spec = "dms_learned:gates=" + path;

  // Some decisions close, some keep: the masks matter.
  const double closed = torch::stack(dense.decided).mean().item<double>();
  CHECK(closed > 0.2);
  CHECK(closed < 0.8);

  // The chunks a run feeds: {pos0, n}.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> schedules = {
      {{0, 30}},                   // one prefill, then token by token
      {{0, 9}, {9, 13}, {22, 8}},  // a chunked prefill
      {{0, 1}, {1, 1}, {2, 1}}};   // token by token from the first
  for (size_t s = 0; s < schedules.size(); ++s) {
    INFO("schedule " << s);
    std::vector<std::pair<int64_t, int64_t>> steps = schedules[s];
    int64_t fed = steps.back().first + steps.back().second;
    while (fed < N) steps.push_back({fed++, 1});
    PolicyRun run(*m, spec, N, steps[0].second);
    for (auto [pos0, n] : steps) {
      std::vector<int64_t> chunk(ids.begin() + pos0, ids.begin() + pos0 + n);
      torch::Tensor got = run.feed(*m, chunk, pos0).reshape({-1});
      INFO("step at " << pos0 << " +" << n);
      CHECK(torch::allclose(got, dense.logits[pos0 + n - 1], 1e-4, 1e-4));
    }
    // Held at the end: everything but the closed tokens the window moved
    // past (key j's decision is the logit of token j + 1).
    for (int64_t l = 0; l < m->config().n_layers; ++l)
      for (int64_t h = 0; h < m->config().n_kv_heads; ++h) {
        std::set<int64_t> expect;
        for (int64_t j = 0; j < N; ++j) {
          const bool gone = j + 1 < N && N - 1 - j >= kWindow &&
                            dense.decided[size_t(l)][h][j + 1].item<float>() > 0.5f;
          if (!gone) expect.insert(j);
        }
        CHECK(run.held(l, h) == expect);
      }
  }
}

TEST_CASE("dms_learned: window= overrides the trained window, bad gate files are refused by name",
          "[policy][dms_learned]") {
  std::unique_ptr<model::Transformer> m = load_stories();
  const std::vector<int64_t> ids = story_prompt_ids();
  const int64_t N = int64_t(ids.size());
  const std::string path = random_dms_gates(m->config(), "dms-random-2");
  PolicyRun wide(*m, "dms_learned:window=" + std::to_string(N) + ",gates=" + path, N, N);
  wide.feed(*m, ids, 0);
  for (int64_t h = 0; h < m->config().n_kv_heads; ++h) CHECK(wide.held(2, h).size() == size_t(N));

  CHECK(policy_error("dms_learned").find("dms_learned:gates") != std::string::npos);
  CHECK(policy_error("dms_learned:window=-1,gates=x").find("dms_learned:window") !=
        std::string::npos);
  // A gate file of another kind names the file and its kind.
  const gates::GateShape shape = gates::GateShape::of(m->config());
  gates::GateSet other = gates::init_gates(
      gates::GateKind::Kvzap,
      gates::resolve_hyperparameters(gates::GateKind::Kvzap, shape, {}, "t"), shape, 0);
  const std::string wrong = temp_dir() + "/kvzap-as-dms.safetensors";
  gates::save_gates(other, wrong);
  try {
    PolicyRun bad(*m, "dms_learned:gates=" + wrong, N, N);
    FAIL("a kvzap file was accepted as DMS decisions");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find(wrong) != std::string::npos);
    CHECK(std::string(e.what()).find("kvzap") != std::string::npos);
  }
}

}  // namespace kvscope::test
