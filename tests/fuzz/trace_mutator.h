// The structure-aware mutator of the two trace targets (docs/fuzzing.md).
//
// A trace is HDF5 with checksummed metadata (superblock v2+, object headers
// v2, B-trees v2): a flipped byte mostly stops at a checksum error, so byte
// mutations alone rarely reach the reader's own checks. This mutator opens
// the input as a file image with HDF5's core driver and makes one mutation
// through the HDF5 API, which rewrites the checksums:
//   - one element of a dataset, or one value of an attribute, set to an
//     extreme (-1, 0, 1, INT_MAX, INT_MIN, the type's maximum, NaN, +-inf,
//     1e300, ...);
//   - a chunked dataset resized (0, 1, halved, grown, 2^31, its maximum);
//   - a dataset, group or attribute deleted;
//   - an attribute replaced by one of another type or shape (integer <->
//     float <-> string, scalar <-> array);
//   - two datasets swapped;
//   - a string attribute truncated (or given invalid UTF-8);
//   - a dataset replaced by a small one of another type or rank.
// It falls back to libFuzzer's byte mutations part of the time, and always
// when the input does not open as HDF5 (or holds global heap collections
// HDF5 1.10 would crash on: see core/trace/heap_checked_driver.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvscope::fuzz {

// The targets call this for every input the trace reader opened: the mutator
// only hands HDF5's (unchecked) core driver files the checked reader took (or
// that it wrote itself), and does so in a forked child, so a crash inside
// HDF5 cannot happen in the mutator instead of the target.
void note_trace_opened(const uint8_t* data, size_t size);

// One API-level mutation of an HDF5 file image in place; returns the new
// size, or 0 when it could not mutate (the caller falls back to bytes).
size_t mutate_hdf5_image(uint8_t* data, size_t size, size_t max_size, unsigned seed);

}  // namespace kvscope::fuzz
