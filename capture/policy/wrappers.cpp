// The wrappers: each changes one thing about how an eviction part turns its
// scorer's scores into evictions, around ANY scorer (`snapkv:budget=0.25+pyramid`,
// `knorm:budget=64+adakv:alpha=0.3+chunk:size=8`). docs/policies/composition.md
#include <cmath>
#include <sstream>

#include "capture/policy/registry.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

// "0.5/0.25/0.75" -> fractions in (0, 1].
std::vector<double> parse_fractions(const std::string& field, const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, '/')) {
    char* end = nullptr;
    const double f = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(f > 0 && f <= 1))
      throw InputError("--policy", field,
                       "'" + item + "': fractions in (0, 1] separated by '/' expected");
    out.push_back(f);
  }
  if (out.empty()) throw InputError("--policy", field, "at least one fraction expected");
  return out;
}

WrapperDescriptor pyramid_wrapper() {
  return {"pyramid",
          "PyramidKV's layer budgets around the scorer: more below, fewer above (mean = budget)",
          "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information "
          "Funneling, 2024",
          "docs/policies/pyramidkv.md",
          {{"beta", ParamType::Float, "20",
            "steepness: the top layer keeps (budget - recent) / beta unprotected entries", 1, 1e6},
           {"spread", ParamType::String, "prefix",
            "prefix (the paper's code) or all (kvpress PyramidKVPress: the whole budget on the "
            "sequence)"}},
          [](ScoredPolicy& p, const Params& w) {
            if (p.shape().adaptive)
              throw InputError("--policy", "pyramid",
                               "per-layer budgets and adakv's shared layer budget contradict");
            const std::string& spread = w.get_string("spread");
            if (spread != "prefix" && spread != "all")
              throw InputError("--policy", "pyramid:spread",
                               "'prefix' or 'all' expected, got '" + spread + "'");
            p.shape().pyramid_whole = spread == "all";
            p.shape().pyramid_beta = w.get_float("beta");
          }};
}

WrapperDescriptor adakv_wrapper() {
  return {"adakv",
          "Ada-KV's adaptive head budgets: the layer's budget x kv heads shared across its heads",
          "Feng et al., Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for "
          "Efficient LLM Inference, 2024",
          "docs/policies/adakv.md",
          {{"alpha", ParamType::Float, "0.2",
            "safeguard: every head keeps its top floor(alpha x budget) entries", 0, 1}},
          [](ScoredPolicy& p, const Params& w) {
            if (p.shape().pyramid_beta > 0 || !p.shape().layer_keep.empty())
              throw InputError("--policy", "adakv",
                               "adakv shares one budget per layer: not with per-layer budgets");
            if (p.shape().chunk_shared || p.shape().block > 0 || p.shape().merge)
              throw InputError("--policy", "adakv",
                               "adakv shares budgets across heads: not with chunk:heads=shared, "
                               "block or merge");
            p.shape().adaptive = true;
            p.shape().alpha = w.get_float("alpha");
          }};
}

WrapperDescriptor chunk_wrapper() {
  return {
      "chunk",
      "ChunkKV: entries scored and kept by chunks of consecutive positions (chunk score = mean)",
      "Liu et al., ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context "
      "LLM Inference, 2025",
      "docs/policies/composition.md",
      {{"size", ParamType::Int, "10", "positions per chunk (the paper's default: 10)", 1, 1 << 20},
       {"heads", ParamType::String, "each",
        "each: every head picks its own chunks; shared: the layer's heads keep the same chunks "
        "(kvpress ChunkKVPress: scores summed over heads)"},
       {"entropy", ParamType::Int, "0",
        "with heads=shared: a high-scoring chunk of low score entropy keeps only this many "
        "entries (kvpress EntropyGatedChunkKVPress's low_entropy_chunk_length; 0: off)",
        0, 1 << 20}},
      [](ScoredPolicy& p, const Params& w) {
        const std::string& heads = w.get_string("heads");
        if (heads != "each" && heads != "shared")
          throw InputError("--policy", "chunk:heads",
                           "'each' or 'shared' expected, got '" + heads + "'");
        if (heads == "shared" && (p.shape().adaptive || p.shape().merge))
          throw InputError("--policy", "chunk:heads",
                           "shared chunks keep one set for the layer's heads: not with adakv or "
                           "merge");
        p.shape().chunk = w.get_int("size");
        p.shape().chunk_shared = heads == "shared";
        p.shape().chunk_entropy = w.get_int("entropy");
        if (p.shape().chunk_entropy > 0 &&
            (heads != "shared" || p.shape().chunk_entropy >= p.shape().chunk))
          throw InputError("--policy", "chunk:entropy",
                           "needs heads=shared and 1 <= entropy < size (" +
                               std::to_string(p.shape().chunk) + ")");
      }};
}

WrapperDescriptor block_wrapper() {
  return {"block",
          "the prompt compressed block by block: the kept entries plus each next block, the best "
          "`budget` of them stay (kvpress BlockPress)",
          "Park et al., KeyDiff, 2025 (block-wise prompt processing; kvpress BlockPress)",
          "docs/policies/composition.md",
          {{"size", ParamType::Int, "128", "entries per block", 1, 1 << 20}},
          [](ScoredPolicy& p, const Params& w) {
            if (p.scorer().subsets() == HeadScorer::Subsets::Other)
              throw InputError("--policy", "block",
                               "the scorer " + p.scorer().score_name() +
                                   " cannot score a subset of the prompt on its own (its score "
                                   "needs the whole prompt, or the entries' order): knorm, "
                                   "keydiff, random or observed_attention expected");
            if (p.shape().adaptive || p.shape().chunk > 1 || p.shape().merge)
              throw InputError("--policy", "block",
                               "per-head budgets only: not with adakv, chunk or merge");
            p.shape().block = w.get_int("size");
          }};
}

WrapperDescriptor per_chunk_wrapper() {
  return {"per_chunk",
          "each chunk of the prompt keeps its share of the budget, scored on its own (kvpress "
          "ChunkPress, FINCH's uniform compression)",
          "Corallo & Papotti, FINCH: Prompt-guided Key-Value Cache Compression, TACL 2024 (kvpress "
          "ChunkPress)",
          "docs/policies/composition.md",
          {{"size", ParamType::Int, "1024", "entries per chunk", 1, 1 << 20}},
          [](ScoredPolicy& p, const Params& w) {
            if (p.scorer().subsets() == HeadScorer::Subsets::Other)
              throw InputError("--policy", "per_chunk",
                               "the scorer " + p.scorer().score_name() +
                                   " cannot score a chunk of the prompt on its own: knorm, "
                                   "keydiff, random or observed_attention expected");
            if (p.shape().adaptive || p.shape().chunk > 1 || p.shape().block > 0 || p.shape().merge)
              throw InputError("--policy", "per_chunk",
                               "per-head budgets only: not with adakv, chunk, block or merge");
            p.shape().per_chunk = w.get_int("size");
          }};
}

WrapperDescriptor merge_wrapper() {
  return {"merge",
          "merge-on-evict: each leaving value folds into the survivor with the most similar key "
          "(kvpress MergingPress)",
          "Bolya et al., Token Merging, ICLR 2023; Wan et al., D2O, 2024 (kvpress MergingPress)",
          "docs/policies/merging.md",
          {{"threshold", ParamType::Float, "0", "least cosine similarity for a merge", 0, 1},
           {"fraction", ParamType::Float, "1",
            "share of the leaving entries merged, most similar first", 0, 1}},
          [](ScoredPolicy& p, const Params& w) {
            if (p.shape().adaptive || p.shape().chunk > 1 || p.shape().block > 0 ||
                p.shape().per_chunk > 0)
              throw InputError("--policy", "merge",
                               "per-head budgets only: not with adakv, chunk, block or per_chunk");
            if (!(w.get_float("fraction") > 0))
              throw InputError("--policy", "merge:fraction", "must be in (0, 1]");
            p.shape().merge = true;
            p.shape().merge_options = {w.get_float("threshold"), w.get_float("fraction")};
          }};
}

WrapperDescriptor rerotate_wrapper() {
  return {
      "rerotate",
      "after each compression, the kept keys of a head are re-rotated to RoPE positions 0..n-1 "
      "(kvpress KeyRerotationPress)",
      "kvpress KeyRerotationPress (transformers' SinkCache; FINCH, Corallo & Papotti, TACL 2024)",
      "docs/policies/rerotate.md",
      {},
      [](ScoredPolicy& p, const Params&) { p.shape().rerotate = true; }};
}

WrapperDescriptor layer_ratios_wrapper() {
  return {"layer_ratios",
          "per-layer budgets: layer l keeps keep[l] of the prompt per head (kvpress "
          "PerLayerCompressionPress, keep = 1 - compression_ratio)",
          "kvpress PerLayerCompressionPress (NVIDIA)",
          "docs/policies/composition.md",
          {{"keep", ParamType::String, "", "one fraction per layer, '/'-separated: 0.5/0.25/..."}},
          [](ScoredPolicy& p, const Params& w) {
            if (p.shape().adaptive || p.shape().pyramid_beta > 0)
              throw InputError("--policy", "layer_ratios",
                               "one per-layer allocator only (not with adakv or pyramid)");
            p.shape().layer_keep = parse_fractions("layer_ratios:keep", w.get_string("keep"));
          }};
}

WrapperDescriptor cadence_wrapper() {
  return {"cadence",
          "when the eviction part compresses: at the end of the prefill and every N decode steps; "
          "decode only; a budget that grows with the tokens fed",
          "baseline (kvpress DecodingPress's compression_interval)",
          "docs/policies/composition.md",
          {{"every", ParamType::Int, "1",
            "decode steps between compressions (the every-th, 2 every-th, ... decode step)", 1,
            1 << 20},
           {"prefill", ParamType::Bool, "true",
            "also compress at the end of the prefill (false: decode only, kvpress DecodingPress)"},
           {"keep", ParamType::Float, "",
            "at decode, keep this share of the tokens fed instead of the fixed budget (kvpress "
            "CompressionRatioDecodingPress: keep = 1 - target_compression_ratio)",
            0, 1}},
          [](ScoredPolicy& p, const Params& w) {
            p.shape().every = w.get_int("every");
            p.shape().prefill = w.get_bool("prefill");
            const double keep = w.get_float("keep");
            if (!std::isnan(keep)) {
              if (!(keep > 0 && keep < 1))
                throw InputError("--policy", "cadence:keep", "a share in (0, 1) expected");
              p.shape().grow = keep;
            }
          }};
}

WrapperDescriptor protect_wrapper() {
  return {"protect",
          "protections on top of the scorer's: the first `sinks` and last `recent` positions stay",
          "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024",
          "docs/policies/composition.md",
          {{"sinks", ParamType::Int, "0", "first positions never evicted", 0, 1 << 30},
           {"recent", ParamType::Int, "0", "most recent positions never evicted", 0, 1 << 30}},
          [](ScoredPolicy& p, const Params& w) {
            p.shape().extra = {w.get_int("sinks"), w.get_int("recent")};
            if (p.base_budget() <= w.get_int("sinks") + w.get_int("recent"))
              throw InputError("--policy", "protect",
                               "the budget (" + std::to_string(p.base_budget()) +
                                   ") must exceed sinks + recent");
          }};
}

}  // namespace

const std::vector<WrapperDescriptor>& builtin_wrappers() {
  static const std::vector<WrapperDescriptor> all = {
      pyramid_wrapper(),   adakv_wrapper(),  chunk_wrapper(),    block_wrapper(),
      per_chunk_wrapper(), merge_wrapper(),  rerotate_wrapper(), layer_ratios_wrapper(),
      cadence_wrapper(),   protect_wrapper()};
  return all;
}

const WrapperDescriptor* find_wrapper(const std::string& name) {
  for (const WrapperDescriptor& d : builtin_wrappers())
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace kvscope::policy
