// FINCH (`finch`, kvpress FinchPress): the question's votes recomputed here
// in double from the prompt's queries and keys, the kept sets against them,
// and the refusals of a window the prompt cannot hold.
#include <cmath>

#include "core/common/input_error.h"
#include "tests/policies/policy_test_util.h"

namespace kvscope::test {

TEST_CASE("finch: each head keeps the question and the context keys it votes for most",
          "[policies][finch]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  const std::vector<int64_t> prompt = story_prompt_ids();
  const int64_t T = int64_t(prompt.size()), W = 16, budget = 30, R = c.n_heads / c.n_kv_heads;
  for (bool normalize : {true, false}) {
    INFO("normalize " << normalize);
    PolicyRun run(*model,
                  "finch:budget=" + std::to_string(budget) + ",window=" + std::to_string(W) +
                      ",rerotate=false,normalize=" + (normalize ? "true" : "false"),
                  T + 1, T);
    run.feed(*model, prompt, 0);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const LayerInputs& in = run.steps()[0][size_t(l)];
      const torch::Tensor q = in.q.to(torch::kFloat64), k = in.k.to(torch::kFloat64);
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        INFO("layer " << l << ", kv head " << h);
        std::vector<double> score(size_t(T), 0.0);
        for (int64_t g = h * R; g < (h + 1) * R; ++g)
          for (int64_t i = T - W; i < T; ++i) {
            // softmax over keys 0..i of query i of head g
            const torch::Tensor logits =
                k.narrow(0, 0, i + 1).select(1, h).matmul(q[i][g]) * in.scale;
            const torch::Tensor p = torch::softmax(logits, 0);
            const double factor = normalize ? double(i) : 1.0;
            for (int64_t j = 0; j < T - W; ++j)
              score[size_t(j)] += factor * p[j].item<double>() / double(W * R);
          }
        std::vector<int64_t> context;
        for (int64_t j = 0; j < T - W; ++j) context.push_back(j);
        std::set<int64_t> want = top_k(context, score, budget - W);
        for (int64_t j = T - W; j < T; ++j) want.insert(j);
        CHECK(describe(run.held(l, h)) == describe(want));
      }
    }
    CHECK(run.last_rerotations().empty());  // rerotate=false
  }
}

TEST_CASE("finch: a question window the prompt cannot hold, or a budget below it, is refused",
          "[policies][finch]") {
  auto error_of = [](const std::string& spec, int64_t prompt_tokens) {
    try {
      std::unique_ptr<model::Transformer> model = load_stories();
      PolicyRun run(*model, spec, prompt_tokens + 1, prompt_tokens);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of("finch:budget=40,window=32", 32),
             Catch::Contains("finch:window") && Catch::Contains("32 tokens"));
  CHECK_THAT(error_of("finch:budget=8,window=16", 100), Catch::Contains("finch:budget"));
  CHECK_THAT(error_of("finch:window=0", 100), Catch::Contains("window"));
}

}  // namespace kvscope::test
