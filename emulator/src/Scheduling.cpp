//===- Scheduling.cpp - Blocks on fibers and the worker pool --------------===//
//
// How a launch runs: a pool of OS threads (workers) takes blocks from the
// launch; a worker runs a block with each CUDA thread on its own fiber,
// resuming runnable fibers until all finish, and explains a pass in which
// none could run as a deadlock; __syncthreads releases and the vector
// clocks' joins happen here. It is separate from the operations the
// kernels call (RuntimeTable.cpp, Hopper.cpp), which block and wake
// fibers through the state this scheduler resumes.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"
#include "pagedc-emu/Settings.h"

#include <cstdlib>
#include <optional>
#include <thread>

namespace pagedc::emu::detail {

//===----------------------------------------------------------------------===//
// Scheduling
//===----------------------------------------------------------------------===//

/// Threads [first, first + count) synchronize: each acquires what all of
/// them did so far (__syncthreads, a warpgroup collective).
void joinClocks(Worker &worker, unsigned first, unsigned count) {
  std::vector<uint32_t> joined(clockEntries(worker), 0);
  for (unsigned t = first; t < first + count; ++t)
    maxInto(joined, worker.threads[t].vc);
  for (unsigned t = first; t < first + count; ++t) {
    worker.threads[t].vc = joined;
    tick(worker, worker.threads[t]);
  }
}

void releaseBarrier(Worker &worker) {
  if (worker.live < worker.threadCount && worker.launch->checks.synccheck)
    report("synccheck",
           "__syncthreads at " + siteString(worker.barrierFile, worker.barrierLine) +
               " completed by " + std::to_string(worker.live) + " of " +
               std::to_string(worker.threadCount) +
               " threads: the others exited without reaching it (a barrier in divergent code)",
           siteString(worker.barrierFile, worker.barrierLine), 0, false);
  ++worker.counters.barriers;
  ++worker.epoch;
  worker.atBarrier = 0;
  if (worker.ordering)
    joinClocks(worker, 0, worker.threadCount);
  worker.barrierMismatch = false;
  for (unsigned w = 0; w < worker.warps.size(); ++w)
    flushWarpAccesses(worker, w);
  for (unsigned t = 0; t < worker.threadCount; ++t)
    if (worker.threads[t].state == State::AtBarrier)
      worker.threads[t].state = State::Runnable;
}

namespace {

/// A fiber's body: the kernel entry, then what its exit completes.
void threadMain(void *argument) {
  auto *thread = static_cast<Thread *>(argument);
  Worker &worker = *currentWorker;
  worker.launch->kernel->entry(worker.launch->parameterPointers.data());
  // Copies still in flight land when the thread exits.
  for (auto &group : thread->groups)
    landGroup(worker, *thread, group);
  thread->groups.clear();
  landGroup(worker, *thread, thread->openGroup);
  thread->openGroup.clear();
  if ((!thread->wgmmaGroups.empty() || !thread->wgmmaOpen.empty()) &&
      worker.launch->checks.synccheck)
    report("synccheck",
           "thread exits with wgmma.mma_async results not retired by a wgmma.wait_group "
           "(its accumulators never receive them)",
           "kernel exit", 0, false);
  thread->state = State::Finished;
  --worker.live;
  if (worker.atBarrier > 0 && worker.atBarrier == worker.live)
    releaseBarrier(worker);
  switchContext(thread->context, worker.scheduler);
  std::abort(); // a finished fiber is never resumed
}

/// Explains why no fiber of the block can run.
void reportDeadlock(Worker &worker) {
  for (unsigned w = 0; w < worker.warps.size(); ++w) {
    Warp &warp = worker.warps[w];
    if (warp.kind == Collective::None)
      continue;
    std::string others;
    for (unsigned lane = 0; lane < 32; ++lane) {
      unsigned t = w * 32 + lane;
      if (t >= worker.threadCount || !(warp.expected >> lane & 1) || (warp.arrived >> lane & 1))
        continue;
      Thread &thread = worker.threads[t];
      others += "; lane " + std::to_string(lane) + " " +
                (thread.state == State::Finished
                     ? std::string("has exited")
                     : "waits at " + siteString(thread.waitFile, thread.waitLine));
      break;
    }
    reportedThread = &worker.threads[w * 32 + __builtin_ctz(warp.arrived)];
    report("synccheck",
           std::string(collectiveName(warp.kind)) + " reached by lanes " +
               lanesString(warp.arrived) + " of warp " + std::to_string(w) +
               " only; it needs lanes " + lanesString(warp.expected) + others,
           siteString(warp.file, warp.line), 0, false);
  }
  if (worker.atBarrier > 0) {
    for (unsigned t = 0; t < worker.threadCount; ++t) {
      Thread &thread = worker.threads[t];
      if (thread.state == State::AtBarrier || thread.state == State::Finished)
        continue;
      reportedThread = &worker.threads[t];
      report("synccheck",
             "__syncthreads at " + siteString(worker.barrierFile, worker.barrierLine) +
                 " reached by " + std::to_string(worker.atBarrier) + " of " +
                 std::to_string(worker.live) + " threads; this thread waits at " +
                 siteString(thread.waitFile, thread.waitLine),
             siteString(thread.waitFile, thread.waitLine), 0, false);
      break;
    }
  }
  for (unsigned g = 0; g < worker.warpgroups.size(); ++g) {
    GroupRendezvous &group = worker.warpgroups[g];
    if (group.kind == Collective::None)
      continue;
    if (group.kind == Collective::Setmaxnreg && worker.registerWaiter[g] >= 0) {
      Thread &waiter = worker.threads[worker.registerWaiter[g]];
      // The PTX ISA returns registers to the CTA's pool only through
      // setmaxnreg.dec: a warp that exits keeps its count until the CTA ends,
      // so an .inc that would fit only with an exited warp's registers may
      // wait forever on hardware. They stay in use here, and the report says
      // how many such registers the .inc waits behind.
      uint64_t inUse = 0, heldByExited = 0;
      for (unsigned w = 0; w < worker.warpRegisters.size(); ++w) {
        inUse += uint64_t(worker.warpRegisters[w]) * 32;
        bool exited = true;
        for (unsigned t = 32 * w; t < std::min(worker.threadCount, 32 * w + 32); ++t)
          exited = exited && worker.threads[t].state == State::Finished;
        if (exited)
          heldByExited += uint64_t(worker.warpRegisters[w]) * 32;
      }
      reportedThread = &waiter;
      report("synccheck",
             "deadlock: setmaxnreg.inc " + std::to_string(waiter.maskArgument & 0xffffu) +
                 " of warpgroup " + std::to_string(g) +
                 " waits for registers no other warp frees: the CTA's pool is " +
                 std::to_string(worker.registerPool) + " registers (" +
                 std::to_string(worker.registerPool / worker.threadCount) +
                 " per thread at launch x " + std::to_string(worker.threadCount) + " threads), " +
                 std::to_string(inUse) + " in use, and the .inc needs " +
                 std::to_string(4 * 32 *
                                ((waiter.maskArgument & 0xffffu) - worker.warpRegisters[4 * g])) +
                 " more" +
                 (heldByExited ? "; " + std::to_string(heldByExited) +
                                     " of those in use are held by warps that have exited, "
                                     "which setmaxnreg never returns to the pool (only a "
                                     ".dec does: .dec them before the warps exit)"
                               : std::string()),
             siteString(group.file, group.line), 0, false);
      continue;
    }
    for (unsigned t = g * 128; t < std::min(worker.threadCount, g * 128 + 128); ++t) {
      Thread &thread = worker.threads[t];
      if (thread.state == State::AtCollective)
        continue;
      reportedThread = &thread;
      report("synccheck",
             std::string(collectiveName(group.kind)) + " reached by " +
                 std::to_string(group.arrived) + " of the 128 threads of warpgroup " +
                 std::to_string(g) + "; thread " + std::to_string(t) + " " +
                 (thread.state == State::Finished
                      ? std::string("has exited")
                      : "waits at " + siteString(thread.waitFile, thread.waitLine)),
             siteString(group.file, group.line), 0, false);
      break;
    }
  }
  std::vector<bool> explained(worker.mbarriers.size(), false);
  for (unsigned t = 0; t < worker.threadCount; ++t) {
    Thread &thread = worker.threads[t];
    if (thread.state == State::AtMbarrier && !explained[thread.waitBarrier]) {
      explained[thread.waitBarrier] = true;
      const MBarrier &barrier = worker.mbarriers[thread.waitBarrier];
      reportedThread = &thread;
      report("synccheck",
             "deadlock: waiting for the phase of parity " + std::to_string(thread.waitParity) +
                 " of the mbarrier at shared offset " + std::to_string(barrier.offset) +
                 ", which never completes: it is in its phase " + std::to_string(barrier.phase) +
                 " with " + std::to_string(barrier.pending) + " of " +
                 std::to_string(barrier.expected) + " arrivals pending and a tx-count of " +
                 std::to_string(barrier.tx) + " bytes",
             siteString(thread.waitFile, thread.waitLine), barrier.offset, false);
    }
  }
  for (unsigned id = 1; id < 16; ++id) {
    const NamedBarrier &named = worker.named[id];
    if (named.waiters.empty())
      continue;
    reportedThread = &worker.threads[named.waiters.front()];
    report("synccheck",
           "deadlock: bar.sync " + std::to_string(id) + " expects " +
               std::to_string(named.expected) + " threads, " + std::to_string(named.arrived) +
               " arrived",
           siteString(named.file, named.line), 0, false);
  }
  reportedThread = nullptr;
  worker.aborted = true;
  worker.launch->aborted = true;
}

/// Runs one block of the launch on the worker's fibers.
void runBlock(Worker &worker, uint64_t linearBlock) {
  Launch &launch = *worker.launch;
  const LaunchConfig &config = launch.config;
  worker.block[0] = static_cast<unsigned>(linearBlock % config.grid[0]);
  worker.block[1] = static_cast<unsigned>(linearBlock / config.grid[0] % config.grid[1]);
  worker.block[2] = static_cast<unsigned>(linearBlock / config.grid[0] / config.grid[1]);
  worker.blockTag = (uint64_t(launch.serial) << 32) | (linearBlock + 1);
  const unsigned threads = worker.threadCount;
  // Fresh shared memory: garbage contents, and a new block serial and epoch
  // so that no shadow entry of an earlier block counts.
  std::memset(worker.window.get(), 0xa5, worker.dynamicBytes);
  std::memset(worker.window.get() + launch.staticBase, 0xa5, staticLimit(worker));
  ++worker.blockSerial;
  ++worker.epoch;
  worker.blockEpoch = worker.epoch;
  worker.ordering = false;
  worker.mbarriers.clear();
  worker.manyReaders.clear();
  for (NamedBarrier &named : worker.named)
    named = NamedBarrier{};
  worker.warpgroups.assign((threads + 127) / 128, GroupRendezvous{});
  worker.registerWaiter.assign(worker.warpgroups.size(), -1);
  unsigned launchRegisters = config.launchRegisters;
  if (launchRegisters == 0)
    launchRegisters = boundedRegisters(threads, config.ctasPerSm);
  worker.warpRegisters.assign((threads + 31) / 32, launchRegisters);
  worker.registerPool = uint64_t(launchRegisters) * threads;
  worker.live = threads;
  worker.atBarrier = 0;
  worker.barrierMismatch = false;
  worker.aborted = false;
  for (Warp &warp : worker.warps)
    warp = Warp{};
  for (unsigned t = 0; t < threads; ++t) {
    Thread &thread = worker.threads[t];
    thread.linear = t;
    thread.warp = t / 32;
    thread.lane = t % 32;
    thread.state = State::Runnable;
    thread.index.thread_idx[0] = t % config.block[0];
    thread.index.thread_idx[1] = t / config.block[0] % config.block[1];
    thread.index.thread_idx[2] = t / config.block[0] / config.block[1];
    std::copy(worker.block, worker.block + 3, thread.index.block_idx);
    std::copy(config.block, config.block + 3, thread.index.block_dim);
    std::copy(config.grid, config.grid + 3, thread.index.grid_dim);
    thread.openGroup.clear();
    thread.groups.clear();
    thread.accesses.clear();
    thread.clock = 1;
    thread.vc.clear();
    thread.fenceClock = 0;
    thread.fenceEpoch = 0;
    thread.fencedVc.clear();
    thread.fenceHistory.clear();
    thread.waitBarrier = -1;
    thread.wgmmaFenced = false;
    thread.wgmmaD = nullptr;
    thread.wgmmaOpen.clear();
    thread.wgmmaGroups.clear();
    void *stack = worker.stacks.stack(t);
    thread.stackLow = reinterpret_cast<uintptr_t>(stack);
    thread.stackHigh = thread.stackLow + worker.stacks.stackBytes();
    makeContext(thread.context, stack, worker.stacks.stackBytes(), &threadMain, &thread);
  }
  worker.counters.blocks += 1;
  worker.counters.threads += threads;

  while (!worker.aborted) {
    bool ran = false, unfinished = false;
    for (unsigned t = 0; t < threads && !worker.aborted; ++t) {
      Thread &thread = worker.threads[t];
      if (thread.state == State::Finished)
        continue;
      unfinished = true;
      if (thread.state != State::Runnable)
        continue;
      currentThread = &thread;
      switchContext(worker.scheduler, thread.context);
      currentThread = nullptr;
      ran = true;
    }
    if (!unfinished || worker.aborted)
      break;
    if (!ran) {
      reportDeadlock(worker);
      break;
    }
    if (launch.aborted)
      break;
  }
  for (unsigned w = 0; w < worker.warps.size(); ++w)
    flushWarpAccesses(worker, w);
}

} // namespace

//===----------------------------------------------------------------------===//
// Worker pool
//===----------------------------------------------------------------------===//

namespace {

std::mutex poolMutex;
std::vector<std::unique_ptr<Worker>> &idleWorkers() {
  static std::vector<std::unique_ptr<Worker>> workers;
  return workers;
}

std::unique_ptr<Worker> takeWorker() {
  std::lock_guard<std::mutex> lock(poolMutex);
  auto &idle = idleWorkers();
  if (idle.empty())
    return std::make_unique<Worker>(kMaxThreads);
  auto worker = std::move(idle.back());
  idle.pop_back();
  return worker;
}

void returnWorker(std::unique_ptr<Worker> worker) {
  std::lock_guard<std::mutex> lock(poolMutex);
  idleWorkers().push_back(std::move(worker));
}

} // namespace

unsigned poolSize() {
  std::optional<Settings> settings = settingsFromEnvironment(nullptr);
  if (settings && settings->threads > 0)
    return settings->threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

void workerLoop(Launch &launch, Counters &total, std::mutex &totalMutex) {
  std::unique_ptr<Worker> worker = takeWorker();
  worker->launch = &launch;
  worker->threadCount = launch.config.block[0] * launch.config.block[1] * launch.config.block[2];
  worker->threads.resize(worker->threadCount);
  worker->warps.assign((worker->threadCount + 31) / 32, Warp{});
  worker->windowBase = reinterpret_cast<uintptr_t>(worker->window.get());
  worker->dynamicBytes = launch.config.dynamicSharedBytes;
  worker->counters = Counters{};
  worker->lastAllocation = nullptr;
  currentWorker = worker.get();
  while (!launch.aborted) {
    const uint64_t index = launch.nextBlock.fetch_add(1);
    if (index >= launch.runBlocks)
      break;
    // A sample walks the linear block index with a large prime stride
    // (coprime with the block count), so it spreads over every grid
    // dimension instead of repeating one x.
    const uint64_t block =
        launch.runBlocks == launch.blockCount
            ? index
            : (index * (launch.blockCount % 1000003 == 0 ? 998244353ull : 1000003ull)) %
                  launch.blockCount;
    runBlock(*worker, block);
  }
  currentWorker = nullptr;
  currentThread = nullptr;
  {
    std::lock_guard<std::mutex> lock(totalMutex);
    total.add(worker->counters);
  }
  worker->launch = nullptr;
  returnWorker(std::move(worker));
}

} // namespace pagedc::emu::detail
