#include "core/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "core/logging.h"

namespace tefl {
namespace {

class Pool {
 public:
  explicit Pool(int size) : size_(size) {
    for (int i = 1; i < size_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true, std::memory_order_relaxed);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return size_; }

  // Caller holds busy_. Returns when every chunk ran and no worker still
  // references the job (it lives on this stack frame).
  void Run(int64_t n, int64_t chunk, tefl_parallel_body_fn body, void* ctx) {
    Job job{body, ctx, n, chunk, (n + chunk - 1) / chunk};
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    cv_.notify_all();
    Work(&job);
    auto done = [&] {
      return job.finished.load(std::memory_order_acquire) == job.chunks &&
             job.active_workers.load(std::memory_order_acquire) == 0;
    };
    SpinUntil(done);
    std::unique_lock<std::mutex> lock(mu_);
    job_ = nullptr;
    done_cv_.wait(lock, done);
  }

  std::mutex busy_;

 private:
  struct Job {
    tefl_parallel_body_fn body;
    void* ctx;
    int64_t n, chunk, chunks;
    std::atomic<int64_t> next{0};
    // Written under mu_ (the condition variables' predicates); also read
    // without it while spinning.
    std::atomic<int64_t> finished{0};
    std::atomic<int> active_workers{0};
  };

  // Spins (with a pause) until pred() or about kSpinMicros have passed.
  // Successive kernels are back to back in a training step: a thread that
  // stays awake that long takes the next job without the futex wake-up and
  // reschedule (tens of microseconds on this VM, more than a small kernel),
  // as OpenMP runtimes do (GOMP_SPINCOUNT, KMP_BLOCKTIME). After that it
  // blocks on the condition variable and costs nothing.
  static constexpr int kSpinMicros = 100;
  template <class Pred>
  static bool SpinUntil(Pred pred) {
    if (pred()) return true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    for (;;) {
      for (int i = 0; i < 32; ++i) {
        if (pred()) return true;
        CpuRelax();
      }
      if (std::chrono::steady_clock::now() >= deadline) return pred();
    }
  }
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  void Work(Job* job) {
    int64_t finished = 0;
    for (;;) {
      const int64_t c = job->next.fetch_add(1, std::memory_order_relaxed);
      if (c >= job->chunks) break;
      const int64_t b = c * job->chunk;
      job->body(job->ctx, b, std::min(job->n, b + job->chunk));
      ++finished;
    }
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t total = job->finished.load(std::memory_order_relaxed) + finished;
    job->finished.store(total, std::memory_order_release);
    if (total == job->chunks) done_cv_.notify_all();
  }
  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      Job* job = nullptr;
      SpinUntil(
          [&] { return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_.load(std::memory_order_relaxed) || generation_.load() != seen; });
        if (stop_.load(std::memory_order_relaxed)) return;
        seen = generation_.load(std::memory_order_relaxed);
        job = job_;
        if (job == nullptr) continue;  // that job already completed
        job->active_workers.store(job->active_workers.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      }
      Work(job);
      std::lock_guard<std::mutex> lock(mu_);
      const int active = job->active_workers.load(std::memory_order_relaxed) - 1;
      job->active_workers.store(active, std::memory_order_release);
      if (active == 0) done_cv_.notify_all();
    }
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  // Written under mu_; also read without it while spinning.
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};
  Job* job_ = nullptr;  // the job in progress, guarded by mu_
};

int ConfiguredSize() {
  unsigned hc = std::thread::hardware_concurrency();
  const int fallback = hc ? int(hc) : 1;
  if (const char* v = std::getenv("TEFL_NUM_THREADS"); v && *v) {
    char* end = nullptr;
    errno = 0;
    long n = std::strtol(v, &end, 10);
    if (end && *end == '\0' && errno == 0 && n >= 1 && n <= 1024) return int(n);
    // Malformed: one WARNING naming the value (docs/env.md), then the default.
    TEFL_LOG(WARNING, "Ignoring TEFL_NUM_THREADS='{}': expected an integer 1..1024; using {} (hardware threads)", v,
             fallback);
  }
  return fallback;
}

std::mutex g_pool_mu;
std::atomic<Pool*> g_pool{nullptr};  // leaked at exit on purpose: workers may be mid-job
thread_local bool t_in_pool_job = false;

// fork(): hold g_pool_mu across it so the child never inherits it locked; the
// child cannot use the parent's workers (they do not exist there), so it
// abandons that pool and builds its own on first use.
void AtForkPrepare() { g_pool_mu.lock(); }
void AtForkParent() { g_pool_mu.unlock(); }
void AtForkChild() {
  g_pool.store(nullptr, std::memory_order_relaxed);
  g_pool_mu.unlock();
}

Pool* GetPool() {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr) return pool;  // the hot path: one load, no syscall, no lock
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(AtForkPrepare, AtForkParent, AtForkChild); });
  std::lock_guard<std::mutex> lock(g_pool_mu);
  pool = g_pool.load(std::memory_order_relaxed);
  if (pool == nullptr) {
    pool = new Pool(ConfiguredSize());
    g_pool.store(pool, std::memory_order_release);
  }
  return pool;
}

}  // namespace

int ThreadPoolSize() { return GetPool()->size(); }

void ParallelFor(int64_t n, int64_t grain, tefl_parallel_body_fn body, void* ctx) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  Pool* pool = GetPool();
  const int threads = pool->size();
  // One contiguous chunk per thread keeps each thread streaming its own rows.
  const int64_t chunk = std::max(grain, (n + threads - 1) / threads);
  if (threads == 1 || chunk >= n || t_in_pool_job || !pool->busy_.try_lock()) {
    body(ctx, 0, n);
    return;
  }
  t_in_pool_job = true;
  pool->Run(n, chunk, body, ctx);
  t_in_pool_job = false;
  pool->busy_.unlock();
}

}  // namespace tefl
