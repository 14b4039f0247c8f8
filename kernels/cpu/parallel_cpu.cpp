#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <dlfcn.h>
#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "kernels/parallel.h"

namespace kvscope::kernels {

namespace {

// A symbol of a library already loaded into the process (OpenBLAS, MKL and
// libgomp come with LibTorch, which one depends on the build), or null.
template <typename Fn>
Fn library_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// True on a thread while it runs items (nested calls then run serially).
thread_local bool t_in_items = false;

class WorkerPool {
 public:
  ~WorkerPool() { resize(1); }

  int threads() {
    std::lock_guard<std::mutex> job(job_mutex_);
    return static_cast<int>(workers_.size()) + 1;
  }

  void resize(int threads) {
    std::lock_guard<std::mutex> job(job_mutex_);
    {
      std::lock_guard<std::mutex> lk(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
    workers_.clear();
    stop_ = false;
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  // Runs the items on this thread and the workers; false when the pool is
  // busy with another caller's items (the caller then runs them alone).
  bool run(int64_t n, const std::function<void(int64_t)>& item) {
    std::unique_lock<std::mutex> job(job_mutex_, std::try_to_lock);
    if (!job.owns_lock() || workers_.empty()) return false;
    const at::ThreadLocalState caller_state;  // grad mode, inference mode, ...
    {
      // Workers join a job only under mutex_, so once no worker is active
      // with the mutex held, none can be reading the fields written here.
      std::unique_lock<std::mutex> lk(mutex_);
      while (active_.load() != 0) {
        lk.unlock();
        sched_yield();
        lk.lock();
      }
      item_ = &item;
      state_ = &caller_state;
      n_ = n;
      next_.store(0);
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    claim_items(nullptr);
    // The workers that joined finish their last item. One joining later
    // claims nothing (all are claimed) and never calls item.
    while (active_.load(std::memory_order_acquire) != 0) sched_yield();
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  // Claims items until none is left. A worker passes the caller's LibTorch
  // thread-local state, entered once it has claimed an item: only then is
  // the caller still waiting for it, and the state (on its stack) alive.
  void claim_items(const at::ThreadLocalState* caller_state) {
    t_in_items = true;
    std::optional<at::ThreadLocalStateGuard> state;
    for (int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
      if (caller_state && !state) state.emplace(*caller_state);
      try {
        (*item_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);  // skip what is left
      }
    }
    t_in_items = false;
  }

  // Idle workers sleep. Polling instead (with sched_yield, for up to 2 ms
  // after a job) took the second core from OpenBLAS's worker during the
  // products: SmolLM2, 2048-token prompt, 5 alternating rounds, best / median
  // decode 32.6 / 28.8 tok/s polling against 35.3 / 32.8 sleeping, and
  // prefill no better. The wake-up latency is hidden: the caller starts on
  // the items at once and a late worker only takes fewer of them.
  void worker_loop() {
    std::unique_lock<std::mutex> lk(mutex_);
    uint64_t seen = generation_;
    for (;;) {
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      active_.fetch_add(1);
      // Items run under the caller's LibTorch thread-local state: tensors
      // made under InferenceMode, for one, may only be written under it.
      const at::ThreadLocalState* state = state_;
      lk.unlock();
      claim_items(state);
      active_.fetch_sub(1, std::memory_order_release);
      lk.lock();
    }
  }

  std::mutex job_mutex_;  // one job (and one resize) at a time
  std::mutex mutex_;      // workers join a job holding it; guards all below but active_, next_
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::atomic<int> active_{0};
  const std::function<void(int64_t)>* item_ = nullptr;
  const at::ThreadLocalState* state_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

WorkerPool& pool() {
  static WorkerPool p;
  return p;
}

// LibTorch's own pool is OpenMP (GNU libgomp) in every LibTorch we build
// against. Where its products run on that pool too (MKL or oneDNN, and
// OpenBLAS's OpenMP build), a second pool of our own would take the cores
// from it: OpenMP threads spin for a while after each region, and with pip's
// torch 2.15 our sleeping workers and its spinning ones cost the engine a
// quarter of its decode speed (docs/performance.md). So the items run on
// LibTorch's OpenMP threads. at::parallel_for cannot be used for that: its
// OpenMP implementation is a `#pragma omp parallel` in a header, which
// compiles to serial code without -fopenmp, and compiling with -fopenmp
// would link a runtime of the compiler's (clang: libomp) beside LibTorch's.
// GOMP_parallel, the entry point `#pragma omp parallel` compiles to (libgomp
// ABI GOMP_4.0), taken from the libgomp LibTorch loaded, runs on its pool.
using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);

GompParallel gomp_parallel() {
  static const auto fn = library_symbol<GompParallel>("GOMP_parallel");
  return fn;
}

struct OmpJob {
  const std::function<void(int64_t)>* item;
  int64_t n;
  std::atomic<int64_t> next{0};
  const at::ThreadLocalState* caller_state;
  std::mutex error_mutex;
  std::exception_ptr error;
};

// Every thread of the team, the caller's included, claims items until none
// is left; nothing may leave it by exception (OpenMP regions cannot unwind).
void omp_claim_items(void* data) {
  auto& job = *static_cast<OmpJob*>(data);
  const at::ThreadLocalStateGuard state(*job.caller_state);
  t_in_items = true;
  for (int64_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) {
    try {
      (*job.item)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.next.store(job.n);  // skip what is left
    }
  }
  t_in_items = false;
}

void run_on_libtorch_pool(int64_t n, int threads, const std::function<void(int64_t)>& item) {
  const at::ThreadLocalState caller_state;  // grad mode, inference mode, ...
  OmpJob job;
  job.item = &item;
  job.n = n;
  job.caller_state = &caller_state;
  gomp_parallel()(omp_claim_items, &job, static_cast<unsigned>(threads), 0);
  if (job.error) std::rethrow_exception(job.error);
}

// Our own workers beside OpenBLAS's pthreads pool (Debian's LibTorch), whose
// threads sleep when idle, and where no libgomp is loaded; LibTorch's OpenMP
// pool otherwise.
bool use_own_pool() {
  return blas_has_own_pool() || !gomp_parallel();
}

std::atomic<int> g_threads{1};

}  // namespace

void set_kernel_threads(int threads) {
  threads = threads < 1 ? 1 : threads;
  g_threads.store(threads);
  pool().resize(use_own_pool() ? threads : 1);
}

int kernel_threads() {
  return g_threads.load();
}

void parallel_items(int64_t n, const std::function<void(int64_t item)>& item) {
  if (n <= 0) return;
  if (n > 1 && !t_in_items) {
    if (!use_own_pool()) {
      // kernel_threads(), not LibTorch's count: a BlasThreadsScope may have
      // set MKL's to one for the caller meanwhile.
      const int threads = static_cast<int>(std::min<int64_t>(n, kernel_threads()));
      if (threads > 1 && !at::in_parallel_region()) {
        run_on_libtorch_pool(n, threads, item);
        return;
      }
    } else if (pool().run(n, item)) {
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) item(i);
}

int blas_threads() {
  static const auto get = library_symbol<int (*)()>("openblas_get_num_threads");
  return get ? get() : 0;
}

void set_blas_threads(int threads) {
  static const auto set = library_symbol<void (*)(int)>("openblas_set_num_threads");
  if (set) set(threads);
}

int set_mkl_local_threads(int threads) {
  // MKL_Set_Num_Threads_Local takes the count by value; the lower-case
  // mkl_set_num_threads_local exported beside it is the Fortran entry (a
  // pointer), as objdump of pip's libtorch_cpu.so shows.
  static const auto set = library_symbol<int (*)(int)>("MKL_Set_Num_Threads_Local");
  return set ? set(threads) : -1;
}

bool blas_has_own_pool() {
  return blas_threads() > 0 && !blas_uses_openmp();
}

bool blas_uses_openmp() {
  static const auto get = library_symbol<int (*)()>("openblas_get_parallel");
  constexpr int kOpenMp = 2;  // openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP
  return get && get() == kOpenMp;
}

}  // namespace kvscope::kernels
