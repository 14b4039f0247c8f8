// Training the Latent Salience Forecaster offline from full-cache traces
// (seed 004, "Training the forecaster with an asymmetric salience loss";
// docs/policies/sfc.md, "Training"). The batched LibTorch form of the
// forecaster (sfc_forecaster.h is the capture-time form; a test holds the
// two equal): for a set of groups and tokens of one trace, the features of
// every step, the GRU unrolled over the steps (written out with matmuls, as
// the doc's formula), the two logits per (group, step, token); the
// asymmetric focal loss on both outputs and the promotion-latency term; the
// held-out metrics (AUROC, precision and recall at 0.5, onsets forecast
// `lead` steps ahead).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture/gates/gate_set.h"
#include "capture/gates/sfc_forecaster.h"
#include "capture/train/sfc_data.h"
#include "capture/train/train_options.h"

namespace kvscope::gates {

// sfc's own options: the traces it trains from and how they are sampled
// (docs/policies/sfc.md "Training"; the batch is traces per step).
struct SfcTrainOptions {
  std::vector<std::string> traces;   // --traces: captured with --policy full --capture received
  std::vector<std::string> holdout;  // --holdout: evaluated, never trained on
  int64_t tokens = 128;              // tokens sampled per trace and step
  int64_t groups = 0;                // (layer, kv head) groups sampled per step; 0: all
  int64_t bptt = 0;                  // truncated backprop every N steps; 0: whole trace
  int64_t eval_cells = int64_t(1) << 20;  // (group, step, token) entries per evaluation chunk
};

// Trains (or, with o.evaluate, evaluates) the sfc-gru forecaster
// (sfc_trainer.cpp).
TrainResult train_sfc(const TrainOptions& o, const SfcTrainOptions& s);

// The parameters training moves (docs/policies/sfc.md, "Training"): the
// doc's features differ in scale by two orders of magnitude (x1 in [0, 1],
// x3 in the hundreds for large keys), which saturates the GRU's gates at the
// nn.GRU initialisation and leaves Adam's steps far too large for some
// inputs and too small for others. Training therefore moves the parameters
// in standardised coordinates, with the per-group feature means mu and
// standard deviations sigma measured once on the training data before the
// first step:
//   W_lat = V / rms_k            (rms_k: the root mean square key norm of the group)
//   w_ih  = W / sigma            (column-wise), b_ih = b - w_ih mu
// so the GRU starts on standardised features. The gate file holds the
// effective parameters (the doc's formula on the raw features, exactly);
// w_hh, b_hh and the head train as they are.
class SfcTrainable {
 public:
  // From a freshly initialised gate set (init_gates): V = latent * sqrt(hd)
  // (N(0, 1)), W = w_ih, b = b_ih; the statistics from up to `tokens`
  // tokens of every sequence (evenly spaced), all groups and steps.
  SfcTrainable(const GateSet& init, const std::vector<SfcSequence>& data, int64_t tokens = 64);

  SfcParams params() const;  // the effective parameters, autograd-connected to the leaves
  std::vector<torch::Tensor> leaves() const;
  void write_to(GateSet& g) const;  // the effective parameters, per layer, detached
  nlohmann::json describe() const;  // the statistics (for the metadata)

  torch::Tensor mu, sigma;  // [NG, F]
  torch::Tensor key_rms;    // [NG]

 private:
  SfcConfig cfg_;
  int64_t L_ = 0, K_ = 0;
  torch::Tensor v_, w_, b_, w_hh_, b_hh_, head_w_, head_b_;
};

// Groups `groups` (int64 [Bg]) and tokens `tokens` (int64 [Bt], ascending)
// of a sequence, steps t0 .. S - 1 (t0 = min fed_at + 1 of the tokens).
struct SfcForward {
  int64_t t0 = 0;
  torch::Tensor logits;    // [Bg, S - t0, Bt, 2]: (now, horizon)
  torch::Tensor active;    // bool [S - t0, Bt]: the token's forecaster runs at the step
  torch::Tensor features;  // [Bg, S - t0, Bt, F] (detached; x0 is the EWMA baseline)
};
// bptt > 0: the hidden state is detached every bptt steps (truncated
// backpropagation through time); 0: through the whole trace.
SfcForward sfc_forward(const SfcParams& p, const SfcConfig& c, const SfcSequence& s,
                       const torch::Tensor& groups, const torch::Tensor& tokens, int64_t bptt = 0);

// The asymmetric focal BCE per entry (seed 004):
//   -[alpha y (1 - p)^gamma log p + (1 - y) p^gamma log(1 - p)],  p = sigmoid(logit)
// computed from log-sigmoids ((1 - p)^gamma = exp(gamma log(1 - p))), so
// gamma = 0 and saturated logits stay finite. alpha = 1, gamma = 0: BCE.
torch::Tensor sfc_focal_bce(const torch::Tensor& logits, const torch::Tensor& y, double alpha,
                            double gamma);

struct SfcLossOptions {
  double alpha = 6.0, gamma = 2.0;
  double latency_weight = 1.0;
  int64_t lead = 2;
  int64_t horizon = 32;
  static SfcLossOptions of(const GateSet& g);
};

// The labels of a forward's entries ([Bg, S - t0, Bt], like its logits).
struct SfcTargets {
  torch::Tensor y_now, valid_now;  // float, bool
  torch::Tensor y_hor, valid_hor;
  // Need onsets (y_now(s) = 1, y_now(s - 1) = 0) whose forecast step
  // t = s - lead exists for the token, marked at t (bool [Bg, S - t0, Bt]).
  torch::Tensor onset_at;
};
SfcTargets sfc_targets(const SfcSequence& s, const SfcForward& f, const torch::Tensor& groups,
                       const torch::Tensor& tokens, const SfcLossOptions& o);

// L = L_now + L_hor + latency_weight * L_lat: the focal BCE means over the
// valid entries of each output, and L_lat = mean over onsets of
// alpha (1 - p_hor(t))^gamma (-log p_hor(t)), t = s - lead.
struct SfcLoss {
  torch::Tensor total;
  double now = 0, hor = 0, latency = 0;
  int64_t n_now = 0, n_hor = 0, n_onsets = 0;
};
SfcLoss sfc_loss(const SfcForward& f, const SfcTargets& y, const SfcLossOptions& o);

// Streaming metrics over many forwards (no scores kept: AUROC from
// histograms of the logits in bins of 1/256, ties in a bin counted half).
class SfcMetrics {
 public:
  explicit SfcMetrics(const SfcLossOptions& o);
  void add(const SfcForward& f, const SfcTargets& y, const SfcLoss& loss);
  nlohmann::json to_json() const;
  double loss() const;

 private:
  struct Output {
    std::vector<double> pos, neg;            // histogram of logits
    std::vector<double> base_pos, base_neg;  // of the EWMA feature x0 (the baseline)
    double tp = 0, fp = 0, fn = 0, tn = 0;
  };
  void add_output(Output& o, const torch::Tensor& logits, const torch::Tensor& x0,
                  const torch::Tensor& y, const torch::Tensor& valid);
  SfcLossOptions o_;
  Output now_, hor_;
  double onsets_ = 0, onsets_early_ = 0;
  double loss_now_ = 0, loss_hor_ = 0, loss_lat_ = 0;
  double n_now_ = 0, n_hor_ = 0, n_lat_ = 0;
};

// AUROC of a pair of histograms over the same ascending bins.
double sfc_auroc(const std::vector<double>& pos, const std::vector<double>& neg);

// Every group and token of each sequence, in chunks of about `cells`
// (group, step, token) entries.
SfcMetrics sfc_evaluate(const GateSet& g, const std::vector<SfcSequence>& data,
                        int64_t cells = int64_t(1) << 21);

}  // namespace kvscope::gates
