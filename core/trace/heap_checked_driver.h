// A read-only HDF5 file driver that checks what HDF5 1.10 trusts blindly.
//
// Global heap collections (where variable-length strings live) carry no
// checksum, and HDF5 1.10.8 copies a heap object by the size written in the
// collection: one flipped bit there and H5Aread copies gigabytes or loops
// forever (seen: segfaults in H5HG_read under H5Aread of a string attribute).
// This driver reads the file with POSIX calls as HDF5's sec2 driver does and,
// for each global heap read (HDF5 passes them as raw data; they are recognised by
// their "GCOL" header), walks the collection as HDF5 is about to and refuses
// it (a read error HDF5 reports cleanly) when an object does not fit.
// Internal to core/trace.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>

namespace kvscope::trace::h5 {

// A new file-access property list that reads through the checked driver.
// The caller closes it.
hid_t checked_read_fapl();
// The same, reading a file image in memory instead (the fuzz targets, a trace
// held in memory): `data` must outlive every file opened through it.
hid_t checked_image_fapl(const void* data, size_t size);

// Whether a global heap collection image is safe for HDF5 to parse: header,
// then objects (index, refs, reserved, size, data padded to 8) that each fit
// inside the collection. `image` holds `size` bytes from the collection's
// start; a prefix shorter than the collection (HDF5's first, speculative
// read) has only its header checked. `length_bytes` is the file's "size of
// lengths" (8 in every file HDF5 writes by default).
bool global_heap_image_ok(const uint8_t* image, size_t size, unsigned length_bytes);

}  // namespace kvscope::trace::h5
