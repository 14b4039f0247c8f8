// What one run may allocate: sizes read from a file or typed on the command
// line are turned into a byte estimate and checked here before anything is
// allocated, so an absurd size ends in a clear error (exit 2) instead of
// std::bad_alloc after gigabytes of work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kvscope {

// Physical memory of this machine, in bytes.
int64_t physical_memory_bytes();

// The most one run may take: three quarters of physical memory (the rest is
// the operating system's, the model's file cache and the GUI's).
int64_t run_memory_limit_bytes();

// "11.7 GiB", "512 MiB", "4.0 KiB".
std::string format_bytes(double bytes);

// What this process can still get: MemAvailable of /proc/meminfo, and the
// soft RLIMIT_AS (ulimit -v) it runs under; -1 when unknown / unlimited.
int64_t available_memory_bytes();
int64_t address_space_limit_bytes();

// What an out-of-memory message suggests, host or device.
inline constexpr const char* kLessMemoryAdvice =
    "a shorter --prefill-chunk, a shorter run or bf16/fp16 weights need less";

// "this machine has 2.1 GiB of its 23.5 GiB available; ulimit -v caps this
// process at 2.9 GiB of address space": what an out-of-memory error says
// is there, next to what was asked.
std::string host_memory_situation();

// LibTorch's CPU allocator failing ("DefaultCPUAllocator: can't allocate
// memory: you tried to allocate N bytes ...") read into a message that says
// what was asked, what is there and what needs less; nullopt for any other
// message.
std::optional<std::string> explain_host_allocation_failure(const std::string& libtorch_message);

// Throws InputError(file, field, ...) when `bytes` exceeds
// run_memory_limit_bytes(); `what` says what needs the memory.
void check_fits_in_memory(const std::string& file, const std::string& field, double bytes,
                          const std::string& what);

}  // namespace kvscope
