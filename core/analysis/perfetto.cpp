#include "core/analysis/perfetto.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/analysis/lifetimes.h"

namespace kvscope::analysis {

namespace {

constexpr int64_t kMicrosPerStep = 1000;  // one step shows as 1 ms

std::string quoted(const std::string& s) {
  // Token pieces are raw bytes that may split a UTF-8 character.
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct Emitter {
  std::ostream& out;
  int64_t count = 0;
  void event(const std::string& body) { out << (count++ ? ",\n" : "\n") << "{" << body << "}"; }
};

void emit_metadata(Emitter& e, const trace::TraceReader& r, int layer) {
  int pid = layer + 1;
  e.event("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(pid) +
          ",\"args\":{\"name\":" + quoted(r.run().policy + " · layer " + std::to_string(layer)) +
          "}");
  e.event("\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(pid) +
          ",\"args\":{\"sort_index\":" + std::to_string(layer) + "}");
  for (int64_t k = 0; k < r.n_kv_heads(); ++k)
    e.event("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
            std::to_string(k + 1) + ",\"args\":{\"name\":\"kv head " + std::to_string(k) + "\"}");
}

void emit_span(Emitter& e, int pid, int tid, int64_t id, const std::string& name,
               const std::string& cat, int64_t begin, int64_t end) {
  std::string common = "\"cat\":\"" + cat + "\",\"name\":" + name +
                       ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
                       ",\"id2\":{\"local\":\"" + std::to_string(id) + "\"}";
  e.event("\"ph\":\"b\"," + common + ",\"ts\":" + std::to_string(begin * kMicrosPerStep));
  e.event("\"ph\":\"e\"," + common + ",\"ts\":" + std::to_string(end * kMicrosPerStep));
}

void emit_head(Emitter& e, const trace::TraceReader& r, const std::vector<std::string>& names,
               int layer, int kv_head, int64_t t0, int64_t t1, int64_t* next_id) {
  const int pid = layer + 1, tid = kv_head + 1;
  const int64_t end = r.n_steps();
  if (r.n_tiers() > 1) {
    for (const trace::TierInterval& iv : r.intervals(layer, kv_head)) {
      if (iv.token < t0 || iv.token >= t1) continue;
      std::string name = quoted(
          "t" + std::to_string(iv.token) + " " + names[size_t(iv.token - t0)] + " [" +
          r.run().tier_names[std::min<size_t>(iv.tier, r.run().tier_names.size() - 1)] + "]");
      emit_span(e, pid, tid, (*next_id)++, name, "tier", iv.begin_step,
                iv.end_step < 0 ? end : iv.end_step);
    }
    return;
  }
  trace::HeadLifetimes lt = r.lifetimes(layer, kv_head, t0, t1);
  for (int64_t i = 0; i < t1 - t0; ++i) {
    int32_t a = lt.admit_step[size_t(i)], ev = lt.evict_step[size_t(i)];
    if (a < 0) continue;
    std::string name = quoted("t" + std::to_string(t0 + i) + " " + names[size_t(i)]);
    emit_span(e, pid, tid, (*next_id)++, name, "lifetime", a, ev < 0 ? end : ev);
  }
}

void emit_counters(Emitter& e, const trace::TraceReader& r, int layer) {
  const int64_t S = r.n_steps(), R = r.n_tiers();
  for (int64_t k = 0; k < r.n_kv_heads(); ++k) {
    std::vector<int32_t> occ = r.occupancy_series(layer, int(k), 0, S);
    for (int64_t s = 0; s < S; ++s) {
      std::string args;
      for (int64_t t = 0; t < R; ++t)
        args += (t ? "," : "") + quoted(r.run().tier_names[size_t(t)]) + ":" +
                std::to_string(occ[size_t(s * R + t)]);
      e.event("\"ph\":\"C\",\"name\":\"occupancy kv head " + std::to_string(k) +
              "\",\"pid\":" + std::to_string(layer + 1) +
              ",\"ts\":" + std::to_string(s * kMicrosPerStep) + ",\"args\":{" + args + "}");
    }
  }
}

}  // namespace

int64_t write_perfetto_json(const trace::TraceReader& r, const PerfettoOptions& options,
                            std::ostream& out) {
  int64_t t0 = std::max<int64_t>(0, options.token_begin);
  int64_t t1 = options.token_end < 0 ? r.n_tokens() : std::min(options.token_end, r.n_tokens());
  t1 = std::max(t0, t1);
  std::vector<std::string> names;
  for (const trace::TokenRecord& t : r.tokens(t0, t1)) names.push_back(t.text);
  std::vector<int> layers = options.layers;
  if (layers.empty())
    for (int l = 0; l < r.n_layers(); ++l) layers.push_back(l);
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":" << quoted(r.path())
      << ",\"policy\":" << quoted(r.run().policy) << ",\"time\":\"1 ms = 1 step\"},"
      << "\"traceEvents\":[";
  Emitter e{out};
  int64_t next_id = 1;
  for (int layer : layers) {
    emit_metadata(e, r, layer);
    for (int k = 0; k < r.n_kv_heads(); ++k) emit_head(e, r, names, layer, k, t0, t1, &next_id);
    if (options.counters) emit_counters(e, r, layer);
  }
  out << "\n]}\n";
  return e.count;
}

}  // namespace kvscope::analysis
