// The CPU kernels' threads.
//
// The attention kernels split their work into items: decode attention by
// chunks of keys, prefill attention by (kv head, query block) with the BLAS
// set to one thread meanwhile. Which threads run them depends on where
// LibTorch runs its products. Debian's LibTorch runs them on OpenBLAS, whose
// pthreads build keeps a pool of its own; LibTorch's pool must then stay at
// one thread (two spinning pools on the same cores stall each other, see
// generate::set_threads) and the items run on workers of our own, which
// sleep on a condition variable when idle so they never take a core from
// OpenBLAS's workers. Where the products run on LibTorch's OpenMP pool (pip's
// torch: MKL and oneDNN; OpenBLAS's OpenMP build), the items run on that
// pool too.
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
// True when the BLAS keeps a thread pool apart from LibTorch's: OpenBLAS's
// pthreads build (Debian's libopenblas0-pthread). Its threads and LibTorch's
// must then not both be sized to the cores (generate::set_threads).
bool blas_has_own_pool();

// MKL's thread count for the calling thread (MKL_Set_Num_Threads_Local,
// found at run time: pip's LibTorch links MKL in and exports it). Returns the
// previous local count (0: MKL's global setting), or -1 without MKL.
int set_mkl_local_threads(int threads);

// Sets the BLAS's thread count for a scope (kernels that run one product per
// kernel thread at once, and need the same single-threaded products when
// they run on one thread), and restores it. OpenBLAS's count is
// process-wide: one caller at a time (as parallel_items runs one job at a
// time); MKL's is the calling thread's.
class BlasThreadsScope {
 public:
  explicit BlasThreadsScope(int threads)
      : saved_openblas_(blas_threads()), saved_mkl_(set_mkl_local_threads(threads)) {
    if (saved_openblas_ > 0) set_blas_threads(threads);
  }
  ~BlasThreadsScope() {
    if (saved_openblas_ > 0) set_blas_threads(saved_openblas_);
    if (saved_mkl_ >= 0) set_mkl_local_threads(saved_mkl_);
  }
  BlasThreadsScope(const BlasThreadsScope&) = delete;
  BlasThreadsScope& operator=(const BlasThreadsScope&) = delete;

 private:
  int saved_openblas_;
  int saved_mkl_;
};

}  // namespace kvscope::kernels
