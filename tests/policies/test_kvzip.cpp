// KVzip (`kvzip`, kvpress KVzipPress): the selection on hand-made scores (one
// ranking over all heads, layerwise, ties), and on stories260K the whole
// policy against a reference recomputed here in double from the real
// reconstruction pass's queries and keys: every score (the max over the
// repeat queries and the group's heads of a softmax over sinks + chunk +
// repeat), the kept sets, and that the pass leaves no entry of its own.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "capture/policy/policies/descriptors.h"
#include "capture/tokenizer/tokenizer.h"
#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

// (layer, head, position) triples flattened, for Catch's messages.
std::vector<int32_t> flat(const std::vector<std::array<int32_t, 3>>& v) {
  std::vector<int32_t> out;
  for (const auto& e : v) out.insert(out.end(), e.begin(), e.end());
  return out;
}

}  // namespace

TEST_CASE("kvzip: the lowest scores of all heads leave, ties the older first",
          "[policies][kvzip]") {
  // L = 2, K = 2, T = 4: scores per (layer, head).
  const std::vector<float> scores = {
      0.9f, 0.1f,  0.2f,  0.8f,   // l0 h0
      0.9f, 0.7f,  0.6f,  0.5f,   // l0 h1
      0.9f, 0.3f,  0.3f,  0.4f,   // l1 h0: a tie at 0.3
      0.9f, 0.95f, 0.85f, 0.05f,  // l1 h1
  };
  // budget 3 of 4: 4 of 16 leave, wherever they are.
  auto out = policy::kvzip_evictions(scores, 2, 2, 4, 3, false);
  const std::vector<std::array<int32_t, 3>> want = {
      {1, 1, 3},
      {0, 0, 1},
      {0, 0, 2},
      {1, 0, 1}};  // 0.05, 0.1, 0.2, then 0.3 at the older position
  CHECK(flat(out) == flat(want));
  // layerwise: each layer loses K * (T - budget) = 2.
  out = policy::kvzip_evictions(scores, 2, 2, 4, 3, true);
  const std::vector<std::array<int32_t, 3>> want_layerwise = {
      {0, 0, 1}, {0, 0, 2}, {1, 1, 3}, {1, 0, 1}};
  CHECK(flat(out) == flat(want_layerwise));
  CHECK(policy::kvzip_evictions(scores, 2, 2, 4, 4, false).empty());
}

TEST_CASE("kvzip: scores from the real reconstruction pass, kept sets and freed entries",
          "[policies][kvzip]") {
  // plus: KVzip+, each weight over ||h_i|| of its query and times ||v_j W_O^g||.
  const bool plus = GENERATE(false, true);
  INFO("plus " << plus);
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  auto tok = tokenizer::Tokenizer::load(shared_dir() + "/models/stories260K/tok512.bin", 512);
  const std::vector<int64_t> prompt = story_prompt_ids();
  const std::vector<int32_t> prompt32(prompt.begin(), prompt.end());
  const int64_t T = int64_t(prompt.size()), R = c.n_heads / c.n_kv_heads, L = c.n_layers,
                K = c.n_kv_heads, sinks = 4, budget = T / 3;
  for (int64_t chunk : {int64_t(4096), T / 2 + 1}) {
    INFO("chunk " << chunk);
    const std::string spec = "kvzip:budget=" + std::to_string(budget) +
                             ",sinks=" + std::to_string(sinks) + ",chunk=" + std::to_string(chunk) +
                             (plus ? ",plus=true" : "");
    std::vector<policy::ReconstructionChunk> plan;
    {
      policy::PolicyInstance probe = policy::make_policy(spec);
      plan = probe.policy->plan({prompt32, tok.get(), c}).reconstruction;
    }
    REQUIRE(plan.size() == (chunk >= T ? 1u : 2u));
    int64_t longest = 0;
    for (const auto& p : plan) longest = std::max(longest, int64_t(p.ids.size()));
    PolicyRun run(*model, spec, T + longest, T);
    REQUIRE(run.policy().plan({prompt32, tok.get(), c}).reconstruction.size() == plan.size());
    run.driver().set_reconstruction(plan);
    run.feed(*model, prompt, 0);
    const int64_t prefill_steps = int64_t(run.steps().size());
    std::vector<std::vector<float>> gates;  // the last step's scores
    for (const auto& p : plan) {
      run.driver().set_side_pass(true);
      run.feed(*model, std::vector<int64_t>(p.ids.begin(), p.ids.end()), T);
      run.driver().set_side_pass(false);
      // The pass's own entries are gone after each step.
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < K; ++h) CHECK(*run.held(l, h).rbegin() < T);
    }
    // Reference scores in double: per chunk, the repeat queries over
    // [sinks of the chunk, the chunk's context, the repeat tokens].
    std::vector<double> ref(size_t(L * K * T), 0.0);
    for (size_t ci = 0; ci < plan.size(); ++ci) {
      const int64_t start = int64_t(ci) * chunk, end = std::min(T, start + chunk);
      const int64_t sink = std::min(sinks, start);
      for (int64_t l = 0; l < L; ++l) {
        const LayerInputs& pre = run.steps()[0][size_t(l)];
        const LayerInputs& side = run.steps()[size_t(prefill_steps) + ci][size_t(l)];
        const int64_t n = side.q.size(0);
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < sink; ++j) keys.push_back(j);
        for (int64_t j = start; j < end; ++j) keys.push_back(j);
        const torch::Tensor ctx =
            pre.k.to(torch::kFloat64).index_select(0, torch::tensor(keys, torch::kInt64));
        const torch::Tensor own = side.k.to(torch::kFloat64);
        const torch::Tensor q = side.q.to(torch::kFloat64);
        const torch::Tensor h_norm = side.hidden.to(torch::kFloat64).norm(2, -1);  // [n]
        // ||v_j W_O^g|| for the prompt's values: [H, T].
        const torch::Tensor wo = model->weights()
                                     .layers[size_t(l)]
                                     .wo.to(torch::kFloat64)
                                     .t()
                                     .reshape({c.n_heads, c.head_dim, -1});
        const torch::Tensor vo = pre.v.to(torch::kFloat64)
                                     .repeat_interleave(R, 1)
                                     .permute({1, 0, 2})
                                     .matmul(wo)
                                     .norm(2, -1);
        for (int64_t h = 0; h < K; ++h)
          for (int64_t g = h * R; g < (h + 1) * R; ++g)
            for (int64_t i = 0; i < n; ++i) {
              const torch::Tensor k =
                  torch::cat({ctx.select(1, h), own.select(1, h).narrow(0, 0, i + 1)});
              const torch::Tensor p = torch::softmax(k.matmul(q[i][g]) * side.scale, 0);
              for (int64_t j = sink; j < sink + (end - start); ++j) {
                double& r = ref[size_t((l * K + h) * T + keys[size_t(j)])];
                const double w = plus ? p[j].item<double>() / h_norm[i].item<double>() *
                                            vo[g][keys[size_t(j)]].item<double>()
                                      : p[j].item<double>();
                r = std::max(r, w);
              }
            }
      }
    }
    double top = 0;
    for (double s : ref) top = std::max(top, s);
    for (int64_t i = 0; i < L * K; ++i)
      for (int64_t p = 0; p < sinks; ++p) ref[size_t(i * T + p)] = top + 1.0;
    // The policy's scores (its gate) equal the reference.
    double worst = 0;
    int64_t n_gates = 0;
    for (const trace::GateValue& gv : run.last_gates()) {
      worst = std::max(worst, std::abs(double(gv.value) -
                                       ref[size_t((gv.layer * K + gv.kv_head) * T + gv.token)]));
      ++n_gates;
    }
    CHECK(n_gates == L * K * T);
    CHECK(worst < 1e-5 * std::max(1.0, top));
    // Kept sets: the reference's L*K*budget best (near ties excepted).
    std::vector<std::tuple<double, int64_t, int64_t, int64_t>> order;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h)
        for (int64_t p = 0; p < T; ++p)
          order.emplace_back(ref[size_t((l * K + h) * T + p)], p, l, h);
    std::sort(order.begin(), order.end());
    const size_t n_evict = size_t(L * K * (T - budget));
    const double cut = std::get<0>(order[n_evict]);
    int64_t total = 0, differ = 0;
    std::set<int64_t> per_head;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h) {
        const std::set<int64_t> held = run.held(l, h);
        total += int64_t(held.size());
        per_head.insert(int64_t(held.size()));
        for (int64_t p = 0; p < sinks; ++p) CHECK(held.count(p) == 1);
        for (int64_t p = 0; p < T; ++p) {
          const double s = ref[size_t((l * K + h) * T + p)];
          const bool kept_ref = s > cut;
          if (std::abs(s - cut) < 1e-6 * std::max(1.0, top)) continue;  // a near tie with the cut
          if (kept_ref != (held.count(p) == 1)) ++differ;
        }
      }
    CHECK(total == L * K * budget);
    CHECK(differ == 0);
    CHECK(per_head.size() > 1);  // non-uniform head budgets
    // The memory of the evicted entries is really freed: pages per head.
    CHECK(run.cache().entries() == L * K * budget);
  }
}

TEST_CASE("kvzip: bad parameters and prompts are refused with their range", "[policies][kvzip]") {
  CHECK_THAT(policy_error("kvzip:chunk=0"),
             Catch::Contains("kvzip:chunk") && Catch::Contains("[1, "));
  CHECK_THAT(policy_error("kvzip:budget=0"),
             Catch::Contains("kvzip:budget") && Catch::Contains("[1, "));
  CHECK_THAT(policy_error("kvzip:sinks=-1"),
             Catch::Contains("kvzip:sinks") && Catch::Contains("[0, "));
  CHECK_THAT(policy_error("kvzip:prefix=-2"), Catch::Contains("kvzip:prefix"));
  CHECK_THAT(policy_error("kvzip+keydiff"), Catch::Contains("context-reconstruction"));
  policy::PolicyInstance pi = policy::make_policy("kvzip:prefix=10");
  const std::vector<int32_t> short_prompt{1, 2, 3};
  CHECK_THROWS_AS(pi.policy->plan({short_prompt, nullptr, model::ModelConfig{}}), InputError);
}

TEST_CASE("kvzip: a chat prompt's template prefix is no context and its generation prompt waits",
          "[policies][kvzip]") {
  const char* env = std::getenv("KVSCOPE_MODELS_DIR");
  const std::string gguf = std::string(env && *env ? env : source_dir() + "/models") +
                           "/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto tok = tokenizer::Tokenizer::load(gguf);
  const std::string text =
      tok->apply_chat_template({{"user", "Lily had a red ball. She kicked it."}});
  const std::vector<int32_t> prompt = tok->encode(text, false);
  const int64_t T = int64_t(prompt.size());
  // kvpress's split: the template before the content, and after it.
  const std::vector<int32_t> prefix = tok->encode(text.substr(0, text.find("Lily")), false);
  const std::vector<int32_t> suffix = tok->encode("<|im_end|>\n<|im_start|>assistant\n", false);
  REQUIRE(suffix.size() == 6u);
  policy::PolicyInstance chat = policy::make_policy("kvzip:budget=4,chunk=4");
  const model::ModelConfig none;  // KVzip's plan reads no model shape
  const policy::CapturePlan chat_plan = chat.policy->plan({prompt, tok.get(), none});
  const std::vector<policy::ReconstructionChunk>& plan = chat_plan.reconstruction;
  const int64_t n = T - int64_t(suffix.size());
  CHECK(chat_plan.at == n);
  REQUIRE(plan.size() == size_t((n - int64_t(prefix.size()) + 3) / 4));
  // Each chunk: repeat prompt, the template's suffix, then its context from the prefix on.
  const std::vector<int32_t>& first = plan[0].ids;
  CHECK(std::equal(prompt.begin() + long(prefix.size()), prompt.begin() + long(prefix.size()) + 4,
                   first.end() - 4));
  CHECK(std::equal(suffix.begin(), suffix.end(), first.end() - 4 - long(suffix.size())));
  CHECK(plan.back().softmax_keys.back().second == n);
  const auto resolved = chat.policy->resolved_params();
  CHECK(std::find(resolved.begin(), resolved.end(),
                  std::pair<std::string, double>{"prefix", double(prefix.size())}) !=
        resolved.end());
  CHECK(std::find(resolved.begin(), resolved.end(),
                  std::pair<std::string, double>{"question", 6.0}) != resolved.end());
  // chat=false, or a prompt without the template: the plain prompts after the whole prompt.
  policy::PolicyInstance plain = policy::make_policy("kvzip:budget=4,chunk=4,chat=false");
  const policy::CapturePlan plain_plan = plain.policy->plan({prompt, tok.get(), none});
  const std::vector<policy::ReconstructionChunk>& p2 = plain_plan.reconstruction;
  CHECK(plain_plan.at == -1);
  CHECK(p2.back().softmax_keys.back().second == T);
  const std::vector<int32_t> bare = tok->encode("Lily had a red ball. She kicked it.", false);
  policy::PolicyInstance unwrapped = policy::make_policy("kvzip:budget=4,chunk=4");
  CHECK(unwrapped.policy->plan({bare, tok.get(), none}).at == -1);
}

}  // namespace kvscope::test
