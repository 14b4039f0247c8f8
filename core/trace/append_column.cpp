#include "core/trace/append_column.h"

#include "core/trace/error.h"

namespace kvscope::trace {

void AppendColumn::write(const std::string& trace_path) {
  const size_t rows = pending_rows();
  if (rows == 0) return;
  const auto io_fail = [&] {
    throw TraceError(ErrorCode::Io, trace_path, path, h5::take_error_message());
  };
  std::vector<hsize_t> dims = h5::extent(dset.get());
  const hsize_t start0 = rows_on_disk;
  dims[0] = start0 + rows;
  if (H5Dset_extent(dset.get(), dims.data()) < 0) io_fail();
  h5::Handle fspace = h5::dataspace(H5Dget_space(dset.get()));
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = start0;
  count[0] = rows;
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  h5::Handle mspace =
      h5::dataspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  if (H5Dwrite(dset.get(), h5::memory_type(elem), mspace.get(), fspace.get(), H5P_DEFAULT,
               pending.data()) < 0)
    io_fail();
  rows_on_disk = dims[0];
  pending.clear();
}

void TableColumns::push(const void* row) const {
  unsigned char element[8];
  for (size_t c = 0; c < columns.size(); ++c) {
    spec->columns[c].store(row, element);
    columns[c]->push_element(element);
  }
}

}  // namespace kvscope::trace
