#include "core/trace/attention_maps.h"

#include <algorithm>

#include "core/trace/error.h"
#include "core/trace/h5.h"
#include "core/trace/half.h"

namespace kvscope::trace {

void AttentionMaps::init(std::string trace_path, const CaptureLayout& capture_layout,
                         int64_t layers, int64_t heads, int64_t n_key_blocks) {
  path = std::move(trace_path);
  layout = capture_layout;
  L = layers;
  H = heads;
  key_blocks = n_key_blocks;
}

void AttentionMaps::fail(const std::string& field, const std::string& what) const {
  throw TraceError(ErrorCode::Usage, path, field, what);
}

void AttentionMaps::io_fail(const std::string& field) const {
  throw TraceError(ErrorCode::Io, path, field, h5::take_error_message());
}

void AttentionMaps::queue_pooled(const PooledRow& row) {
  if (layout.pooled_block <= 0) fail("/attention/pooled", "layout has no pooled level");
  int64_t kb = key_blocks;
  if (row.layer < 0 || row.layer >= L) fail("/attention/pooled", "layer out of range");
  if (row.query_block < 0 || row.query_block >= kb)
    fail("/attention/pooled", "query block out of range");
  if (static_cast<int64_t>(row.max.size()) != H * kb ||
      static_cast<int64_t>(row.mean.size()) != H * kb)
    fail("/attention/pooled", "row must hold H * key_blocks values");
  pending_pooled[{row.layer, row.query_block}] = row;
}

void AttentionMaps::queue_dense(const DenseRow& row, int64_t tokens_fed) {
  if (row.head_index < 0 || row.head_index >= static_cast<int32_t>(layout.dense_heads.size()))
    fail("/attention/dense/weight", "head index out of range");
  if (row.token < 0 || row.token >= tokens_fed)
    fail("/attention/dense/weight", "query token not yet fed");
  if (static_cast<int64_t>(row.weight.size()) != layout.max_tokens)
    fail("/attention/dense/weight", "row must hold max_tokens values");
  pending_dense.push_back(row);
}

void AttentionMaps::write_pooled(hid_t dmax, hid_t dmean) {
  if (pending_pooled.empty()) return;
  hsize_t kb = static_cast<hsize_t>(key_blocks);
  hsize_t need = pooled_blocks_on_disk;
  for (auto& [key, row] : pending_pooled) need = std::max<hsize_t>(need, hsize_t(key.second) + 1);
  if (need > pooled_blocks_on_disk) {
    hsize_t dims[4] = {hsize_t(L), hsize_t(H), need, kb};
    if (H5Dset_extent(dmax, dims) < 0 || H5Dset_extent(dmean, dims) < 0)
      io_fail("/attention/pooled");
    pooled_blocks_on_disk = need;
  }
  std::vector<uint16_t> half;
  for (auto& [key, row] : pending_pooled) {
    // Keys never come after the queries of the block: write key blocks
    // 0..qb only, so chunks above the diagonal are never allocated.
    hsize_t nk = std::min<hsize_t>(kb, hsize_t(key.second) + 1);
    hsize_t start[4] = {hsize_t(key.first), 0, hsize_t(key.second), 0};
    hsize_t count[4] = {1, hsize_t(H), 1, nk};
    half.resize(static_cast<size_t>(H * nk));
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& src = which == 0 ? row.max : row.mean;
      hid_t d = which == 0 ? dmax : dmean;
      for (hsize_t h = 0; h < hsize_t(H); ++h)
        for (hsize_t k = 0; k < nk; ++k) half[h * nk + k] = float_to_half(src[h * kb + k]);
      h5::Handle fspace = h5::dataspace(H5Dget_space(d));
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      h5::Handle mspace = h5::dataspace(H5Screate_simple(4, count, nullptr));
      if (H5Dwrite(d, h5::memory_type(Elem::F16), mspace.get(), fspace.get(), H5P_DEFAULT,
                   half.data()) < 0)
        io_fail("/attention/pooled");
    }
  }
  pending_pooled.clear();
}

void AttentionMaps::write_dense(hid_t d) {
  if (pending_dense.empty()) return;
  hsize_t need = dense_tokens_on_disk;
  for (const DenseRow& row : pending_dense) need = std::max<hsize_t>(need, hsize_t(row.token) + 1);
  hsize_t m = static_cast<hsize_t>(layout.max_tokens);
  if (need > dense_tokens_on_disk) {
    hsize_t dims[3] = {hsize_t(layout.dense_heads.size()), need, m};
    if (H5Dset_extent(d, dims) < 0) io_fail("/attention/dense/weight");
    dense_tokens_on_disk = need;
  }
  h5::Handle fspace = h5::dataspace(H5Dget_space(d));
  h5::Handle mspace = h5::dataspace(H5Screate_simple(1, &m, nullptr));
  for (const DenseRow& row : pending_dense) {
    hsize_t start[3] = {hsize_t(row.head_index), hsize_t(row.token), 0};
    hsize_t count[3] = {1, 1, m};
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    if (H5Dwrite(d, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, row.weight.data()) <
        0)
      io_fail("/attention/dense/weight");
  }
  pending_dense.clear();
}

}  // namespace kvscope::trace
