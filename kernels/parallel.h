// The CPU kernels' own worker threads.
//
// Debian's LibTorch runs its matrix products on OpenBLAS, whose pthreads build
// keeps a pool of its own; LibTorch's pool must then stay at one thread (two
// spinning pools on the same cores stall each other, see
// generate::set_threads). The attention kernels split their work over these
// workers instead: decode attention by chunks of keys, prefill attention by
// (kv head, query block) with OpenBLAS set to one thread meanwhile. Idle
// workers sleep on a condition variable, so they never take a core from
// OpenBLAS's workers.
//
// Work is a count of independent items claimed dynamically by the calling
// thread and the workers. Callers make each item's result independent of
// which thread runs it and combine results in item order, so the numbers do
// not depend on the thread count or on scheduling.
#pragma once

#include <cstdint>
#include <functional>

namespace kvscope::kernels {

// Threads the kernels use, the caller's included (1: the caller alone).
void set_kernel_threads(int threads);
int kernel_threads();

// Runs item(i) for every i in [0, n) and returns when all have run. Items
// run under the caller's LibTorch thread-local state (grad mode, inference
// mode) and keep any scratch memory thread_local. A call from inside an item,
// or while another thread's call is running, runs its items serially on the
// calling thread. An exception thrown by an item is rethrown here (the first
// one; the items not yet claimed are skipped).
void parallel_items(int64_t n, const std::function<void(int64_t item)>& item);

// OpenBLAS's own pool, when LibTorch's BLAS is OpenBLAS (found at run time:
// Debian's LibTorch links it, an MKL LibTorch does not).
int blas_threads();                  // 0 without OpenBLAS
void set_blas_threads(int threads);  // no-op without OpenBLAS
bool blas_uses_openmp();             // its OpenMP build, which shares LibTorch's pool

// Sets OpenBLAS's thread count for a scope (kernels that run one product per
// kernel thread at once), and restores it. The count is process-wide: one
// caller at a time (as parallel_items runs one job at a time).
class BlasThreadsScope {
 public:
  explicit BlasThreadsScope(int threads) : saved_(blas_threads()) {
    if (saved_ > 0) set_blas_threads(threads);
  }
  ~BlasThreadsScope() {
    if (saved_ > 0) set_blas_threads(saved_);
  }
  BlasThreadsScope(const BlasThreadsScope&) = delete;
  BlasThreadsScope& operator=(const BlasThreadsScope&) = delete;

 private:
  int saved_;
};

}  // namespace kvscope::kernels
