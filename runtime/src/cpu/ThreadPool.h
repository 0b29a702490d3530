//===- ThreadPool.h - A small persistent pool for parallel loops -*- C++ -*-===//
//
// The CPU kernels split their work into independent items and run them with
// parallelFor(). Workers persist between calls; one loop runs at a time and
// the calling thread takes part in it.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CPU_THREADPOOL_H
#define PAGEDC_RUNTIME_CPU_THREADPOOL_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pagedc::cpu {

class ThreadPool {
public:
  /// body(index, worker): worker is in [0, threads) and unique among the
  /// threads running at one time, so it can select per-thread scratch.
  using Body = std::function<void(int64_t index, int worker)>;

  ThreadPool() = default;
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;
  ~ThreadPool();

  /// The process-wide pool.
  static ThreadPool &global();

  /// Number of threads a request for `threads` gets (0 = hardware
  /// concurrency, at least 1).
  static int resolveThreads(int threads);

  /// Runs body(i, worker) for every i in [0, count) on at most `threads`
  /// threads (0 = hardware concurrency), dynamically scheduled in index
  /// order. Blocks until all are done and rethrows the first exception. A
  /// call from inside a running loop runs inline on its thread.
  void parallelFor(int64_t count, int threads, const Body &body);

private:
  void workerLoop(int id, uint64_t seenGeneration);
  void runItems(int worker);

  std::mutex submitMutex_; // one loop at a time
  std::mutex mutex_;       // guards the fields below
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;
  int helpers_ = 0; // workers 1..helpers_ take part in the current loop
  int pending_ = 0; // helpers not finished yet
  bool stop_ = false;
  const Body *body_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

} // namespace pagedc::cpu

#endif // PAGEDC_RUNTIME_CPU_THREADPOOL_H
