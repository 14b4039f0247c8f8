// Fixed-size pages of key and value rows for one memory tier, carved from one
// tensor, with a free list. A page holds page_rows key rows, then page_rows
// value rows; key rows may be narrower than value rows (a tier of keys with
// pruned channels, ThinK: only the kept channels are stored). Pages are handed to per-head caches;
// a page given back is reused, and when most of the pool is free it is compacted into a smaller
// tensor so the memory is really returned (bytes_reserved() drops).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/attention.h"

namespace kvscope::cache {

enum class RowFormat : uint8_t {
  F32,   // rows of hd float32 values
  Int4,  // 4-bit codes with per-group scale and minimum (kernels/quant_int4.h)
  BF16,  // rows of hd bfloat16 values (--kv-dtype bf16), widened as they are read
  F16,   // rows of hd IEEE half values (--kv-dtype fp16)
};

// Whether rows of the format are floats of some width (not INT4 codes).
inline bool is_float_format(RowFormat f) {
  return f != RowFormat::Int4;
}
// The kernels' element type of a float format.
kernels::RowType row_type(RowFormat f);
// "float32", "int4", "bfloat16", "float16" (the trace's /run tier_formats).
const char* row_format_name(RowFormat f);
// The float format storing a tensor dtype's values (float32, bfloat16, float16).
RowFormat float_format(torch::ScalarType dtype);

class KvPool {
 public:
  // Called when compaction moves a page: (owner tag, old page, new page).
  using Relocate = std::function<void(int64_t owner, int32_t from, int32_t to)>;

  // key_dim 0: keys as wide as values (head_dim). Narrower keys need float rows.
  KvPool(int64_t head_dim, int64_t page_rows, RowFormat format, int64_t initial_pages = 64,
         int64_t key_dim = 0);

  int32_t allocate(int64_t owner);  // grows the pool (doubling) when no page is free
  void release(int32_t page);
  // Compacts when at most a quarter of the pages are in use; relocate tells
  // owners where their pages went.
  void shrink_if_sparse(const Relocate& relocate);

  // Row access (F32 pools): k = 0 for keys, 1 for values.
  float* row(int32_t page, int kv, int64_t r);
  const float* row(int32_t page, int kv, int64_t r) const;
  // A row's bytes in any float format (row_type(format()) elements).
  const void* row_data(int32_t page, int kv, int64_t r) const;
  int64_t row_stride() const { return head_dim_; }  // of value rows; key rows: key_dim()
  // Int4 pools: codes and (scale, min) pairs of a row.
  uint8_t* codes(int32_t page, int kv, int64_t r);
  float* params(int32_t page, int kv, int64_t r);

  // k holds key_dim() floats, v head_dim(); 16-bit formats round them.
  void write_row(int32_t page, int64_t r, const float* k, const float* v);
  void read_row(int32_t page, int64_t r, float* k, float* v) const;  // dequantises, widens
  void copy_row(int32_t from_page, int64_t from_r, int32_t to_page, int64_t to_r);

  int64_t page_rows() const { return page_rows_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t key_dim() const { return key_dim_; }
  RowFormat format() const { return format_; }
  int64_t pages_in_use() const { return in_use_; }
  int64_t page_bytes() const;
  int64_t bytes_in_use() const { return in_use_ * page_bytes(); }
  int64_t bytes_reserved() const { return capacity_ * page_bytes(); }

  // Device mirror (--device cuda). The host pages stay the cache's truth:
  // policies, the recorder and the host kernels read them. A mirrored pool
  // keeps a twin tensor on `device` with the same page numbers; pages written
  // since the last sync_mirror() (write_row, copy_row, compaction) are copied
  // there before the device kernels read them, so an eviction costs no copy
  // and a step uploads only the pages it changed.
  void mirror_to(torch::Device device);
  bool mirrored() const { return mirror_.defined(); }
  void sync_mirror();
  // Device address of a page's key rows (kv 0) or value rows (kv 1): page_rows
  // rows of row_stride elements of row_type(format()) (float pools only).
  const void* mirror_rows(int32_t page, int kv) const;
  // The pages as one tensor, uint8 [capacity, page_bytes]: the host storage,
  // or its device mirror (undefined when not mirrored). For gathers of whole
  // pages by tensor ops (device_attention.cpp's blocked prefill).
  const torch::Tensor& host_pages() const { return storage_; }
  const torch::Tensor& mirror_pages() const { return mirror_; }
  int64_t pages_to_sync() const { return int64_t(dirty_list_.size()); }

 private:
  void grow(int64_t capacity);
  int64_t row_bytes(int kv) const;
  int64_t row_offset(int kv, int64_t r) const;
  uint8_t* at(int32_t page, int kv, int64_t r) const;  // a row's first byte
  void touch(int32_t page);                            // marks a page for the next sync_mirror

  int64_t head_dim_, key_dim_, page_rows_;
  RowFormat format_;
  int64_t initial_pages_;
  int64_t capacity_ = 0;
  int64_t in_use_ = 0;
  torch::Tensor storage_;  // uint8 [capacity, page_bytes]: key rows, then value rows
  std::vector<int32_t> free_;
  std::vector<int64_t> owner_;  // per page, -1 when free
  torch::Tensor mirror_;        // uint8 [capacity, page_bytes] on the device, or undefined
  std::vector<uint8_t> dirty_;  // per page: written since the last sync
  std::vector<int32_t> dirty_list_;
};

}  // namespace kvscope::cache
