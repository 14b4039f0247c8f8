// What one run may allocate: sizes read from a file or typed on the command
// line are turned into a byte estimate and checked here before anything is
// allocated, so an absurd size ends in a clear error (exit 2) instead of
// std::bad_alloc after gigabytes of work.
#pragma once

#include <cstdint>
#include <string>

namespace kvscope {

// Physical memory of this machine, in bytes.
int64_t physical_memory_bytes();

// The most one run may take: three quarters of physical memory (the rest is
// the operating system's, the model's file cache and the GUI's).
int64_t run_memory_limit_bytes();

// "11.7 GiB", "512 MiB", "4.0 KiB".
std::string format_bytes(double bytes);

// Throws InputError(file, field, ...) when `bytes` exceeds
// run_memory_limit_bytes(); `what` says what needs the memory.
void check_fits_in_memory(const std::string& file, const std::string& field, double bytes,
                          const std::string& what);

}  // namespace kvscope
