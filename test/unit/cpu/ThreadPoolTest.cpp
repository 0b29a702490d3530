//===- ThreadPoolTest.cpp - The CPU backend's thread pool -------------------===//
#include "cpu/ThreadPool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

using pagedc::cpu::ThreadPool;

namespace {

TEST(ThreadPool, RunsEveryIndexExactlyOnce) {
  ThreadPool pool;
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t count : {1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(count);
      std::vector<std::atomic<int>> workerUse(threads);
      pool.parallelFor(count, threads, [&](int64_t index, int worker) {
        hits[index].fetch_add(1);
        ASSERT_GE(worker, 0);
        ASSERT_LT(worker, threads);
        workerUse[worker].fetch_add(1);
      });
      for (int64_t i = 0; i < count; ++i)
        EXPECT_EQ(hits[i].load(), 1) << "index " << i << " threads " << threads;
    }
  }
}

TEST(ThreadPool, RethrowsTheFirstErrorAndStaysUsable) {
  ThreadPool pool;
  EXPECT_THROW(pool.parallelFor(100, 3,
                                [](int64_t index, int) {
                                  if (index == 42)
                                    throw std::runtime_error("item 42");
                                }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallelFor(100, 3, [&](int64_t index, int) { sum += index; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, NestedLoopsRunInline) {
  ThreadPool pool;
  std::atomic<int64_t> total{0};
  pool.parallelFor(4, 2, [&](int64_t, int) {
    pool.parallelFor(10, 2, [&](int64_t index, int) { total += index; });
  });
  EXPECT_EQ(total.load(), 4 * 45);
}

} // namespace
