// Decode attention on the CPU: one query per head over the rows of a kv head,
// read in place from the segments holding them (a dense cache's one run, a
// ragged cache's pages).
//
// Split by keys (as flash-decoding does on GPUs): the rows are cut into
// chunks of kChunk by row index, never by segment. Each chunk gives, per
// query head r, its largest score m_c, l_c = sum_j exp(s_j - m_c) and
// o_c = sum_j exp(s_j - m_c) v_j. The chunks of a head are then combined in
// chunk order: M = max_c m_c, L = sum_c l_c exp(m_c - M),
// out = sum_c o_c exp(m_c - M) / L, weight_j = exp(s_j - m_c) exp(m_c - M) / L.
// Chunks run in parallel (kernels/parallel.h). Neither the cut nor the order
// of the combination depends on the threads or on the segments, so the
// numbers are the same for any thread count, and a ragged cache holding the
// rows of a dense one in the same order computes the same bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/common/check.h"
#include "kernels/attention.h"
#include "kernels/cpu/float_loops.h"
#include "kernels/parallel.h"

namespace kvscope::kernels {

namespace {

// Rows per chunk. Measured on one decode step of SmolLM2's shape (30 layers
// x 3 kv heads x 2048 keys, 94 MB: read from DRAM, as in a real decode;
// 2-core EPYC VM; docs/performance.md): 64 rows 10.9 / 7.5 ms on 1 / 2
// threads, 256 rows 10.5 / 5.6 ms, 1024 rows 9.8 / 9.7 ms (too few chunks
// left to split). Longer runs of rows keep the prefetchers streaming; a
// chunk's keys and values (64 KB each at head_dim 64) stay in L2 while its
// R query heads walk them.
constexpr int64_t kChunk = 256;

using cpu::add_scaled_elems;
using cpu::add_scaled_row;
using cpu::BF16Elems;
using cpu::dot_row;
using cpu::exp_nonpositive;
using cpu::F16Elems;
using cpu::F32Elems;
using cpu::kNegInf;
using cpu::sum8;

// One chunk of n <= kChunk rows for the R query heads of a group (row j
// stored as type[j], kernels/attention.h RowType). Writes
// w[r * ws + j] = exp(s_rj - mx[r]) (0 for hidden rows), mx[r], sum[r] and
// o[r * hd ..] = sum_j w_rj v_j. HD > 0 fixes head_dim at compile time so the
// value sum stays in registers; HD = 0 reads it from hd.
template <int HD>
inline __attribute__((always_inline)) void chunk_body(const float* q, int64_t R, int64_t hd,
                                                      const void* const* k, const void* const* v,
                                                      const RowType* type,
                                                      const unsigned char* visible, int64_t n,
                                                      float scale, float* w, int64_t ws, float* mx,
                                                      float* sum, float* o) {
  const int64_t D = HD > 0 ? HD : hd;
  for (int64_t r = 0; r < R; ++r) {
    const float* qr = q + r * D;
    float* wr = w + r * ws;
    float m = kNegInf;
    for (int64_t j = 0; j < n; ++j) {
      const float s = visible[j] ? dot_row(qr, k[j], type[j], D) * scale : kNegInf;
      wr[j] = s;
      m = std::max(m, s);
    }
    mx[r] = m;
    float* orow = o + r * D;
    if (m == kNegInf) {  // nothing visible in this chunk
      std::fill(wr, wr + n, 0.0f);
      std::fill(orow, orow + D, 0.0f);
      sum[r] = 0.0f;
      continue;
    }
    for (int64_t j = 0; j < n; ++j) wr[j] = exp_nonpositive(wr[j] - m);
    sum[r] = sum8(wr, n);
    if constexpr (HD > 0) {
      float acc[HD] = {};
      for (int64_t j = 0; j < n; ++j) {
        const float p = wr[j];
        if (p == 0.0f) continue;
        switch (type[j]) {  // the type outside the loop over d: it stays a vector loop
          case RowType::F32: add_scaled_elems<F32Elems>(acc, p, v[j], HD); break;
          case RowType::BF16: add_scaled_elems<BF16Elems>(acc, p, v[j], HD); break;
          case RowType::F16: add_scaled_elems<F16Elems>(acc, p, v[j], HD); break;
        }
      }
      std::copy(acc, acc + HD, orow);
    } else {
      std::fill(orow, orow + D, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float p = wr[j];
        if (p == 0.0f) continue;
        add_scaled_row(orow, p, v[j], type[j], D);
      }
    }
  }
}

// The chunk body per head_dim (each built for AVX2 and the baseline).
#define KVSCOPE_CHUNK_ARGS                                                                 \
  const float *q, int64_t R, int64_t hd, const void *const *k, const void *const *v,       \
      const RowType *type, const unsigned char *visible, int64_t n, float scale, float *w, \
      int64_t ws, float *mx, float *sum, float *o
KVSCOPE_CPU_CLONES void chunk_hd64(KVSCOPE_CHUNK_ARGS) {
  chunk_body<64>(q, R, hd, k, v, type, visible, n, scale, w, ws, mx, sum, o);
}
KVSCOPE_CPU_CLONES void chunk_hd128(KVSCOPE_CHUNK_ARGS) {
  chunk_body<128>(q, R, hd, k, v, type, visible, n, scale, w, ws, mx, sum, o);
}
KVSCOPE_CPU_CLONES void chunk_any(KVSCOPE_CHUNK_ARGS) {
  chunk_body<0>(q, R, hd, k, v, type, visible, n, scale, w, ws, mx, sum, o);
}
#undef KVSCOPE_CHUNK_ARGS

using ChunkFn = void (*)(const float*, int64_t, int64_t, const void* const*, const void* const*,
                         const RowType*, const unsigned char*, int64_t, float, float*, int64_t,
                         float*, float*, float*);

ChunkFn chunk_fn(int64_t hd) {
  return hd == 64 ? chunk_hd64 : hd == 128 ? chunk_hd128 : chunk_any;
}

// Where a chunk starts: segment index and row within it.
struct ChunkStart {
  size_t segment;
  int64_t row;
};

// Per head: total rows and the start of every chunk.
struct HeadPlan {
  int64_t rows = 0;
  int64_t first_item = 0;  // index of its first chunk among all items
  std::vector<ChunkStart> starts;
};

HeadPlan plan_head(const std::vector<Segment>& segments, int64_t first_item) {
  HeadPlan p;
  p.first_item = first_item;
  int64_t row = 0;  // global row of the segment's first row
  for (size_t s = 0; s < segments.size(); ++s) {
    // The chunk starts that fall in this segment.
    for (int64_t c = (row + kChunk - 1) / kChunk * kChunk; c < row + segments[s].rows; c += kChunk)
      p.starts.push_back({s, c - row});
    row += segments[s].rows;
  }
  p.rows = row;
  return p;
}

// Scores, weights and value sums of one chunk (item) of one head. The
// partial results go to part: mx [R], sum [R], o [R * hd].
void run_chunk(const DecodeHead& h, const HeadPlan& plan, int64_t c, int64_t R, int64_t hd,
               int64_t q_pos, float scale, int64_t window, float* part) {
  const int64_t c0 = c * kChunk, n = std::min(kChunk, plan.rows - c0);
  const void* k[kChunk];
  const void* v[kChunk];
  RowType type[kChunk];
  unsigned char visible[kChunk];
  size_t s = plan.starts[size_t(c)].segment;
  int64_t row = plan.starts[size_t(c)].row;
  for (int64_t j = 0; j < n; ++j, ++row) {
    while (row >= (*h.segments)[s].rows) ++s, row = 0;  // empty segments too
    const Segment& seg = (*h.segments)[s];
    const int64_t offset = row * seg.stride * row_type_bytes(seg.type);
    k[j] = static_cast<const char*>(seg.k) + offset;
    v[j] = static_cast<const char*>(seg.v) + offset;
    type[j] = seg.type;
    visible[j] = key_visible(h.key_pos[c0 + j], q_pos, window) ? 1 : 0;
  }
  // Weights go straight to probs when asked for (rescaled in the combine).
  thread_local std::vector<float> scratch;
  float* w;
  int64_t ws;
  if (h.probs) {
    w = h.probs + c0;
    ws = plan.rows;
  } else {
    scratch.resize(size_t(R * kChunk));
    w = scratch.data();
    ws = kChunk;
  }
  chunk_fn(hd)(h.q, R, hd, k, v, type, visible, n, scale, w, ws, part, part + R, part + 2 * R);
}

// Combines the chunks of one head in order (see the top of the file).
void combine_head(const DecodeHead& h, const HeadPlan& plan, int64_t R, int64_t hd,
                  const float* parts) {
  const int64_t chunks = int64_t(plan.starts.size()), stride = R * (hd + 2);
  std::vector<float> f(static_cast<size_t>(chunks));
  for (int64_t r = 0; r < R; ++r) {
    float* out = h.out + r * hd;
    float M = kNegInf;
    for (int64_t c = 0; c < chunks; ++c) M = std::max(M, parts[c * stride + r]);
    std::fill(out, out + hd, 0.0f);
    if (M == kNegInf) continue;  // no visible key: zeros (weights are 0 already)
    float L = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* part = parts + c * stride;
      f[size_t(c)] = part[r] == kNegInf ? 0.0f : std::exp(part[r] - M);
      L += part[R + r] * f[size_t(c)];
      const float* o = part + 2 * R + r * hd;
      for (int64_t d = 0; d < hd; ++d) out[d] += f[size_t(c)] * o[d];
    }
    const float inv = 1.0f / L;
    for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
    if (!h.probs) continue;
    for (int64_t c = 0; c < chunks; ++c) {
      float* p = h.probs + r * plan.rows + c * kChunk;
      const float g = f[size_t(c)] * inv;
      for (int64_t j = 0, n = std::min(kChunk, plan.rows - c * kChunk); j < n; ++j) p[j] *= g;
    }
  }
}

}  // namespace

void attention_decode_heads(const DecodeHead* heads, int64_t n_heads, int64_t R, int64_t hd,
                            int64_t q_pos, double scale, int64_t window) {
  KVSCOPE_CHECK(n_heads >= 0 && R > 0 && hd > 0, "attention_decode_heads: empty head shape");
  for (int64_t h = 0; h < n_heads; ++h) {
    const DecodeHead& d = heads[h];
    KVSCOPE_CHECK(d.q && d.out && d.segments,
                  "attention_decode_heads: a head without q, out or rows");
    for (const Segment& s : *d.segments)
      KVSCOPE_CHECK(s.rows >= 0 && (s.rows == 0 || (s.k && s.v && s.stride >= hd)),
                    "attention_decode_heads: a segment's rows are not whole rows of head_dim");
  }
  std::vector<HeadPlan> plans;
  int64_t items = 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    plans.push_back(plan_head(*heads[h].segments, items));
    items += int64_t(plans.back().starts.size());
  }
  const int64_t stride = R * (hd + 2);  // one chunk's partial results
  std::vector<float> parts(size_t(items * stride));
  const float sc = static_cast<float>(scale);
  auto item = [&](int64_t i) {
    // The head whose chunks hold item i (heads are few: a linear walk).
    int64_t h = 0;
    while (h + 1 < n_heads && plans[size_t(h + 1)].first_item <= i) ++h;
    run_chunk(heads[h], plans[size_t(h)], i - plans[size_t(h)].first_item, R, hd, q_pos, sc, window,
              parts.data() + i * stride);
  };
  parallel_items(items, item);  // one chunk: on this thread
  for (int64_t h = 0; h < n_heads; ++h)
    combine_head(heads[h], plans[size_t(h)], R, hd,
                 parts.data() + plans[size_t(h)].first_item * stride);
}

void attention_decode_segments(const float* q, int64_t R, int64_t hd,
                               const std::vector<Segment>& segments, const int64_t* key_pos,
                               int64_t q_pos, double scale, int64_t window, float* out,
                               float* probs) {
  const DecodeHead head{q, &segments, key_pos, out, probs};
  attention_decode_heads(&head, 1, R, hd, q_pos, scale, window);
}

}  // namespace kvscope::kernels
