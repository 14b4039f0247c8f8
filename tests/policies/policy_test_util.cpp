#include "tests/policies/policy_test_util.h"

#include <algorithm>
#include <sstream>

#include "capture/model/model_loader.h"
#include "capture/tokenizer/tokenizer.h"
#include "core/common/input_error.h"
#include "tests/support/paths.h"

namespace kvscope::test {

std::unique_ptr<model::Transformer> load_stories() {
  return model::load_model(shared_dir() + "/models/stories260K/stories260K.bin",
                           torch::TensorOptions().dtype(torch::kFloat32));
}

std::string policy_error(const std::string& spec) {
  try {
    policy::make_policy(spec);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::vector<int64_t> story_prompt_ids() {
  auto tok = tokenizer::Tokenizer::load(shared_dir() + "/models/stories260K/tok512.bin", 512);
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. "
      "One day, she saw a big red ball under a tree. She ran to the ball and kicked it. The ball "
      "flew high and landed in the pond. Lily was sad. Her mom came and said";
  std::vector<int32_t> ids = tok->encode(text, true);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

PolicyRun::PolicyRun(const model::Transformer& model, const std::string& spec, int64_t max_tokens,
                     int64_t prompt_tokens)
    : instance_(policy::make_policy(spec, {prompt_tokens, ""})) {
  start(model, instance_.descriptor->name, max_tokens, prompt_tokens);
}

PolicyRun::PolicyRun(const model::Transformer& model, std::unique_ptr<policy::Policy> policy,
                     const std::string& name, int64_t max_tokens, int64_t prompt_tokens) {
  instance_.policy = std::move(policy);
  instance_.name = name;
  start(model, name, max_tokens, prompt_tokens);
}

void PolicyRun::start(const model::Transformer& model, const std::string& name,
                      int64_t max_tokens, int64_t prompt_tokens) {
  const model::ModelConfig& c = model.config();
  L_ = c.n_layers;
  K_ = c.n_kv_heads;
  instance_.policy->setup({&c, max_tokens, prompt_tokens, 16, &model.weights()});
  driver_ = std::make_unique<policy::StepDriver>(
      c, policy::StepDriver::Options{16, max_tokens, prompt_tokens}, *instance_.policy, name);
  driver_->set_observer(this);
}

void PolicyRun::begin_step(int64_t pos0, int64_t n) {
  steps_.emplace_back(size_t(L_));
  probs_.assign(size_t(L_), std::vector<HeadProbs>(size_t(K_)));
  driver_->begin_step(pos0, n);
}

torch::Tensor PolicyRun::attend(const model::AttentionInputs& in) {
  LayerInputs& r = steps_.back()[size_t(in.layer)];
  r.pos0 = in.pos0;
  r.hidden = in.hidden.to(torch::kFloat32).clone();
  r.q = in.q.to(torch::kFloat32).clone();
  r.k = in.k.to(torch::kFloat32).clone();
  r.v = in.v.to(torch::kFloat32).clone();
  r.scale = in.scale;
  return driver_->attend(in);
}

void PolicyRun::end_step() {
  driver_->end_step();
  events_ = driver_->take_events();
  gates_ = driver_->take_gates();
  stalls_ = driver_->take_stalls();
  merges_ = driver_->take_merges();
  rerotations_ = driver_->take_rerotations();
  key_channels_ = driver_->take_key_channels();
}

void PolicyRun::on_attention(int64_t layer, int64_t kv_head, const float* probs, int64_t R,
                             int64_t n, int64_t m, const int64_t* key_pos, int64_t) {
  HeadProbs& hp = probs_[size_t(layer)][size_t(kv_head)];
  hp.probs = torch::from_blob(const_cast<float*>(probs), {R, n, m}, torch::kFloat32).clone();
  hp.key_pos.assign(key_pos, key_pos + m);
}

torch::Tensor PolicyRun::feed(model::Transformer& model, const std::vector<int64_t>& ids,
                              int64_t pos0) {
  torch::Tensor t = torch::tensor(ids, torch::kInt64);
  torch::InferenceMode guard;
  return model.forward(t, pos0, *this);
}

void PolicyRun::generate(model::Transformer& model, const std::vector<int64_t>& prompt,
                         int64_t decode, const std::function<void(int64_t)>& after_step) {
  torch::Tensor logits = feed(model, prompt, 0);
  if (after_step) after_step(0);
  int64_t pos = int64_t(prompt.size());
  for (int64_t s = 1; s <= decode; ++s) {
    const int64_t next = logits.reshape({-1}).argmax().item<int64_t>();
    logits = feed(model, {next}, pos++);
    if (after_step) after_step(s);
  }
}

std::set<int64_t> PolicyRun::held(int64_t layer, int64_t kv_head) const {
  std::set<int64_t> out;
  for (int64_t t = 0; t < cache().n_tiers(); ++t)
    for (int32_t p : cache().positions(layer, kv_head, t)) out.insert(p);
  return out;
}

LayerInputs PolicyRun::all_inputs(int64_t layer) const {
  std::vector<torch::Tensor> h, q, k, v;
  for (const auto& step : steps_) {
    h.push_back(step[size_t(layer)].hidden);
    q.push_back(step[size_t(layer)].q);
    k.push_back(step[size_t(layer)].k);
    v.push_back(step[size_t(layer)].v);
  }
  LayerInputs out;
  out.hidden = torch::cat(h);
  out.q = torch::cat(q);
  out.k = torch::cat(k);
  out.v = torch::cat(v);
  out.scale = steps_.front()[size_t(layer)].scale;
  return out;
}

torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, int64_t q_pos0,
                                  double scale) {
  const int64_t n = q.size(0), H = q.size(1), K = k.size(1), m = k.size(0), R = H / K;
  torch::Tensor kk = k.repeat_interleave(R, 1);  // [m, H, hd]
  torch::Tensor s =
      torch::einsum("nhd,mhd->hnm", {q.to(torch::kFloat64), kk.to(torch::kFloat64)}) * scale;
  torch::Tensor qpos = torch::arange(q_pos0, q_pos0 + n).unsqueeze(1);
  torch::Tensor kpos = torch::arange(m).unsqueeze(0);
  s = s.masked_fill((kpos > qpos).unsqueeze(0), -std::numeric_limits<double>::infinity());
  return torch::softmax(s, -1);
}

std::set<int64_t> top_k(const std::vector<int64_t>& candidates, const std::vector<double>& score,
                        int64_t keep) {
  std::vector<int64_t> c = candidates;
  std::sort(c.begin(), c.end(), [&](int64_t a, int64_t b) {
    return score[size_t(a)] != score[size_t(b)] ? score[size_t(a)] > score[size_t(b)] : a > b;
  });
  c.resize(size_t(std::min<int64_t>(keep, int64_t(c.size()))));
  return std::set<int64_t>(c.begin(), c.end());
}

std::string describe(const std::set<int64_t>& s) {
  std::ostringstream o;
  for (int64_t p : s) o << p << ' ';
  return o.str();
}

std::vector<EventKey> events_of_story_run(const std::string& spec, int64_t decode,
                                          std::vector<trace::Event>* raw) {
  std::unique_ptr<model::Transformer> model = load_stories();
  std::vector<int64_t> ids = story_prompt_ids();
  PolicyRun run(*model, spec, int64_t(ids.size()) + decode + 1, int64_t(ids.size()));
  std::vector<EventKey> out;
  run.generate(*model, ids, decode, [&](int64_t) {
    for (const trace::Event& e : run.last_events()) {
      out.emplace_back(int(e.kind), e.step, e.layer, e.kv_head, e.token, int(e.to_tier));
      if (raw) raw->push_back(e);
    }
  });
  return out;
}

}  // namespace kvscope::test
