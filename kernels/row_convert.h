// Stored rows of 16-bit floats: float32 rows rounded into them (round to
// nearest even, as torch's .to(bfloat16 / float16) rounds) and widened back
// (exactly). The cache's pools and the dense cache store rows this way; the
// attention kernels widen as they read (kernels/attention.h, RowType).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <torch/types.h>

#include <cstdint>
#include <cstring>

#include "core/common/check.h"
#include "kernels/attention.h"

namespace kvscope::kernels {

// The tensor dtype of a row type, and back (float32, bfloat16, float16 only).
inline torch::ScalarType scalar_type_of(RowType t) {
  return t == RowType::BF16 ? torch::kBFloat16 : t == RowType::F16 ? torch::kHalf : torch::kFloat32;
}
inline RowType row_type_of(torch::ScalarType t) {
  KVSCOPE_CHECK(t == torch::kFloat32 || t == torch::kBFloat16 || t == torch::kHalf,
                "row_type_of: rows are float32, bfloat16 or float16");
  return t == torch::kBFloat16 ? RowType::BF16 : t == torch::kHalf ? RowType::F16 : RowType::F32;
}

// x [n] float32 into dst [n] of `type`.
inline void store_row(RowType type, const float* x, int64_t n, void* dst) {
  switch (type) {
    case RowType::F32: std::memcpy(dst, x, size_t(n) * 4); return;
    case RowType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = c10::detail::round_to_nearest_even(x[i]);
      return;
    }
    case RowType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = c10::detail::fp16_ieee_from_fp32_value(x[i]);
      return;
    }
  }
}

// src [n] of `type` into x [n] float32.
inline void load_row(RowType type, const void* src, int64_t n, float* x) {
  switch (type) {
    case RowType::F32: std::memcpy(x, src, size_t(n) * 4); return;
    case RowType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) x[i] = c10::detail::f32_from_bits(s[i]);
      return;
    }
    case RowType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) x[i] = c10::detail::fp16_ieee_to_fp32_value(s[i]);
      return;
    }
  }
}

// What a value reads back as after it was stored as `type` (policies see the
// stored values: docs/policies/README.md).
inline void round_row(RowType type, float* x, int64_t n) {
  if (type == RowType::F32) return;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    store_row(type, x + i, 1, &b);
    load_row(type, &b, 1, x + i);
  }
}

}  // namespace kvscope::kernels
