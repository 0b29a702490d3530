//===- ThreadPool.cpp - A small persistent pool for parallel loops --------===//
#include "cpu/ThreadPool.h"

#include <algorithm>

namespace pagedc::cpu {

/// Set on pool workers and on a caller while it runs a loop, so that nested
/// loops run inline instead of waiting on themselves.
static thread_local bool insideLoop = false;

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread &worker : workers_)
    worker.join();
}

ThreadPool &ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

int ThreadPool::resolveThreads(int threads) {
  if (threads > 0)
    return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

void ThreadPool::runItems(int worker) {
  for (;;) {
    int64_t index = next_.fetch_add(1, std::memory_order_relaxed);
    if (index >= count_)
      return;
    try {
      (*body_)(index, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_)
        error_ = std::current_exception();
      next_.store(count_, std::memory_order_relaxed); // stop handing out work
    }
  }
}

void ThreadPool::workerLoop(int id, uint64_t seenGeneration) {
  insideLoop = true;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seenGeneration; });
    if (stop_)
      return;
    seenGeneration = generation_;
    if (id > helpers_)
      continue;
    lock.unlock();
    runItems(id);
    lock.lock();
    if (--pending_ == 0)
      done_.notify_all();
  }
}

void ThreadPool::parallelFor(int64_t count, int threads, const Body &body) {
  if (count <= 0)
    return;
  int64_t useThreads = std::min<int64_t>(resolveThreads(threads), count);
  if (useThreads == 1 || insideLoop) {
    for (int64_t index = 0; index < count; ++index)
      body(index, 0);
    return;
  }

  std::lock_guard<std::mutex> submit(submitMutex_);
  int helpers = static_cast<int>(useThreads) - 1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (static_cast<int>(workers_.size()) < helpers) {
      int id = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, id, generation = generation_] {
        workerLoop(id, generation);
      });
    }
    body_ = &body;
    count_ = count;
    next_.store(0, std::memory_order_relaxed);
    helpers_ = helpers;
    pending_ = helpers;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();

  insideLoop = true;
  runItems(0);
  insideLoop = false;

  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  body_ = nullptr;
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

} // namespace pagedc::cpu
