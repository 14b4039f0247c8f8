#include "capture/cache/kv_pool.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/common/check.h"
#include "kernels/quant_int4.h"
#include "kernels/row_convert.h"

namespace kvscope::cache {

kernels::RowType row_type(RowFormat f) {
  KVSCOPE_CHECK(is_float_format(f), "row_type: INT4 rows are codes, not floats");
  return f == RowFormat::BF16  ? kernels::RowType::BF16
         : f == RowFormat::F16 ? kernels::RowType::F16
                               : kernels::RowType::F32;
}

RowFormat float_format(torch::ScalarType dtype) {
  const kernels::RowType t = kernels::row_type_of(dtype);
  return t == kernels::RowType::BF16  ? RowFormat::BF16
         : t == kernels::RowType::F16 ? RowFormat::F16
                                      : RowFormat::F32;
}

const char* row_format_name(RowFormat f) {
  switch (f) {
    case RowFormat::F32: return "float32";
    case RowFormat::Int4: return "int4";
    case RowFormat::BF16: return "bfloat16";
    case RowFormat::F16: return "float16";
  }
  return "?";
}

KvPool::KvPool(int64_t head_dim, int64_t page_rows, RowFormat format, int64_t initial_pages,
               int64_t key_dim)
    : head_dim_(head_dim),
      key_dim_(key_dim > 0 ? key_dim : head_dim),
      page_rows_(page_rows),
      format_(format),
      initial_pages_(initial_pages) {
  if (format == RowFormat::Int4 && head_dim % 2 != 0)
    throw std::invalid_argument("INT4 pool: head_dim must be even (two codes a byte)");
  if (key_dim_ > head_dim_ || (key_dim_ != head_dim_ && !is_float_format(format)))
    throw std::invalid_argument("KvPool: narrower key rows need float rows, at most head_dim wide");
  grow(initial_pages_);
}

int64_t KvPool::row_bytes(int kv) const {
  if (is_float_format(format_))
    return (kv == 0 ? key_dim_ : head_dim_) * kernels::row_type_bytes(row_type(format_));
  return kernels::int4_code_bytes(head_dim_) + kernels::int4_groups(head_dim_) * 2 * 4;
}

int64_t KvPool::page_bytes() const {
  return page_rows_ * (row_bytes(0) + row_bytes(1));
}

void KvPool::grow(int64_t capacity) {
  torch::Tensor next = torch::empty({capacity, page_bytes()}, torch::kUInt8);
  if (storage_.defined()) next.narrow(0, 0, capacity_).copy_(storage_);
  storage_ = next;
  if (mirrored()) {  // the twin grows on the device: its synced pages stay valid
    torch::Tensor twin = torch::empty({capacity, page_bytes()}, mirror_.options());
    twin.narrow(0, 0, capacity_).copy_(mirror_);
    mirror_ = twin;
  }
  owner_.resize(static_cast<size_t>(capacity), -1);
  dirty_.resize(static_cast<size_t>(capacity), 0);
  for (int64_t p = capacity - 1; p >= capacity_; --p) free_.push_back(static_cast<int32_t>(p));
  capacity_ = capacity;
}

int32_t KvPool::allocate(int64_t owner) {
  if (free_.empty()) grow(std::max<int64_t>(initial_pages_, capacity_ * 2));
  // Lowest-numbered free page last in free_: pages fill from the front.
  int32_t page = free_.back();
  free_.pop_back();
  owner_[static_cast<size_t>(page)] = owner;
  ++in_use_;
  return page;
}

void KvPool::release(int32_t page) {
  KVSCOPE_CHECK(page >= 0 && page < capacity_ && owner_[static_cast<size_t>(page)] >= 0,
                "KvPool: release of a page that is not in use");
  owner_[static_cast<size_t>(page)] = -1;
  free_.push_back(page);
  --in_use_;
}

void KvPool::shrink_if_sparse(const Relocate& relocate) {
  if (capacity_ <= initial_pages_ || in_use_ * 4 > capacity_) return;
  int64_t target = initial_pages_;
  while (target < in_use_ * 2) target *= 2;
  if (target >= capacity_) return;
  torch::Tensor next = torch::empty({target, page_bytes()}, torch::kUInt8);
  std::vector<int64_t> owners(static_cast<size_t>(target), -1);
  int32_t dst = 0;
  for (int32_t p = 0; p < capacity_; ++p) {
    int64_t owner = owner_[static_cast<size_t>(p)];
    if (owner < 0) continue;
    next[dst].copy_(storage_[p]);
    owners[static_cast<size_t>(dst)] = owner;
    if (p != dst) relocate(owner, p, dst);
    ++dst;
  }
  storage_ = next;  // the old tensor is freed here
  owner_ = std::move(owners);
  capacity_ = target;
  free_.clear();
  for (int64_t p = capacity_ - 1; p >= in_use_; --p) free_.push_back(static_cast<int32_t>(p));
  if (mirrored()) {  // pages moved: the smaller twin is filled again at the next sync
    mirror_ = torch::empty({capacity_, page_bytes()}, mirror_.options());
    dirty_.assign(static_cast<size_t>(capacity_), 0);
    dirty_list_.clear();
    for (int32_t p = 0; p < int32_t(in_use_); ++p) touch(p);
  }
}

void KvPool::touch(int32_t page) {
  if (!mirrored() || dirty_[size_t(page)]) return;
  dirty_[size_t(page)] = 1;
  dirty_list_.push_back(page);
}

void KvPool::mirror_to(torch::Device device) {
  KVSCOPE_CHECK(key_dim_ == head_dim_, "KvPool: only pools of whole keys are mirrored to a device");
  mirror_ =
      torch::empty({capacity_, page_bytes()}, torch::TensorOptions(torch::kUInt8).device(device));
  dirty_.assign(static_cast<size_t>(capacity_), 0);
  dirty_list_.clear();
  for (int32_t p = 0; p < int32_t(capacity_); ++p)
    if (owner_[size_t(p)] >= 0) touch(p);
}

void KvPool::sync_mirror() {
  if (!mirrored() || dirty_list_.empty()) return;
  const std::vector<int64_t> list(dirty_list_.begin(), dirty_list_.end());
  const torch::Tensor pages = torch::tensor(list, torch::kInt64);
  const torch::Tensor rows = storage_.index_select(0, pages);
  mirror_.index_copy_(0, pages.to(mirror_.device()), rows.to(mirror_.device()));
  for (int32_t p : dirty_list_) dirty_[size_t(p)] = 0;
  dirty_list_.clear();
}

const void* KvPool::mirror_rows(int32_t page, int kv) const {
  KVSCOPE_CHECK(is_float_format(format_),
                "KvPool::mirror_rows: the CUDA kernels read float pages only");
  return mirror_.data_ptr<uint8_t>() + int64_t(page) * page_bytes() + row_offset(kv, 0);
}

int64_t KvPool::row_offset(int kv, int64_t r) const {
  return kv == 0 ? r * row_bytes(0) : page_rows_ * row_bytes(0) + r * row_bytes(1);
}

float* KvPool::row(int32_t page, int kv, int64_t r) {
  KVSCOPE_CHECK(format_ != RowFormat::BF16 && format_ != RowFormat::F16,
                "KvPool::row: a 16-bit pool's rows are not float32 (row_data)");
  return reinterpret_cast<float*>(at(page, kv, r));
}

const float* KvPool::row(int32_t page, int kv, int64_t r) const {
  return const_cast<KvPool*>(this)->row(page, kv, r);
}

uint8_t* KvPool::at(int32_t page, int kv, int64_t r) const {
  return storage_.data_ptr<uint8_t>() + int64_t(page) * page_bytes() + row_offset(kv, r);
}

const void* KvPool::row_data(int32_t page, int kv, int64_t r) const {
  return at(page, kv, r);
}

uint8_t* KvPool::codes(int32_t page, int kv, int64_t r) {
  KVSCOPE_CHECK(format_ == RowFormat::Int4, "KvPool::codes: not an INT4 pool");
  return at(page, kv, r);
}

float* KvPool::params(int32_t page, int kv, int64_t r) {
  return reinterpret_cast<float*>(codes(page, kv, r) + kernels::int4_code_bytes(head_dim_));
}

void KvPool::write_row(int32_t page, int64_t r, const float* k, const float* v) {
  touch(page);
  if (is_float_format(format_)) {
    kernels::store_row(row_type(format_), k, key_dim_, at(page, 0, r));
    kernels::store_row(row_type(format_), v, head_dim_, at(page, 1, r));
  } else {
    kernels::quantize_int4(k, 1, head_dim_, codes(page, 0, r), params(page, 0, r));
    kernels::quantize_int4(v, 1, head_dim_, codes(page, 1, r), params(page, 1, r));
  }
}

void KvPool::read_row(int32_t page, int64_t r, float* k, float* v) const {
  KvPool* self = const_cast<KvPool*>(this);
  if (is_float_format(format_)) {
    kernels::load_row(row_type(format_), row_data(page, 0, r), key_dim_, k);
    kernels::load_row(row_type(format_), row_data(page, 1, r), head_dim_, v);
  } else {
    kernels::dequantize_int4(self->codes(page, 0, r), self->params(page, 0, r), 1, head_dim_, k);
    kernels::dequantize_int4(self->codes(page, 1, r), self->params(page, 1, r), 1, head_dim_, v);
  }
}

void KvPool::copy_row(int32_t from_page, int64_t from_r, int32_t to_page, int64_t to_r) {
  touch(to_page);
  for (int kv = 0; kv < 2; ++kv)
    std::memcpy(at(to_page, kv, to_r), at(from_page, kv, from_r), size_t(row_bytes(kv)));
}

}  // namespace kvscope::cache
