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

}  // namespace

void set_kernel_threads(int threads) {
  pool().resize(threads < 1 ? 1 : threads);
}

int kernel_threads() {
  return pool().threads();
}

void parallel_items(int64_t n, const std::function<void(int64_t item)>& item) {
  if (n <= 0) return;
  if (n > 1 && !t_in_items && pool().run(n, item)) return;
  for (int64_t i = 0; i < n; ++i) item(i);
}

namespace {

template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

int blas_threads() {
  static const auto get = openblas_symbol<int (*)()>("openblas_get_num_threads");
  return get ? get() : 0;
}

void set_blas_threads(int threads) {
  static const auto set = openblas_symbol<void (*)(int)>("openblas_set_num_threads");
  if (set) set(threads);
}

bool blas_uses_openmp() {
  static const auto get = openblas_symbol<int (*)()>("openblas_get_parallel");
  constexpr int kOpenMp = 2;  // openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP
  return get && get() == kOpenMp;
}

}  // namespace kvscope::kernels
