// Writes a trace with the KVScope writer, and beside it a JSON of what was
// handed to the writer, for h5py_interop.py to compare against.
//   write_interop_trace OUT_TRACE OUT_JSON
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iostream>

#include "core/trace/half.h"
#include "core/trace/synthetic.h"

using namespace kvscope::trace;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: write_interop_trace OUT_TRACE OUT_JSON\n";
    return 2;
  }
  SyntheticSpec spec;
  spec.layers = 3;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.prompt_tokens = 30;
  spec.decode_steps = 12;
  spec.prefill_chunk = 8;
  spec.tiers = 2;
  spec.cold_attended = false;  // tier 1 offloaded: /run tier_attended [1, 0] and /stalls rows
  spec.window = 6;
  spec.sinks = 2;
  spec.pooled_block = 4;
  spec.topk = 2;
  spec.seed = 7;
  SyntheticCapture cap(spec);
  write_synthetic_trace(argv[1], spec);

  nlohmann::json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["policy"] = cap.run().policy;
  j["prompt"] = cap.run().prompt;
  j["tier_names"] = cap.run().tier_names;
  j["tier_attended"] = cap.run().tier_attended;
  j["n_layers"] = spec.layers;
  j["n_heads"] = spec.heads;
  j["n_kv_heads"] = spec.kv_heads;
  nlohmann::json ids = nlohmann::json::array(), texts = nlohmann::json::array(),
                 roles = nlohmann::json::array();
  nlohmann::json ev = {{"step", nlohmann::json::array()}, {"layer", nlohmann::json::array()},
                       {"kv_head", nlohmann::json::array()}, {"token", nlohmann::json::array()},
                       {"kind", nlohmann::json::array()}, {"score", nlohmann::json::array()},
                       {"from_tier", nlohmann::json::array()}, {"to_tier", nlohmann::json::array()}};
  nlohmann::json occupancy = nlohmann::json::array(), entries = nlohmann::json::array();
  nlohmann::json series = nlohmann::json::array();  // [S][L*K] of the one series, "cutoff"
  nlohmann::json stalls = {
      {"step", nlohmann::json::array()},    {"layer", nlohmann::json::array()},
      {"kv_head", nlohmann::json::array()}, {"token", nlohmann::json::array()},
      {"wait_s", nlohmann::json::array()},  {"needed", nlohmann::json::array()}};
  nlohmann::json pooled_mean;  // layer 1, head 2, rows as last written
  std::string generated;
  int64_t kb = (spec.prompt_tokens + spec.decode_steps + spec.pooled_block - 1) / spec.pooled_block;
  std::vector<std::vector<float>> mean(static_cast<size_t>(kb), std::vector<float>(size_t(kb), 0));
  for (int64_t s = 0; s < cap.n_steps(); ++s) {
    StepData sd = cap.step(s);
    for (const auto& t : sd.tokens) {
      ids.push_back(t.id);
      texts.push_back(t.text);
      roles.push_back(static_cast<int>(t.role));
    }
    for (const Event& e : sd.events) {
      ev["step"].push_back(e.step);
      ev["layer"].push_back(e.layer);
      ev["kv_head"].push_back(e.kv_head);
      ev["token"].push_back(e.token);
      ev["kind"].push_back(static_cast<int>(e.kind));
      ev["score"].push_back(e.score);
      ev["from_tier"].push_back(e.from_tier);
      ev["to_tier"].push_back(e.to_tier);
    }
    for (const StallRow& st : sd.stalls) {
      stalls["step"].push_back(st.step);
      stalls["layer"].push_back(st.layer);
      stalls["kv_head"].push_back(st.kv_head);
      stalls["token"].push_back(st.token);
      stalls["wait_s"].push_back(st.wait_s);
      stalls["needed"].push_back(st.needed);
    }
    occupancy.push_back(sd.occupancy);
    // JSON has no NaN: a hole (nothing recorded) is null.
    nlohmann::json row = nlohmann::json::array();
    for (float v : sd.series) row.push_back(std::isnan(v) ? nlohmann::json() : nlohmann::json(v));
    series.push_back(row);
    entries.push_back(sd.step.entries);
    for (const PooledRow& row : sd.pooled)
      if (row.layer == 1)
        for (int64_t k = 0; k < kb; ++k)
          mean[size_t(row.query_block)][size_t(k)] =
              half_to_float(float_to_half(row.mean[size_t(2 * kb + k)]));
    generated += sd.generated_text;
  }
  nlohmann::json admit = nlohmann::json::array(), evict = nlohmann::json::array();
  for (int64_t t = 0; t < spec.prompt_tokens + spec.decode_steps; ++t) {
    admit.push_back(synthetic_admit_step(spec, t));
    evict.push_back(synthetic_evict_step(spec, 1, 1, t));
  }
  j["n_steps"] = cap.n_steps();
  j["token_ids"] = ids;
  j["token_texts"] = texts;
  j["token_roles"] = roles;
  j["events"] = ev;
  j["occupancy"] = occupancy;
  j["entries"] = entries;
  j["admit_step_l1_k1"] = admit;
  j["evict_step_l1_k1"] = evict;
  j["pooled_mean_l1_h2"] = mean;
  j["generated_text"] = generated;
  j["series_names"] = {cap.layout().series.at(0).name};
  j["series_units"] = cap.layout().series.at(0).units;
  j["series_values"] = series;
  j["stalls"] = stalls;
  std::ofstream(argv[2]) << j.dump();
  return 0;
}
