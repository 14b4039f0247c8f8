#include "capture/train/gated_attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <limits>
#include <stdexcept>

#include "capture/gates/gate_nets.h"
#include "core/common/check.h"

namespace kvscope::gates {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// [n, n] i - j (rows: queries, columns: keys), on the device of the tensors
// it meets (the trainer runs on the CPU or a GPU).
torch::Tensor distance(int64_t n, torch::Device device, torch::ScalarType dt = torch::kFloat32) {
  torch::Tensor r = torch::arange(n, torch::TensorOptions().dtype(dt).device(device));
  return r.unsqueeze(1) - r.unsqueeze(0);
}

}  // namespace

torch::Tensor dense_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, double scale, int64_t window,
                              const torch::Tensor& bias, const torch::Tensor& mult) {
  const int64_t n = q.size(0), H = q.size(1), K = k.size(1), R = H / K;
  // float32, or float64 when given (the gradient tests difference in double).
  const auto dt = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  torch::Tensor qh = q.to(dt).permute({1, 0, 2});
  torch::Tensor kh = k.to(dt).permute({1, 0, 2}).repeat_interleave(R, 0);
  torch::Tensor vh = v.to(dt).permute({1, 0, 2}).repeat_interleave(R, 0);
  torch::Tensor s = torch::bmm(qh, kh.transpose(1, 2)) * scale;  // [H, n, n]
  torch::Tensor d = distance(n, q.device());
  torch::Tensor allowed = d >= 0;
  if (window > 0) allowed = allowed & (d < double(window));
  if (bias.defined()) s = s + bias.repeat_interleave(R, 0);
  s = s.masked_fill(allowed.logical_not(), -kInf);
  torch::Tensor p;
  if (mult.defined()) {
    // exp(s) * M / sum exp(s) * M: the mask enters multiplicatively so its
    // straight-through gradient is finite (the diagonal keeps the sum > 0).
    torch::Tensor e =
        torch::exp(s - std::get<0>(s.max(-1, true)).detach()) * mult.repeat_interleave(R, 0);
    p = e / e.sum(-1, true);
  } else {
    p = torch::softmax(s, -1);
  }
  return torch::bmm(p, vh).permute({1, 0, 2});  // [n, H, hd]
}

torch::Tensor straight_through_flags(const torch::Tensor& s, double gamma, double tau) {
  torch::Tensor prob = torch::sigmoid(s + gamma);
  torch::Tensor hard = (prob > tau).to(s.scalar_type());
  return hard + (prob - prob.detach());
}

torch::Tensor wgkv_log_bias(const torch::Tensor& g, int64_t window) {
  const int64_t n = g.size(1);
  torch::Tensor local = (distance(n, g.device()) < double(window)).unsqueeze(0);  // [1, n, n]
  return torch::where(local, torch::zeros({1}, g.options()), torch::log(g).unsqueeze(1));
}

torch::Tensor retention_bias(const torch::Tensor& log_beta) {
  const int64_t n = log_beta.size(1);
  return distance(n, log_beta.device(), log_beta.scalar_type()).clamp_min(0).unsqueeze(0) *
         log_beta.unsqueeze(1);
}

torch::Tensor attention_gate_mask(const torch::Tensor& flags) {
  const int64_t K = flags.size(0), n = flags.size(1);
  torch::Tensor eye = torch::eye(n, flags.options().dtype(torch::kBool)).unsqueeze(0);
  return torch::where(eye, torch::ones({1}, flags.options()), flags.unsqueeze(1).expand({K, n, n}));
}

torch::Tensor dms_shift(const torch::Tensor& z) {
  const int64_t n = z.size(1);
  return torch::cat({z.narrow(1, 1, n - 1), torch::zeros({z.size(0), 1}, z.options())}, 1);
}

torch::Tensor dms_log_bias(const torch::Tensor& log_keep, int64_t window) {
  const int64_t n = log_keep.size(1);
  torch::Tensor near =
      (distance(n, log_keep.device()) <= double(window)).unsqueeze(0);  // [1, n, n]
  return torch::where(near, torch::zeros({1}, log_keep.options()), log_keep.unsqueeze(1));
}

namespace {

// Logistic noise log u - log(1 - u): the difference of two Gumbel(0, 1)
// draws, which the official trainer adds (a - b). Drawn by the CPU generator
// on every device, so a seed gives the same noise on the CPU and a GPU.
torch::Tensor logistic_noise(at::IntArrayRef shape, uint64_t seed, torch::Device device) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::Tensor u = at::rand(shape, gen, torch::kFloat32).clamp(1e-6, 1 - 1e-6);
  return (torch::log(u) - torch::log1p(-u)).to(device);
}

}  // namespace

void GatedDenseBackend::begin_step(int64_t pos0, int64_t n) {
  KVSCOPE_CHECK(pos0 == 0, "GatedDenseBackend: one step over the whole window at position 0");
  gate.clear();
  flags.clear();
  soft_size.clear();
}

torch::Tensor GatedDenseBackend::attend(const model::AttentionInputs& in) {
  const int64_t l = in.layer;
  if (int64_t(gate.size()) <= l) {
    gate.resize(size_t(l + 1));
    flags.resize(size_t(l + 1));
    soft_size.resize(size_t(l + 1));
  }
  torch::Tensor bias, mult;
  if (mode_ != Mode::Full) {
    const GateSet& g = *gates_;
    switch (g.kind) {
      case GateKind::WriteGate: {
        torch::Tensor gv = wgkv_gate(g, l, in.k_pre_rope, in.k);
        const int64_t W = int64_t(g.hyper("window"));
        if (mode_ == Mode::Soft) {
          bias = wgkv_log_bias(gv, W);
        } else {
          const int64_t n = gv.size(1);
          torch::Tensor keep = (distance(n, gv.device()) < double(W)).unsqueeze(0) |
                               (gv >= g.hyper("tau")).unsqueeze(1);
          bias = torch::where(keep, torch::zeros({1}, gv.options()),
                              torch::full({1}, -kInf, gv.options()));
        }
        gate[size_t(l)] = gv;
        break;
      }
      case GateKind::AttentionGate: {
        torch::Tensor s = attention_gate_scores(g, l, in.hidden);
        gate[size_t(l)] = torch::sigmoid(s + g.hyper("gamma"));
        flags[size_t(l)] = straight_through_flags(s, g.hyper("gamma"), g.hyper("tau"));
        mult = attention_gate_mask(flags[size_t(l)]);
        break;
      }
      case GateKind::KvpopMlp:
      case GateKind::KvpopMlstm:
        // KVpop trains through its own backend (kvpop_training.h).
        throw std::logic_error("GatedDenseBackend: KVpop scorers train through KvpopTrainBackend");
      case GateKind::SfcGru:  // trained from traces (sfc_training.h), never through attention
        throw std::logic_error("GatedDenseBackend: SFC forecasters train from traces");
      case GateKind::QFilter:  // calibrated (query_calibration.cpp), never through attention
      case GateKind::QueryStats:
      case GateKind::Kvzap:
      case GateKind::FastKvzip:
        throw std::logic_error(
            "GatedDenseBackend: query filters, statistics and KVzap are calibrated");
      case GateKind::Dms: {
        torch::Tensor z = dms_decision_logits(g, l, in.hidden);  // [K, n]
        const int64_t w = int64_t(g.hyper("window"));
        if (mode_ == Mode::Soft) {
          torch::Tensor zs =
              (z + logistic_noise(z.sizes(), noise_seed * 1000003ULL + uint64_t(l), z.device())) /
              g.hyper("tau");
          torch::Tensor alpha = torch::sigmoid(zs);
          gate[size_t(l)] = alpha;
          flags[size_t(l)] = (alpha > 0.5).to(alpha.scalar_type()) - alpha.detach() + alpha;
          bias = dms_log_bias(torch::log_sigmoid(-dms_shift(zs)), w);
        } else {
          gate[size_t(l)] = torch::sigmoid(z);
          flags[size_t(l)] = (z > 0).to(torch::kFloat32);
          const int64_t n = z.size(1);
          torch::Tensor gone =
              (distance(n, z.device()) > double(w)).unsqueeze(0) & (dms_shift(z) > 0).unsqueeze(1);
          bias = torch::where(gone, torch::full({1}, -kInf, z.options()),
                              torch::zeros({1}, z.options()));
        }
        break;
      }
      case GateKind::Retention:
      case GateKind::RetentionGlobal: {
        torch::Tensor lb = retention_log_beta(g, l, in.hidden);
        bias = retention_bias(lb);
        const int64_t n = lb.size(1);
        soft_size[size_t(l)] =
            (torch::exp(bias) * (distance(n, lb.device()) >= 0).unsqueeze(0)).sum(-1);
        gate[size_t(l)] = lb;
        break;
      }
    }
  }
  return dense_attention(in.q, in.k, in.v, in.scale, in.sliding_window, bias, mult);
}

}  // namespace kvscope::gates
