// ParallelChunks: a loop over chunks of work on XLA's intra-op thread pool, for the FFI handlers of the
// native neuron kernels (neuron_ffi.cc), the sparse-input convolution (snnjax/layers/sparse_conv.cc) and the
// convolution benchmark (snnjax/bench/onednn_conv.cc).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace snnjax {

// Runs fn(chunk, scratch) for chunk in [0, chunks) on the calling thread and up to
// pool.num_threads() - 1 pool tasks, returning when every chunk is done; each worker
// allocates its scratch (scratch_size values, uninitialised) once. Tasks that start late
// find no chunk left and touch only the shared counters.
template <typename F, typename Fn>
void ParallelChunks(xla::ffi::ThreadPool& pool, int64_t chunks, int64_t scratch_size, Fn fn) {
  struct State {
    std::atomic<int64_t> next{0};
    int64_t done = 0;
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto work = [state, chunks, scratch_size, fn]() mutable {
    int64_t mine = 0;
    std::unique_ptr<F[]> scratch;
    for (int64_t c; (c = state->next.fetch_add(1)) < chunks; ++mine) {
      if (!scratch) scratch.reset(new F[scratch_size]);
      fn(c, scratch.get());
    }
    if (mine == 0) return;
    std::lock_guard<std::mutex> lock(state->mu);
    state->done += mine;
    if (state->done == chunks) state->cv.notify_all();
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), chunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(work)(work));
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done == chunks; });
}

}  // namespace snnjax
