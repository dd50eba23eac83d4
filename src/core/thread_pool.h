// The host thread pool behind tefl_host_services.parallel_for: one fork-join
// job at a time; a call made while the pool is busy (another thread, or a
// nested call from a chunk) runs inline on the caller, so it never blocks or
// deadlocks. Chunk boundaries depend only on (n, grain, num_threads), never on
// timing. Size: TEFL_NUM_THREADS, else the hardware concurrency. After fork()
// the child recreates its workers on first use.
#ifndef TEFL_SRC_CORE_THREAD_POOL_H_
#define TEFL_SRC_CORE_THREAD_POOL_H_

#include <cstdint>

#include "tefl/tefl.h"

namespace tefl {

int ThreadPoolSize();
void ParallelFor(int64_t n, int64_t grain, tefl_parallel_body_fn body, void* ctx);

template <typename F>
void ParallelFor(int64_t n, int64_t grain, F&& f) {
  auto tramp = [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); };
  ParallelFor(n, grain, +tramp, static_cast<void*>(&f));
}

}  // namespace tefl

#endif  // TEFL_SRC_CORE_THREAD_POOL_H_
