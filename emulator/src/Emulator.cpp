//===- Emulator.cpp - CUDA kernels executed on the CPU --------------------===//
//
// Execution model (docs/emulator.md has the long form):
//  - a launch hands its blocks to a pool of OS threads; a block runs on one
//    of them, each CUDA thread on its own fiber;
//  - a fiber runs until it blocks: at __syncthreads, or at a warp collective
//    until all lanes the collective needs have arrived; the last arrival
//    computes the collective (the fragment mappings of the PTX ISA) and
//    carries on; a pass over the block in which no fiber could run is a
//    deadlock;
//  - cp.async copies are queued per thread and land at its wait_group, so
//    a missing or short wait reads data that is not there yet;
//  - loads and stores come in through the compiler's instrumentation and are
//    checked against the block's shared window, the registered device
//    allocations and the fiber's own stack; an access outside all of them,
//    or misaligned, ends the launch as a GPU fault would.
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Emulator.h"

#include "Fiber.h"
#include "pagedc-emu/KernelAbi.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace pagedc::emu {

namespace {

//===----------------------------------------------------------------------===//
// Device memory
//===----------------------------------------------------------------------===//

struct Allocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  /// One byte per data byte: 1 once written (initcheck).
  std::unique_ptr<uint8_t[]> written;
  /// One bit per 32-byte sector touched by the current launch.
  std::unique_ptr<std::atomic<uint64_t>[]> sectors;
  size_t sectorWords = 0;
  uint64_t serial = 0;
  /// Racecheck across blocks: per 4-byte word, the (launch, block) that
  /// last wrote it from a kernel; made on the first kernel write.
  std::atomic<std::atomic<uint64_t> *> blockWriters{nullptr};
  std::unique_ptr<std::atomic<uint64_t>[]> blockWritersStorage;
  std::mutex blockWritersMutex;
};

std::atomic<uint32_t> launchSerial{0};

std::atomic<uint64_t> *blockWritersOf(Allocation &allocation) {
  std::atomic<uint64_t> *words = allocation.blockWriters.load(std::memory_order_acquire);
  if (words)
    return words;
  std::lock_guard<std::mutex> lock(allocation.blockWritersMutex);
  words = allocation.blockWriters.load(std::memory_order_acquire);
  if (!words) {
    const size_t count = (allocation.bytes + 3) / 4;
    allocation.blockWritersStorage.reset(new (std::nothrow) std::atomic<uint64_t>[count]);
    if (!allocation.blockWritersStorage)
      return nullptr;
    for (size_t i = 0; i < count; ++i)
      allocation.blockWritersStorage[i].store(0, std::memory_order_relaxed);
    words = allocation.blockWritersStorage.get();
    allocation.blockWriters.store(words, std::memory_order_release);
  }
  return words;
}

std::shared_mutex memoryMutex;
std::map<uintptr_t, std::unique_ptr<Allocation>> &allocations() {
  static std::map<uintptr_t, std::unique_ptr<Allocation>> all;
  return all;
}
uint64_t allocationSerial = 0;

/// The allocation holding `address` (caller holds memoryMutex).
Allocation *findAllocation(uintptr_t address) {
  auto &all = allocations();
  auto it = all.upper_bound(address);
  if (it == all.begin())
    return nullptr;
  --it;
  Allocation *allocation = it->second.get();
  return address - allocation->base < std::max<size_t>(allocation->bytes, 1) ? allocation
                                                                             : nullptr;
}

//===----------------------------------------------------------------------===//
// Modules
//===----------------------------------------------------------------------===//

struct Segment {
  uintptr_t begin, end;
};

} // namespace

class Module {
public:
  ~Module();
  void *handle = nullptr;
  int memfd = -1;
  std::string path;
  uintptr_t loadBase = 0;
  std::vector<Segment> segments;
  mutable std::mutex kernelsMutex;
  mutable std::map<std::string, std::unique_ptr<Kernel>> kernels;
  /// Static __shared__ arrays: bytes assigned so far.
  mutable std::mutex staticMutex;
  mutable unsigned staticBytes = 0;
  /// Source locations of return addresses already symbolized: a finding
  /// that repeats (a race on every tile) asks for the same few.
  mutable std::mutex symbolsMutex;
  mutable std::unordered_map<uintptr_t, std::string> symbols;
};

Module::~Module() {
  if (handle)
    dlclose(handle);
  if (memfd >= 0)
    close(memfd);
}

namespace {

//===----------------------------------------------------------------------===//
// Per-launch and per-block state
//===----------------------------------------------------------------------===//

constexpr unsigned kMaxDynamicShared = 227 * 1024;
constexpr unsigned kStaticSharedLimit = 48 * 1024;
constexpr unsigned kWindowBytes = kMaxDynamicShared + kStaticSharedLimit + 128;
constexpr size_t kStackBytes = 128 * 1024;
constexpr unsigned kMaxThreads = 1024;

enum class State : uint8_t { Runnable, AtBarrier, AtCollective, AtMbarrier, AtNamedBarrier, Finished };
enum class Collective : uint8_t {
  None,
  Shuffle,
  Ballot,
  Ldmatrix,
  LdmatrixTrans,
  Mma,
  // Warpgroup collectives (sm_90): all 128 threads of the warpgroup.
  Wgmma,
  Setmaxnreg,
};
/// mbarriers a block may initialize (each is also a clock of the async
/// proxy in the vector clocks, see Thread::vc).
constexpr unsigned kMaxMbarriers = 64;

const char *collectiveName(Collective kind) {
  switch (kind) {
  case Collective::None:
    return "none";
  case Collective::Shuffle:
    return "__shfl_xor_sync";
  case Collective::Ballot:
    return "__ballot_sync";
  case Collective::Ldmatrix:
    return "ldmatrix.x4";
  case Collective::LdmatrixTrans:
    return "ldmatrix.x4.trans";
  case Collective::Mma:
    return "mma.sync.m16n8k16";
  case Collective::Wgmma:
    return "wgmma.mma_async";
  case Collective::Setmaxnreg:
    return "setmaxnreg";
  }
  return "?";
}

struct AsyncCopy {
  uint32_t shared;
  const unsigned char *global;
  int valid;
  const char *file;
  int line;
};

/// A plain load or store, kept until the warp's next rendezvous so that the
/// lanes' k-th accesses can be counted as one warp-level request.
struct Access {
  uintptr_t address;
  const void *pc;
  uint32_t size;
  bool shared;
  bool write;
};

/// The result of one wgmma for one thread, held until the wgmma.wait_group
/// that retires its group writes it into the thread's accumulators.
struct PendingWgmma {
  float *d = nullptr;
  std::vector<float> values;
  /// The registers as this wgmma found them when it was the first in
  /// flight on them (empty otherwise): at its wait they must hold the same
  /// bits, or a non-wgmma instruction wrote them while it ran.
  std::vector<float> before;
  /// The warpgroup's first thread, to whom the operand reads are
  /// attributed, and the clock they carry (see wgmmaIssue).
  unsigned reader = 0;
  uint32_t readClock = 0;
};

struct Launch;
struct Worker;

struct Thread {
  Context context;
  PagedcEmuThreadIndex index{};
  unsigned linear = 0, warp = 0, lane = 0;
  State state = State::Runnable;
  const char *waitFile = "";
  int waitLine = 0;
  uintptr_t stackLow = 0, stackHigh = 0;
  std::vector<AsyncCopy> openGroup;
  std::deque<std::vector<AsyncCopy>> groups;
  // Collective operands and results.
  unsigned operand[4] = {0, 0, 0, 0};
  float accumulator[4] = {0, 0, 0, 0};
  unsigned result[4] = {0, 0, 0, 0};
  unsigned maskArgument = 0;
  int laneMask = 0;
  std::vector<Access> accesses;
  // Ordering beyond __syncthreads (mbarriers, named barriers, wgmma): the
  // thread's logical clock advances at each release; `vc` (used once the
  // block orders through them, Worker::ordering) holds the latest clock of
  // every thread, and of every mbarrier's completed phases, that this
  // thread has acquired. vc[linear] == clock.
  uint32_t clock = 1;
  std::vector<uint32_t> vc;
  /// The clock of the last fence.proxy.async (0: none), and what the
  /// thread had acquired then (under ordering): generic stores of others it
  /// acquired before the fence are visible to its async-proxy operations.
  uint32_t fenceClock = 0;
  std::vector<uint32_t> fencedVc;
  int waitBarrier = -1;
  unsigned waitParity = 0;
  // wgmma: the operation at the rendezvous, open and committed groups.
  bool wgmmaFenced = false;
  PagedcEmuWgmma wgmmaOp{};
  float *wgmmaD = nullptr;
  std::vector<PendingWgmma> wgmmaOpen;
  std::deque<std::vector<PendingWgmma>> wgmmaGroups;
};

/// An mbarrier of the block (mbarrier.init'ed in shared memory).
struct MBarrier {
  uint32_t offset = 0;
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  /// Phases completed so far.
  uint32_t phase = 0;
  uint16_t initBy = 0;
  uint32_t initClock = 0, initEpoch = 0;
  const char *initFile = "";
  int initLine = 0;
  /// Releases of the current phase, and what the last completed phase
  /// released (vector clocks).
  std::vector<uint32_t> accumulated, completed;
};

/// A named barrier (bar.sync / bar.arrive with an id from 1 to 15).
struct NamedBarrier {
  unsigned expected = 0, arrived = 0;
  const char *file = "";
  int line = 0;
  std::vector<uint32_t> accumulated;
  std::vector<unsigned> waiters;
};

/// The rendezvous of a warpgroup collective (128 threads).
struct GroupRendezvous {
  Collective kind = Collective::None;
  const char *file = "";
  int line = 0;
  unsigned arrived = 0;
};

struct Warp {
  Collective kind = Collective::None;
  const char *file = "";
  int line = 0;
  unsigned expected = 0, arrived = 0;
  bool bf16 = false;
};

/// Shadow of one shared-memory byte for racecheck and initcheck. Thread
/// ids are stored plus one (0: none).
/// Epochs count barrier intervals and never repeat within a worker, and
/// `writtenBlock` / `asyncBlock` name the block run the entry belongs to,
/// so the shadow needs no clearing between blocks.
/// Under mbarrier ordering (Worker::ordering) the writer and up to two
/// readers also carry their clocks; a writer id past the block's threads
/// names an mbarrier whose phase delivers the byte (a bulk copy).
struct SharedShadow {
  uint32_t writeEpoch = 0, readEpoch = 0;
  uint32_t writtenBlock = 0, asyncBlock = 0;
  uint32_t writerClock = 0, readerClock = 0, reader2Clock = 0;
  uint16_t writer = 0, reader = 0, reader2 = 0;
  uint16_t asyncBy = 0;
  uint8_t manyReaders = 0;
};

/// Where an access comes from: a source site, or a return address in the
/// image that is symbolized only when a report needs it.
struct Site {
  const char *file = nullptr;
  int line = 0;
  const void *pc = nullptr;
};

struct Launch {
  const Kernel *kernel = nullptr;
  LaunchConfig config;
  Checks checks;
  std::vector<unsigned char> parameterBytes;
  std::vector<void *> parameterPointers;
  std::atomic<uint64_t> nextBlock{0};
  uint64_t blockCount = 0;
  /// Distinguishes this launch's writes from earlier ones (racecheck).
  uint32_t serial = 0;
  /// Blocks actually run: all, or a sample (LaunchConfig::sampleBlocks).
  uint64_t runBlocks = 0;
  std::atomic<bool> aborted{false};
  std::mutex reportMutex;
  std::vector<Report> reports;
  std::map<std::string, size_t> reportIndex;
  std::string error;
  unsigned staticBase = 0;
};

struct Worker {
  explicit Worker(size_t threads) : stacks(threads, kStackBytes) {}
  StackArena stacks;
  Context scheduler;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::unique_ptr<unsigned char[]> window{new unsigned char[kWindowBytes]};
  std::unique_ptr<SharedShadow[]> shadow{new SharedShadow[kWindowBytes]};
  Launch *launch = nullptr;
  unsigned block[3] = {0, 0, 0};
  /// (launch serial << 32) | (linear block + 1) of the block being run.
  uint64_t blockTag = 0;
  unsigned threadCount = 0, live = 0, atBarrier = 0;
  const char *barrierFile = "";
  int barrierLine = 0;
  bool barrierMismatch = false;
  uint32_t epoch = 1;
  /// The epoch at which the running block started.
  uint32_t blockEpoch = 1;
  uint32_t blockSerial = 0;
  /// Set once the block uses an mbarrier or a named barrier: from then on
  /// the threads' vector clocks are kept (Thread::vc).
  bool ordering = false;
  std::vector<MBarrier> mbarriers;
  /// Shared bytes read by more than two threads in the current read epoch
  /// while the vector clocks are kept (ordering): each reader's latest
  /// read clock (index thread), so that a later write is checked against
  /// every reader rather than assumed to race (SharedShadow::manyReaders).
  std::unordered_map<uint64_t, std::vector<uint32_t>> manyReaders;
  NamedBarrier named[16];
  std::vector<GroupRendezvous> warpgroups;
  bool aborted = false;
  uintptr_t windowBase = 0;
  unsigned dynamicBytes = 0;
  Counters counters;
  Allocation *lastAllocation = nullptr;
};

thread_local Worker *currentWorker = nullptr;
/// The fiber running now (null on the scheduler's own stack).
thread_local Thread *currentThread = nullptr;
/// The thread reports name when not the running one (ldmatrix rows are
/// attributed to the lane that gave the address).
thread_local Thread *reportedThread = nullptr;

//===----------------------------------------------------------------------===//
// Reports
//===----------------------------------------------------------------------===//

std::string siteString(const char *file, int line) {
  if (!file || !*file)
    return "?";
  const char *slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

/// addr2line's "Prefill.cuh:123" for an offset in an image, or
/// "image+0x..." where it knows none.
std::string addr2line(const Module &module, uintptr_t offset) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "addr2line -e '%s' 0x%lx 2>/dev/null", module.path.c_str(),
                static_cast<unsigned long>(offset));
  std::string text;
  if (FILE *pipe = popen(buffer, "r")) {
    while (fgets(buffer, sizeof(buffer), pipe))
      text += buffer;
    pclose(pipe);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
    text.pop_back();
  // addr2line prints "file:line (discriminator N)" or "??:0".
  if (auto space = text.find(' '); space != std::string::npos)
    text.resize(space);
  if (text.empty() || text.rfind("??", 0) == 0) {
    std::snprintf(buffer, sizeof(buffer), "image+0x%lx", static_cast<unsigned long>(offset));
    return buffer;
  }
  if (auto slash = text.rfind('/'); slash != std::string::npos)
    text = text.substr(slash + 1);
  return text;
}

/// "Prefill.cuh:123" for a return address in an image, through addr2line
/// once per address: a site is located before its finding is counted, and
/// a finding can repeat thousands of times in a launch (one addr2line run
/// per repeat took minutes).
std::string symbolize(const Module &module, const void *pc) {
  const auto offset = reinterpret_cast<uintptr_t>(pc) - module.loadBase - 1;
  std::lock_guard<std::mutex> lock(module.symbolsMutex);
  std::string &known = module.symbols[offset];
  if (known.empty())
    known = addr2line(module, offset);
  return known;
}

void report(const char *checker, std::string message, std::string location, uint64_t address,
            bool fatal) {
  Worker *worker = currentWorker;
  Thread *thread = reportedThread ? reportedThread : currentThread;
  Launch &launch = *worker->launch;
  {
    std::lock_guard<std::mutex> lock(launch.reportMutex);
    // One entry per checker, site and kind of finding (the message up to
    // its first colon); repeats only count.
    std::string key = std::string(checker) + "|" + location + "|" +
                      message.substr(0, message.find(':'));
    auto found = launch.reportIndex.find(key);
    if (found != launch.reportIndex.end()) {
      ++launch.reports[found->second].count;
    } else if (launch.reports.size() < 64) {
      Report entry;
      entry.checker = checker;
      entry.message = std::move(message);
      entry.kernel = launch.kernel->name;
      std::copy(worker->block, worker->block + 3, entry.block);
      if (thread)
        std::copy(thread->index.thread_idx, thread->index.thread_idx + 3, entry.thread);
      entry.location = std::move(location);
      entry.address = address;
      launch.reportIndex.emplace(std::move(key), launch.reports.size());
      launch.reports.push_back(std::move(entry));
    }
  }
  if (fatal) {
    worker->aborted = true;
    launch.aborted = true;
    reportedThread = nullptr;
    if (currentThread)
      switchContext(currentThread->context, worker->scheduler);
  }
}

std::string pcLocation(const void *pc) {
  return symbolize(*currentWorker->launch->kernel->module, pc);
}

std::string siteText(const Site &site) {
  if (site.file)
    return siteString(site.file, site.line);
  if (site.pc)
    return pcLocation(site.pc);
  return "?";
}

std::string hex(uint64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

//===----------------------------------------------------------------------===//
// Scheduling
//===----------------------------------------------------------------------===//

/// Blocks the running fiber and returns to the block scheduler.
void blockHere(Thread &thread, State state, const char *file, int line) {
  thread.state = state;
  thread.waitFile = file;
  thread.waitLine = line;
  switchContext(thread.context, currentWorker->scheduler);
}

void flushWarpAccesses(Worker &worker, unsigned warp);

unsigned staticLimit(const Worker &worker) {
  std::lock_guard<std::mutex> lock(worker.launch->kernel->module->staticMutex);
  return worker.launch->kernel->module->staticBytes;
}


void landGroup(Worker &worker, Thread &thread, const std::vector<AsyncCopy> &group);

/// Vector clocks of a block that orders through mbarriers: every thread,
/// then one entry per mbarrier (its completed phases).
size_t clockEntries(const Worker &worker) { return worker.threadCount + kMaxMbarriers; }

void maxInto(std::vector<uint32_t> &into, const std::vector<uint32_t> &from) {
  for (size_t i = 0; i < into.size(); ++i)
    into[i] = std::max(into[i], from[i]);
}

/// Called at the block's first mbarrier or named barrier: from here on
/// the threads keep vector clocks.
void startOrdering(Worker &worker) {
  if (worker.ordering)
    return;
  worker.ordering = true;
  for (unsigned t = 0; t < worker.threadCount; ++t) {
    Thread &thread = worker.threads[t];
    thread.vc.assign(clockEntries(worker), 0);
    thread.vc[t] = thread.clock;
  }
}

/// Ticks the thread's own clock (after a release, so that what it does
/// next is not covered by it).
void tick(Worker &worker, Thread &thread) {
  ++thread.clock;
  if (worker.ordering)
    thread.vc[thread.linear] = thread.clock;
}

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

std::string lanesString(unsigned mask) {
  std::string text;
  for (int lane = 0; lane < 32;) {
    if (!(mask >> lane & 1)) {
      ++lane;
      continue;
    }
    int end = lane;
    while (end + 1 < 32 && (mask >> (end + 1) & 1))
      ++end;
    if (!text.empty())
      text += ",";
    text += end == lane ? std::to_string(lane) : std::to_string(lane) + "-" + std::to_string(end);
    lane = end + 1;
  }
  return text.empty() ? "none" : text;
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
    thread.fencedVc.clear();
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

//===----------------------------------------------------------------------===//
// Memory checks
//===----------------------------------------------------------------------===//

/// The offset of [address, address + size) in the block's shared window,
/// or -1 when it is not inside the dynamic or the assigned static region.
int64_t sharedOffset(const Worker &worker, uintptr_t address, size_t size) {
  const uintptr_t offset = address - worker.windowBase;
  if (offset >= kWindowBytes)
    return -1;
  if (offset + size <= worker.dynamicBytes)
    return static_cast<int64_t>(offset);
  const unsigned base = worker.launch->staticBase;
  if (offset >= base && offset + size <= base + staticLimit(worker))
    return static_cast<int64_t>(offset);
  return -1;
}

bool inWindow(const Worker &worker, uintptr_t address) {
  return address - worker.windowBase < kWindowBytes;
}

std::string sharedDescription(const Worker &worker, uint64_t offset) {
  return "shared offset " + hex(offset) + " (dynamic " + std::to_string(worker.dynamicBytes) +
         " bytes, static " + std::to_string(staticLimit(worker)) + " bytes at " +
         hex(worker.launch->staticBase) + ")";
}

enum class SharedUse { Read, Write, Atomic, AsyncIssue, BulkWrite };

/// How a checked shared access is made, beyond its kind.
struct SharedAccess {
  /// A read by the async proxy (wgmma operands): generic stores it reads
  /// need the writer's fence.proxy.async.
  bool asyncProxy = false;
  /// The clock recorded for the access (0: the thread's own).
  uint32_t clock = 0;
  /// BulkWrite: the writer id (an mbarrier's) and clock recorded for it.
  uint16_t bulkWriter = 0;
  uint32_t bulkClock = 0;
  /// asyncProxy: the reading warpgroup (its first thread; 0 threads:
  /// none), whose proxy fences may cover a generic store it acquired.
  unsigned fencedFirst = 0, fencedCount = 0;
};

/// Whether a thread of `how`'s reading warpgroup had acquired the store of
/// thread `writer` (index) at `clock` when it last fenced the async proxy.
/// Asked only for a store its writer did not fence, so it is looked up per
/// store, not merged over the warpgroup per wgmma.
bool readerFenced(const Worker &worker, const SharedAccess &how, unsigned writer,
                  uint32_t clock) {
  for (unsigned t = how.fencedFirst; t < how.fencedFirst + how.fencedCount; ++t) {
    const std::vector<uint32_t> &seen = worker.threads[t].fencedVc;
    if (writer < seen.size() && seen[writer] >= clock)
      return true;
  }
  return false;
}

/// The mbarrier behind a pseudo-thread id of the shadow (see SharedShadow).
std::string bulkWriterDescription(const Worker &worker, uint16_t writer, uint32_t clock) {
  const unsigned index = writer - 1 - worker.threadCount;
  if (index >= worker.mbarriers.size())
    return "a bulk copy";
  return "a bulk copy completing on the mbarrier at shared offset " +
         std::to_string(worker.mbarriers[index].offset) + " in its phase " +
         std::to_string(clock - 1);
}

/// Whether an access of `earlier` (thread id + 1, or an mbarrier's id) at
/// `clock` in `epoch` is ordered before what `thread` does now: the same
/// thread, a __syncthreads in between (threads only: a bulk copy completes
/// on its mbarrier, not at a barrier), or a release `thread` has acquired.
bool orderedBefore(const Worker &worker, const Thread &thread, uint16_t earlier, uint32_t clock,
                   uint32_t epoch) {
  if (earlier == thread.linear + 1)
    return true;
  const bool isThread = earlier <= worker.threadCount;
  if (isThread && epoch != worker.epoch)
    return true;
  return worker.ordering && thread.vc[earlier - 1] >= clock;
}

/// Racecheck and initcheck of shared bytes [offset, offset + size) used by
/// `thread`; `where` locates the access for reports.
void checkShared(Worker &worker, Thread &thread, uint64_t offset, size_t size, SharedUse use,
                 const Site &where, const SharedAccess &how = {}) {
  const uint32_t block = worker.blockSerial;
  const Checks &checks = worker.launch->checks;
  const uint16_t self = static_cast<uint16_t>(thread.linear + 1);
  const uint32_t clock = how.clock ? how.clock : thread.clock;
  bool raced = false, uninitialized = false;
  for (size_t i = 0; i < size; ++i) {
    SharedShadow &shadow = worker.shadow[offset + i];
    const bool written = shadow.writtenBlock == block && shadow.writer;
    if (use == SharedUse::Read || use == SharedUse::Atomic) {
      if (checks.racecheck && !raced) {
        const uint16_t asyncBy = shadow.asyncBlock == block ? shadow.asyncBy : 0;
        if (asyncBy && asyncBy != self) {
          raced = true;
          report("racecheck",
                 "read of " + sharedDescription(worker, offset + i) +
                     " while a cp.async of thread " + std::to_string(asyncBy - 1) +
                     " into it has not landed (no cp.async.wait_group + barrier in between)",
                 siteText(where), offset + i, false);
        } else if (asyncBy == self) {
          raced = true;
          report("racecheck",
                 "read of " + sharedDescription(worker, offset + i) +
                     " before this thread's own cp.async into it was waited for",
                 siteText(where), offset + i, false);
        } else if (use == SharedUse::Read && written &&
                   !orderedBefore(worker, thread, shadow.writer, shadow.writerClock,
                                  shadow.writeEpoch)) {
          raced = true;
          if (shadow.writer > worker.threadCount)
            report("racecheck",
                   "read before the mbarrier phase that delivers it: " +
                       sharedDescription(worker, offset + i) + " is written by " +
                       bulkWriterDescription(worker, shadow.writer, shadow.writerClock) +
                       ", which this thread has not waited for",
                   siteText(where), offset + i, false);
          else
            report("racecheck",
                   "read-after-write hazard: " + sharedDescription(worker, offset + i) +
                       " written by thread " + std::to_string(shadow.writer - 1) +
                       (worker.ordering ? " with no barrier or mbarrier ordering in between"
                                        : " with no barrier in between"),
                   siteText(where), offset + i, false);
        } else if (how.asyncProxy && written && shadow.writer <= worker.threadCount &&
                   worker.threads[shadow.writer - 1].fenceClock < shadow.writerClock &&
                   !readerFenced(worker, how, shadow.writer - 1u, shadow.writerClock)) {
          raced = true;
          report("racecheck",
                 "async-proxy read of a generic store with no proxy fence: wgmma reads " +
                     sharedDescription(worker, offset + i) + ", which thread " +
                     std::to_string(shadow.writer - 1) +
                     " stored, with no fence.proxy.async.shared::cta by that thread after the "
                     "store nor by the reading warpgroup after it acquired the store",
                 siteText(where), offset + i, false);
        }
      }
      if (checks.initcheck && shadow.writtenBlock != block && !uninitialized) {
        uninitialized = true;
        report("initcheck", "read of " + sharedDescription(worker, offset + i) + " never written",
               siteText(where), offset + i, false);
      }
      if (use == SharedUse::Read) {
        if (shadow.readEpoch != worker.epoch) {
          if (shadow.manyReaders)
            worker.manyReaders.erase(offset + i);
          shadow.readEpoch = worker.epoch;
          shadow.reader = self;
          shadow.readerClock = clock;
          shadow.reader2 = 0;
          shadow.manyReaders = 0;
        } else if (shadow.reader == self) {
          shadow.readerClock = std::max(shadow.readerClock, clock);
        } else if (shadow.reader2 == self) {
          shadow.reader2Clock = std::max(shadow.reader2Clock, clock);
        } else if (!shadow.reader2) {
          shadow.reader2 = self;
          shadow.reader2Clock = clock;
        } else {
          // Every reader's clock, for the ordering check of a later write;
          // only from the third reader on (a byte that had many readers
          // before the block began ordering stays conservative: the
          // readers between the first two and now are not known).
          if (worker.ordering &&
              (!shadow.manyReaders || worker.manyReaders.count(offset + i) != 0)) {
            std::vector<uint32_t> &clocks = worker.manyReaders[offset + i];
            if (clocks.empty()) {
              clocks.assign(worker.threadCount, 0);
              clocks[shadow.reader - 1] = shadow.readerClock;
              clocks[shadow.reader2 - 1] = shadow.reader2Clock;
            }
            clocks[self - 1] = std::max(clocks[self - 1], clock);
          }
          shadow.manyReaders = 1;
        }
      } else {
        shadow.writtenBlock = block;
      }
      continue;
    }
    // Writes, cp.async issues and bulk copies (checked as the issuing
    // thread's writes).
    if (checks.racecheck && !raced) {
      const uint16_t asyncBy = shadow.asyncBlock == block ? shadow.asyncBy : 0;
      auto readBy = [&](uint16_t reader, uint32_t readClock) {
        return reader && !orderedBefore(worker, thread, reader, readClock, shadow.readEpoch);
      };
      const bool readsThisEpoch = shadow.readEpoch == worker.epoch;
      // More than two readers: with their clocks kept, a reader this write
      // is not ordered after; without, any (conservatively).
      auto unorderedManyReader = [&]() -> uint16_t {
        if (!shadow.manyReaders)
          return 0;
        auto found = worker.manyReaders.find(offset + i);
        if (found == worker.manyReaders.end())
          return shadow.reader;
        const std::vector<uint32_t> &clocks = found->second;
        for (size_t t = 0; t < clocks.size(); ++t)
          if (clocks[t] && readBy(static_cast<uint16_t>(t + 1), clocks[t]))
            return static_cast<uint16_t>(t + 1);
        return 0;
      };
      if (asyncBy && (use != SharedUse::AsyncIssue || asyncBy != self)) {
        raced = true;
        report("racecheck",
               "write to " + sharedDescription(worker, offset + i) +
                   " while a cp.async of thread " + std::to_string(asyncBy - 1) +
                   " into it has not landed",
               siteText(where), offset + i, false);
      } else if (written && !orderedBefore(worker, thread, shadow.writer, shadow.writerClock,
                                           shadow.writeEpoch)) {
        raced = true;
        report("racecheck",
               "write-after-write hazard: " + sharedDescription(worker, offset + i) +
                   " also written by " +
                   (shadow.writer > worker.threadCount
                        ? bulkWriterDescription(worker, shadow.writer, shadow.writerClock)
                        : "thread " + std::to_string(shadow.writer - 1)) +
                   " with no ordering in between",
               siteText(where), offset + i, false);
      } else if (uint16_t many = 0;
                 readsThisEpoch && (readBy(shadow.reader, shadow.readerClock) ||
                                    readBy(shadow.reader2, shadow.reader2Clock) ||
                                    (many = unorderedManyReader()) != 0)) {
        raced = true;
        const uint16_t reader = readBy(shadow.reader, shadow.readerClock)     ? shadow.reader
                                : readBy(shadow.reader2, shadow.reader2Clock) ? shadow.reader2
                                                                              : many;
        report("racecheck",
               std::string(use == SharedUse::BulkWrite ? "bulk copy write-after-read hazard: "
                                                       : "write-after-read hazard: ") +
                   sharedDescription(worker, offset + i) + " read by thread " +
                   std::to_string(reader - 1) + (shadow.manyReaders ? " (and others)" : "") +
                   (worker.ordering
                        ? " with no barrier in between, and no release of that read this thread "
                          "acquired"
                        : " with no barrier in between"),
               siteText(where), offset + i, false);
      }
    }
    if (use == SharedUse::AsyncIssue) {
      shadow.asyncBy = self;
      shadow.asyncBlock = block;
    } else if (use == SharedUse::BulkWrite) {
      shadow.writtenBlock = block;
      shadow.writer = how.bulkWriter;
      shadow.writerClock = how.bulkClock;
      shadow.writeEpoch = worker.epoch;
    } else {
      shadow.writtenBlock = block;
      shadow.writer = self;
      shadow.writerClock = clock;
      shadow.writeEpoch = worker.epoch;
    }
  }
}

/// Memcheck and initcheck of a global range; marks writes. Returns the
/// allocation, or null after a fatal report.
Allocation *checkGlobal(Worker &worker, uintptr_t address, size_t size, bool write,
                        const Site &where, bool atomic = false) {
  Allocation *allocation = worker.lastAllocation;
  if (!allocation || address - allocation->base >= allocation->bytes) {
    std::shared_lock<std::shared_mutex> lock(memoryMutex);
    allocation = findAllocation(address);
    worker.lastAllocation = allocation;
  }
  const Checks &checks = worker.launch->checks;
  if (!allocation) {
    if (checks.memcheck)
      report("memcheck",
             std::string(write ? "write" : "read") + " of " + std::to_string(size) +
                 " bytes at " + hex(address) + ", outside every device allocation",
             siteText(where), address, true);
    return nullptr;
  }
  const uintptr_t offset = address - allocation->base;
  if (offset + size > allocation->bytes) {
    if (checks.memcheck)
      report("memcheck",
             std::string(write ? "write" : "read") + " of " + std::to_string(size) +
                 " bytes at offset " + std::to_string(offset) + " of a " +
                 std::to_string(allocation->bytes) + "-byte allocation runs past its end",
             siteText(where), address, true);
    return nullptr;
  }
  uint8_t *written = allocation->written ? allocation->written.get() + offset : nullptr;
  if (!written) {
  } else if (write) {
    for (size_t i = 0; i < size; ++i)
      __atomic_store_n(written + i, uint8_t(1), __ATOMIC_RELAXED);
  } else if (checks.initcheck) {
    for (size_t i = 0; i < size; ++i)
      if (!__atomic_load_n(written + i, __ATOMIC_RELAXED)) {
        report("initcheck",
               "read of device memory never written: byte " + std::to_string(offset + i) +
                   " of a " + std::to_string(allocation->bytes) + "-byte allocation",
               siteText(where), address + i, false);
        break;
      }
  }
  // Blocks of one launch are unordered: a word written by one block and
  // read or written by another is a hazard, unless both accesses are
  // atomics (a work counter every block takes from). An atomic's tag
  // carries kAtomicTag, so a plain access after another block's atomic (or
  // an atomic after its plain write) is still reported.
  if (checks.racecheck && (write || allocation->blockWriters.load(std::memory_order_relaxed))) {
    if (std::atomic<uint64_t> *words = write ? blockWritersOf(*allocation)
                                             : allocation->blockWriters.load(
                                                   std::memory_order_acquire)) {
      constexpr uint64_t kAtomicTag = uint64_t(1) << 63;
      const uint64_t mine = worker.blockTag | (atomic ? kAtomicTag : 0);
      for (uintptr_t word = offset / 4; word <= (offset + size - 1) / 4; ++word) {
        const uint64_t other = write ? words[word].exchange(mine, std::memory_order_relaxed)
                                     : words[word].load(std::memory_order_relaxed);
        const uint64_t block = other & ~kAtomicTag;
        if (other == 0 || block == worker.blockTag || (block >> 32) != (worker.blockTag >> 32) ||
            (atomic && (other & kAtomicTag)))
          continue;
        const uint64_t linear = (block & 0xffffffffu) - 1;
        const LaunchConfig &config = worker.launch->config;
        report("racecheck",
               std::string(write ? "write-after-write" : "read-after-write") +
                   " hazard between blocks: byte " + std::to_string(word * 4) + " of a " +
                   std::to_string(allocation->bytes) + "-byte allocation was written by block (" +
                   std::to_string(linear % config.grid[0]) + "," +
                   std::to_string(linear / config.grid[0] % config.grid[1]) + "," +
                   std::to_string(linear / config.grid[0] / config.grid[1]) +
                   ") of this launch; blocks are unordered",
               siteText(where), allocation->base + word * 4, false);
        break;
      }
    }
  }
  // Distinct sectors of the launch.
  for (uintptr_t sector = offset / 32; sector <= (offset + size - 1) / 32; ++sector)
    allocation->sectors[sector / 64].fetch_or(uint64_t(1) << (sector % 64),
                                              std::memory_order_relaxed);
  return allocation;
}

bool misaligned(uintptr_t address, size_t size) {
  return (size == 2 || size == 4 || size == 8 || size == 16) && (address & (size - 1)) != 0;
}

/// The instrumentation hook: every load and store of kernel code.
void onAccess(const void *pointer, unsigned long size, int flags, const void *pc) {
  Thread *thread = currentThread;
  if (!thread)
    return;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (address - thread->stackLow < kStackBytes)
    return; // the thread's own stack: locals and by-value parameters
  Worker &worker = *currentWorker;
  const bool write = (flags & PAGEDC_EMU_WRITE) != 0;
  Launch &launch = *worker.launch;
  if (inWindow(worker, address)) {
    int64_t offset = sharedOffset(worker, address, size);
    if (offset < 0) {
      if (launch.checks.memcheck)
        report("memcheck",
               std::string(write ? "write" : "read") + " of " + std::to_string(size) +
                   " bytes at " + sharedDescription(worker, address - worker.windowBase) +
                   ", outside the block's shared memory",
               pcLocation(pc), address - worker.windowBase, true);
      return;
    }
    if (launch.checks.memcheck && misaligned(address, size)) {
      report("memcheck",
             "misaligned " + std::to_string(size) + "-byte shared access at " +
                 sharedDescription(worker, offset),
             pcLocation(pc), offset, true);
      return;
    }
    if (launch.checks.racecheck || launch.checks.initcheck)
      checkShared(worker, *thread, offset, size, write ? SharedUse::Write : SharedUse::Read,
                  Site{nullptr, 0, pc});
    (write ? worker.counters.sharedStoreBytes : worker.counters.sharedLoadBytes) += size;
    thread->accesses.push_back({address, pc, static_cast<uint32_t>(size), true, write});
    return;
  }
  // Kernel parameters (copied at launch, read-only) and the index variables.
  const auto *parameters = launch.parameterBytes.data();
  if (address - reinterpret_cast<uintptr_t>(parameters) < launch.parameterBytes.size() ||
      address - reinterpret_cast<uintptr_t>(launch.parameterPointers.data()) <
          launch.parameterPointers.size() * sizeof(void *) ||
      address - reinterpret_cast<uintptr_t>(&thread->index) < sizeof(thread->index)) {
    if (write && launch.checks.memcheck)
      report("memcheck", "write to a kernel parameter", pcLocation(pc), address, true);
    return;
  }
  // The image's own data (constant tables).
  for (const Segment &segment : launch.kernel->module->segments)
    if (address >= segment.begin && address < segment.end)
      return;
  if (launch.checks.memcheck && misaligned(address, size)) {
    report("memcheck", "misaligned " + std::to_string(size) + "-byte global access at " +
                           hex(address),
           pcLocation(pc), address, true);
    return;
  }
  Allocation *allocation =
      checkGlobal(worker, address, size, write, Site{nullptr, 0, pc});
  if (!allocation)
    return;
  (write ? worker.counters.globalStoreBytes : worker.counters.globalLoadBytes) += size;
  thread->accesses.push_back({address, pc, static_cast<uint32_t>(size), false, write});
}

void onAccessRange(const void *pointer, unsigned long size, int flags, const void *pc) {
  // Ranges are checked byte-span-wise as one access without alignment.
  Thread *thread = currentThread;
  if (!thread || size == 0)
    return;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (address - thread->stackLow < kStackBytes)
    return;
  Worker &worker = *currentWorker;
  Launch &launch = *worker.launch;
  const bool write = (flags & PAGEDC_EMU_WRITE) != 0;
  if (inWindow(worker, address)) {
    int64_t offset = sharedOffset(worker, address, size);
    if (offset < 0) {
      report("memcheck", "shared range outside the block's shared memory", pcLocation(pc),
             address - worker.windowBase, true);
      return;
    }
    checkShared(worker, *thread, offset, size, write ? SharedUse::Write : SharedUse::Read,
                Site{nullptr, 0, pc});
    return;
  }
  const auto *parameters = launch.parameterBytes.data();
  if (address - reinterpret_cast<uintptr_t>(parameters) < launch.parameterBytes.size())
    return;
  for (const Segment &segment : launch.kernel->module->segments)
    if (address >= segment.begin && address < segment.end)
      return;
  checkGlobal(worker, address, size, write, Site{nullptr, 0, pc});
}

//===----------------------------------------------------------------------===//
// Counters of warp-level requests
//===----------------------------------------------------------------------===//

/// Wavefronts of one warp-level shared request: per phase of 128 bytes'
/// worth of lanes, the most distinct 4-byte words any one bank serves.
uint64_t sharedWavefronts(const std::vector<const Access *> &lanes) {
  if (lanes.empty())
    return 0;
  const uint32_t size = std::max<uint32_t>(lanes.front()->size, 4);
  const size_t perPhase = std::max<size_t>(1, 128 / size);
  uint64_t total = 0;
  for (size_t begin = 0; begin < lanes.size(); begin += perPhase) {
    std::map<unsigned, std::vector<uintptr_t>> banks;
    for (size_t i = begin; i < std::min(lanes.size(), begin + perPhase); ++i)
      for (uint32_t byte = 0; byte < size; byte += 4) {
        uintptr_t word = (lanes[i]->address + byte) / 4;
        auto &words = banks[word % 32];
        if (std::find(words.begin(), words.end(), word) == words.end())
          words.push_back(word);
      }
    size_t most = 0;
    for (auto &entry : banks)
      most = std::max(most, entry.second.size());
    total += most;
  }
  return total;
}

void flushWarpAccesses(Worker &worker, unsigned warp) {
  const unsigned first = warp * 32, last = std::min(worker.threadCount, first + 32);
  // One request per instruction and execution of it: a lane's n-th access
  // from an instruction joins the other lanes' n-th from the same one, so
  // lanes that skipped an access under a branch (one lane in four storing
  // lse) stay in step with the others afterwards.
  std::map<std::pair<const void *, size_t>, std::vector<const Access *>> requests;
  for (unsigned t = first; t < last; ++t) {
    std::map<const void *, size_t> executions;
    for (const Access &access : worker.threads[t].accesses)
      requests[{access.pc, executions[access.pc]++}].push_back(&access);
  }
  for (auto &[instruction, group] : requests) {
    if (group.front()->shared) {
      ++worker.counters.sharedRequests;
      worker.counters.sharedWavefronts += sharedWavefronts(group);
      uint64_t bytes = 0;
      for (const Access *access : group)
        bytes += access->size;
      worker.counters.sharedIdealWavefronts += (bytes + 127) / 128;
    } else {
      ++worker.counters.globalRequests;
      std::vector<uintptr_t> sectors;
      for (const Access *access : group)
        for (uintptr_t s = access->address / 32; s <= (access->address + access->size - 1) / 32;
             ++s)
          sectors.push_back(s);
      std::sort(sectors.begin(), sectors.end());
      worker.counters.globalSectorsRequested +=
          std::unique(sectors.begin(), sectors.end()) - sectors.begin();
    }
  }
  for (unsigned t = first; t < last; ++t)
    worker.threads[t].accesses.clear();
}

//===----------------------------------------------------------------------===//
// The runtime table
//===----------------------------------------------------------------------===//

const PagedcEmuThreadIndex *threadIndex() { return &currentThread->index; }

unsigned char *dynamicShared() { return currentWorker->window.get(); }

unsigned char *staticShared(unsigned *slot, unsigned bytes, unsigned align) {
  Worker &worker = *currentWorker;
  const Module &module = *worker.launch->kernel->module;
  unsigned offset = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (offset == 0) {
    std::lock_guard<std::mutex> lock(module.staticMutex);
    offset = *slot;
    if (offset == 0) {
      unsigned at = (module.staticBytes + align - 1) / align * align;
      if (at + bytes > kStaticSharedLimit) {
        report("memcheck", "static shared memory over " + std::to_string(kStaticSharedLimit) +
                               " bytes", "?", 0, true);
        return nullptr;
      }
      module.staticBytes = at + bytes;
      offset = at + 16;
      __atomic_store_n(slot, offset, __ATOMIC_RELEASE);
    }
  }
  return worker.window.get() + worker.launch->staticBase + (offset - 16);
}

unsigned sharedAddress(const void *pointer, const char *file, int line) {
  Worker &worker = *currentWorker;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  if (!inWindow(worker, address)) {
    report("memcheck", "cvta.to.shared of " + hex(address) + ", which is not shared memory",
           siteString(file, line), address, true);
    return 0;
  }
  return static_cast<unsigned>(address - worker.windowBase);
}

void syncthreads(const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  if (worker.launch->checks.synccheck && worker.warps[thread.warp].kind != Collective::None) {
    Warp &warp = worker.warps[thread.warp];
    report("synccheck",
           "__syncthreads while lanes " + lanesString(warp.arrived) + " of this warp wait at " +
               collectiveName(warp.kind) + " (" + siteString(warp.file, warp.line) + ")",
           siteString(file, line), 0, true);
    return;
  }
  if (worker.atBarrier == 0) {
    worker.barrierFile = file;
    worker.barrierLine = line;
  } else if (worker.launch->checks.synccheck && !worker.barrierMismatch &&
             (line != worker.barrierLine || std::strcmp(file, worker.barrierFile) != 0)) {
    worker.barrierMismatch = true;
    report("synccheck",
           "threads of the block meet at different __syncthreads: this one and " +
               siteString(worker.barrierFile, worker.barrierLine),
           siteString(file, line), 0, false);
  }
  ++worker.atBarrier;
  if (worker.atBarrier == worker.live) {
    thread.state = State::AtBarrier;
    releaseBarrier(worker);
    return;
  }
  blockHere(thread, State::AtBarrier, file, line);
}

/// Joins the warp rendezvous of `kind`; returns true for the last lane to
/// arrive, which then computes the collective for every lane.
bool arrive(Collective kind, unsigned expected, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  Warp &warp = worker.warps[thread.warp];
  const unsigned self = 1u << thread.lane;
  const bool check = worker.launch->checks.synccheck;
  if (check && !(expected & self)) {
    report("synccheck",
           std::string(collectiveName(kind)) + " by lane " + std::to_string(thread.lane) +
               ", which its member mask " + hex(expected) + " leaves out",
           siteString(file, line), 0, true);
    return false;
  }
  if (warp.kind == Collective::None) {
    warp.kind = kind;
    warp.file = file;
    warp.line = line;
    warp.expected = expected;
    warp.arrived = 0;
  } else if (check && (warp.kind != kind || warp.line != line ||
                       std::strcmp(warp.file, file) != 0 || warp.expected != expected)) {
    report("synccheck",
           std::string("divergent warp collective: lane ") + std::to_string(thread.lane) +
               " reached " + collectiveName(kind) + " (mask " + hex(expected) + ") while lanes " +
               lanesString(warp.arrived) + " wait at " + collectiveName(warp.kind) + " (" +
               siteString(warp.file, warp.line) + ", mask " + hex(warp.expected) + ")",
           siteString(file, line), 0, true);
    return false;
  }
  warp.arrived |= self;
  if (warp.arrived != warp.expected) {
    blockHere(thread, State::AtCollective, file, line);
    return false;
  }
  return true;
}

/// Wakes the lanes of a completed collective.
void complete(Worker &worker, Warp &warp, unsigned warpIndex) {
  const unsigned participants = warp.arrived;
  warp = Warp{};
  for (unsigned lane = 0; lane < 32; ++lane)
    if (participants >> lane & 1) {
      Thread &thread = worker.threads[warpIndex * 32 + lane];
      if (&thread != currentThread)
        thread.state = State::Runnable;
    }
  flushWarpAccesses(worker, warpIndex);
}

unsigned fullWarpMask(const Worker &worker, unsigned warp) {
  const unsigned lanes = std::min(32u, worker.threadCount - warp * 32);
  return lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
}

unsigned shflXor(unsigned mask, unsigned value, int laneMask, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  thread.operand[0] = value;
  thread.laneMask = laneMask;
  if (arrive(Collective::Shuffle, mask, file, line)) {
    Warp &warp = worker.warps[thread.warp];
    const unsigned base = thread.warp * 32;
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (!(mask >> lane & 1))
        continue;
      Thread &target = worker.threads[base + lane];
      const unsigned source = lane ^ static_cast<unsigned>(target.laneMask & 31);
      if (!(mask >> source & 1) && worker.launch->checks.synccheck) {
        report("synccheck",
               "__shfl_xor_sync: lane " + std::to_string(lane) + " reads lane " +
                   std::to_string(source) + ", which is not in the member mask " + hex(mask),
               siteString(file, line), 0, false);
        target.result[0] = target.operand[0];
        continue;
      }
      target.result[0] = worker.threads[base + source].operand[0];
    }
    ++worker.counters.shuffles;
    complete(worker, warp, thread.warp);
  }
  return thread.result[0];
}

unsigned ballot(unsigned mask, int predicate, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  thread.operand[0] = predicate != 0;
  if (arrive(Collective::Ballot, mask, file, line)) {
    Warp &warp = worker.warps[thread.warp];
    unsigned bits = 0;
    const unsigned base = thread.warp * 32;
    for (unsigned lane = 0; lane < 32; ++lane)
      if ((mask >> lane & 1) && worker.threads[base + lane].operand[0])
        bits |= 1u << lane;
    for (unsigned lane = 0; lane < 32; ++lane)
      if (mask >> lane & 1)
        worker.threads[base + lane].result[0] = bits;
    ++worker.counters.ballots;
    complete(worker, warp, thread.warp);
  }
  return thread.result[0];
}

void ldmatrix(unsigned fragment[4], unsigned address, int transpose, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  thread.operand[0] = address;
  const Collective kind = transpose ? Collective::LdmatrixTrans : Collective::Ldmatrix;
  if (arrive(kind, fullWarpMask(worker, thread.warp), file, line)) {
    Warp &warp = worker.warps[thread.warp];
    const unsigned base = thread.warp * 32;
    // rows[m][r]: the 8 16-bit elements of row r of matrix m.
    uint16_t rows[4][8][8];
    for (unsigned m = 0; m < 4; ++m) {
      std::vector<uintptr_t> groups[8];
      for (unsigned r = 0; r < 8; ++r) {
        Thread &provider = worker.threads[base + m * 8 + r];
        const unsigned rowAddress = provider.operand[0];
        reportedThread = &provider;
        if (rowAddress % 16 != 0) {
          report("memcheck",
                 "ldmatrix row address " + hex(rowAddress) + " (lane " +
                     std::to_string(m * 8 + r) + ") is not 16-byte aligned",
                 siteString(file, line), rowAddress, true);
          return;
        }
        const int64_t offset =
            sharedOffset(worker, worker.windowBase + rowAddress, 16);
        if (offset < 0) {
          report("memcheck",
                 "ldmatrix row (lane " + std::to_string(m * 8 + r) + ") at " +
                     sharedDescription(worker, rowAddress) + " is outside the block's shared memory",
                 siteString(file, line), rowAddress, true);
          return;
        }
        checkShared(worker, provider, offset, 16, SharedUse::Read, Site{file, line, nullptr});
        std::memcpy(rows[m][r], worker.window.get() + offset, 16);
        auto &group = groups[(rowAddress >> 4) & 7];
        if (std::find(group.begin(), group.end(), rowAddress) == group.end())
          group.push_back(rowAddress);
      }
      size_t most = 0;
      for (auto &group : groups)
        most = std::max(most, group.size());
      worker.counters.ldmatrixWavefronts += most;
    }
    reportedThread = nullptr;
    worker.counters.ldmatrixIdealWavefronts += 4;
    ++worker.counters.ldmatrix;
    worker.counters.sharedLoadBytes += 512;
    for (unsigned lane = 0; lane < 32; ++lane) {
      Thread &target = worker.threads[base + lane];
      for (unsigned m = 0; m < 4; ++m) {
        uint16_t low, high;
        if (!transpose) {
          low = rows[m][lane / 4][2 * (lane % 4)];
          high = rows[m][lane / 4][2 * (lane % 4) + 1];
        } else {
          low = rows[m][2 * (lane % 4)][lane / 4];
          high = rows[m][2 * (lane % 4) + 1][lane / 4];
        }
        target.result[m] = low | (static_cast<unsigned>(high) << 16);
      }
    }
    complete(worker, warp, thread.warp);
  }
  for (int i = 0; i < 4; ++i)
    fragment[i] = thread.result[i];
}

float elementValue(uint16_t bits, bool bf16) {
  if (bf16) {
    uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, 4);
    return value;
  }
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  uint32_t wide;
  if (exponent == 0x1f) {
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    float value = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -value : value;
  } else {
    wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

void mma16816(float acc[4], const unsigned a[4], unsigned b0, unsigned b1, int bf16,
              const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  for (int i = 0; i < 4; ++i) {
    thread.operand[i] = a[i];
    thread.accumulator[i] = acc[i];
  }
  thread.result[0] = b0;
  thread.result[1] = b1;
  thread.maskArgument = bf16 ? 1 : 0;
  if (arrive(Collective::Mma, fullWarpMask(worker, thread.warp), file, line)) {
    Warp &warp = worker.warps[thread.warp];
    const unsigned base = thread.warp * 32;
    const bool isBf16 = bf16 != 0;
    float A[16][16], B[16][8], C[16][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
      Thread &t = worker.threads[base + lane];
      if (t.maskArgument != thread.maskArgument && worker.launch->checks.synccheck) {
        report("synccheck", "mma.sync lanes disagree on the element type", siteString(file, line),
               0, true);
        return;
      }
      const unsigned g = lane / 4, c = (lane % 4) * 2;
      auto split = [&](unsigned word, float &lo, float &hi) {
        lo = elementValue(static_cast<uint16_t>(word & 0xffffu), isBf16);
        hi = elementValue(static_cast<uint16_t>(word >> 16), isBf16);
      };
      split(t.operand[0], A[g][c], A[g][c + 1]);
      split(t.operand[1], A[g + 8][c], A[g + 8][c + 1]);
      split(t.operand[2], A[g][c + 8], A[g][c + 9]);
      split(t.operand[3], A[g + 8][c + 8], A[g + 8][c + 9]);
      split(t.result[0], B[c][g], B[c + 1][g]);
      split(t.result[1], B[c + 8][g], B[c + 9][g]);
      C[g][c] = t.accumulator[0];
      C[g][c + 1] = t.accumulator[1];
      C[g + 8][c] = t.accumulator[2];
      C[g + 8][c + 1] = t.accumulator[3];
    }
    // Products are exact in double; the sum is rounded once to f32.
    float D[16][8];
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double sum = C[m][n];
        for (int k = 0; k < 16; ++k)
          sum += static_cast<double>(A[m][k]) * static_cast<double>(B[k][n]);
        D[m][n] = static_cast<float>(sum);
      }
    for (unsigned lane = 0; lane < 32; ++lane) {
      Thread &t = worker.threads[base + lane];
      const unsigned g = lane / 4, c = (lane % 4) * 2;
      t.accumulator[0] = D[g][c];
      t.accumulator[1] = D[g][c + 1];
      t.accumulator[2] = D[g + 8][c];
      t.accumulator[3] = D[g + 8][c + 1];
    }
    ++worker.counters.mma;
    complete(worker, warp, thread.warp);
  }
  for (int i = 0; i < 4; ++i)
    acc[i] = thread.accumulator[i];
}

void cpAsync16(unsigned shared, const void *global, int validBytes, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  Launch &launch = *worker.launch;
  if (validBytes < 0 || validBytes > 16) {
    report("memcheck", "cp.async src-size " + std::to_string(validBytes) + " is not in [0, 16]",
           siteString(file, line), 0, true);
    return;
  }
  if (shared % 16 != 0) {
    report("memcheck", "cp.async destination " + hex(shared) + " is not 16-byte aligned", siteString(file, line),
           shared, true);
    return;
  }
  const int64_t offset = sharedOffset(worker, worker.windowBase + shared, 16);
  if (offset < 0) {
    report("memcheck",
           "cp.async destination " + sharedDescription(worker, shared) +
               " is outside the block's shared memory",
           siteString(file, line), shared, true);
    return;
  }
  const auto source = reinterpret_cast<uintptr_t>(global);
  if (validBytes > 0) {
    if (source % 16 != 0 && launch.checks.memcheck) {
      report("memcheck", "cp.async source " + hex(source) + " is not 16-byte aligned", siteString(file, line),
             source, true);
      return;
    }
    // Bounds now (the address is formed now); contents when it lands.
    Allocation *allocation = worker.lastAllocation;
    if (!allocation || source - allocation->base >= allocation->bytes) {
      std::shared_lock<std::shared_mutex> lock(memoryMutex);
      allocation = findAllocation(source);
      worker.lastAllocation = allocation;
    }
    if (!allocation || source - allocation->base + validBytes > allocation->bytes) {
      report("memcheck",
             "cp.async reads " + std::to_string(validBytes) + " bytes at " + hex(source) +
                 (allocation ? ", past the end of its allocation"
                             : ", outside every device allocation"),
             siteString(file, line), source, true);
      return;
    }
    thread.accesses.push_back({source, nullptr, static_cast<uint32_t>(validBytes), false, false});
  }
  if (launch.checks.racecheck)
    checkShared(worker, thread, offset, 16, SharedUse::AsyncIssue, Site{file, line, nullptr});
  else
    for (int i = 0; i < 16; ++i)
      {
        worker.shadow[offset + i].asyncBy = static_cast<uint16_t>(thread.linear + 1);
        worker.shadow[offset + i].asyncBlock = worker.blockSerial;
      }
  thread.openGroup.push_back({static_cast<uint32_t>(offset),
                              static_cast<const unsigned char *>(global), validBytes, file, line});
  ++worker.counters.cpAsync;
  worker.counters.cpAsyncBytes += validBytes;
  worker.counters.cpAsyncZeroFillBytes += 16 - validBytes;
}

void landGroup(Worker &worker, Thread &thread, const std::vector<AsyncCopy> &group) {
  const uint16_t self = static_cast<uint16_t>(thread.linear + 1);
  for (const AsyncCopy &copy : group) {
    unsigned char *target = worker.window.get() + copy.shared;
    if (copy.valid > 0) {
      checkGlobal(worker, reinterpret_cast<uintptr_t>(copy.global), copy.valid, false,
                  Site{copy.file, copy.line, nullptr});
      if (worker.aborted)
        return;
      std::memcpy(target, copy.global, copy.valid);
    }
    std::memset(target + copy.valid, 0, 16 - copy.valid);
    for (int i = 0; i < 16; ++i) {
      SharedShadow &shadow = worker.shadow[copy.shared + i];
      if (shadow.asyncBy == self)
        shadow.asyncBy = 0;
      shadow.writtenBlock = worker.blockSerial;
      shadow.writer = self;
      shadow.writerClock = thread.clock;
      shadow.writeEpoch = worker.epoch;
    }
  }
}

void cpAsyncCommit(const char *, int) {
  Thread &thread = *currentThread;
  thread.groups.push_back(std::move(thread.openGroup));
  thread.openGroup.clear();
}

void cpAsyncWait(int pending, const char *, int) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  while (thread.groups.size() > static_cast<size_t>(std::max(pending, 0))) {
    landGroup(worker, thread, thread.groups.front());
    thread.groups.pop_front();
  }
}

int atomicAddI32(int *pointer, int value, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  ++worker.counters.atomics;
  if (address % 4 != 0) {
    report("memcheck", "misaligned atomicAdd at " + hex(address), siteString(file, line), address, true);
    return 0;
  }
  if (inWindow(worker, address)) {
    const int64_t offset = sharedOffset(worker, address, 4);
    if (offset < 0) {
      report("memcheck", "atomicAdd outside the block's shared memory", siteString(file, line),
             address - worker.windowBase, true);
      return 0;
    }
    checkShared(worker, thread, offset, 4, SharedUse::Atomic, Site{file, line, nullptr});
    const int old = *pointer;
    *pointer = static_cast<int>(static_cast<unsigned>(old) + static_cast<unsigned>(value));
    return old;
  }
  if (!checkGlobal(worker, address, 4, false, Site{file, line, nullptr}, true))
    return 0;
  checkGlobal(worker, address, 4, true, Site{file, line, nullptr}, true);
  return __atomic_fetch_add(pointer, value, __ATOMIC_RELAXED);
}

void tally(int what) {
  Counters &counters = currentWorker->counters;
  switch (what) {
  case PAGEDC_EMU_TALLY_KEPT_TILE:
    ++counters.tilesKept;
    break;
  case PAGEDC_EMU_TALLY_MASKED_TILE:
    ++counters.tilesMasked;
    break;
  case PAGEDC_EMU_TALLY_RESCALED_ROWS:
    ++counters.rowGroupsRescaled;
    break;
  default:
    break;
  }
}

float approx(int function, float x) {
  ++currentWorker->counters.transcendentals;
  if (function == PAGEDC_EMU_TANH_APPROX)
    return std::tanh(x);
  // ex2.approx.ftz: subnormal inputs and results flush to zero.
  if (std::fpclassify(x) == FP_SUBNORMAL)
    x = 0.0f;
  float result = std::exp2(x);
  if (std::fpclassify(result) == FP_SUBNORMAL)
    result = 0.0f;
  return result;
}

//===----------------------------------------------------------------------===//
// sm_90: mbarriers, bulk copies, fences, named barriers, wgmma, setmaxnreg
//===----------------------------------------------------------------------===//

/// The shared offset of an mbarrier operand, or -1 after a fatal report.
int64_t mbarrierOffset(Worker &worker, unsigned address, const char *what, const char *file,
                       int line) {
  if (address % 8 != 0) {
    report("memcheck", std::string(what) + ": mbarrier address " + hex(address) +
                           " is not 8-byte aligned",
           siteString(file, line), address, true);
    return -1;
  }
  const int64_t offset = sharedOffset(worker, worker.windowBase + address, 8);
  if (offset < 0)
    report("memcheck",
           std::string(what) + ": mbarrier at " + sharedDescription(worker, address) +
               " is outside the block's shared memory",
           siteString(file, line), address, true);
  return offset;
}

/// The initialized mbarrier at `address`, checked to be visible to the
/// running thread; null after a fatal report.
MBarrier *findMbarrier(Worker &worker, unsigned address, const char *what, const char *file,
                       int line) {
  const int64_t offset = mbarrierOffset(worker, address, what, file, line);
  if (offset < 0)
    return nullptr;
  for (MBarrier &barrier : worker.mbarriers)
    if (barrier.offset == offset) {
      Thread &thread = *currentThread;
      if (worker.launch->checks.racecheck &&
          !orderedBefore(worker, thread, barrier.initBy, barrier.initClock, barrier.initEpoch))
        report("racecheck",
               "mbarrier used before its init is visible: " + std::string(what) +
                   " on the mbarrier at shared offset " + std::to_string(offset) +
                   " before its mbarrier.init by thread " + std::to_string(barrier.initBy - 1) +
                   " (" + siteString(barrier.initFile, barrier.initLine) +
                   ") is visible to this thread (no barrier in between)",
               siteString(file, line), offset, false);
      return &barrier;
    }
  report("synccheck",
         std::string(what) + " on shared offset " + std::to_string(offset) +
             ", where no mbarrier was initialized in this block",
         siteString(file, line), offset, true);
  return nullptr;
}

unsigned mbarrierIndex(const Worker &worker, const MBarrier &barrier) {
  return static_cast<unsigned>(&barrier - worker.mbarriers.data());
}

/// Completes the barrier's phase when nothing is pending: what the phase's
/// arrivals released, and the bulk copies it delivered, become visible to
/// every thread that waits for it.
void maybeCompletePhase(Worker &worker, MBarrier &barrier) {
  if (barrier.pending != 0 || barrier.tx != 0)
    return;
  const unsigned index = mbarrierIndex(worker, barrier);
  barrier.completed = barrier.accumulated;
  barrier.completed[worker.threadCount + index] = barrier.phase + 1;
  std::fill(barrier.accumulated.begin(), barrier.accumulated.end(), 0);
  ++barrier.phase;
  barrier.pending = barrier.expected;
  for (unsigned t = 0; t < worker.threadCount; ++t) {
    Thread &waiter = worker.threads[t];
    if (waiter.state != State::AtMbarrier || waiter.waitBarrier != static_cast<int>(index) ||
        (barrier.phase & 1u) == waiter.waitParity)
      continue;
    maxInto(waiter.vc, barrier.completed);
    waiter.state = State::Runnable;
  }
}

void mbarrierInit(unsigned address, unsigned count, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  const int64_t offset = mbarrierOffset(worker, address, "mbarrier.init", file, line);
  if (offset < 0)
    return;
  if (count == 0 || count > (1u << 20) - 1) {
    report("synccheck", "mbarrier.init with an arrival count of " + std::to_string(count) +
                            " (1 to 2^20 - 1)",
           siteString(file, line), offset, true);
    return;
  }
  startOrdering(worker);
  MBarrier *barrier = nullptr;
  for (MBarrier &existing : worker.mbarriers)
    if (existing.offset == offset)
      barrier = &existing;
  if (!barrier) {
    if (worker.mbarriers.size() == kMaxMbarriers) {
      report("synccheck",
             "more than " + std::to_string(kMaxMbarriers) +
                 " mbarriers in one block (the emulator's limit)",
             siteString(file, line), offset, true);
      return;
    }
    worker.mbarriers.emplace_back();
    barrier = &worker.mbarriers.back();
  }
  *barrier = MBarrier{};
  barrier->offset = static_cast<uint32_t>(offset);
  barrier->expected = barrier->pending = count;
  barrier->initBy = static_cast<uint16_t>(thread.linear + 1);
  barrier->initClock = thread.clock;
  barrier->initEpoch = worker.epoch;
  barrier->initFile = file;
  barrier->initLine = line;
  barrier->accumulated.assign(clockEntries(worker), 0);
  barrier->completed.assign(clockEntries(worker), 0);
  // The barrier's 8 bytes count as written by this thread.
  checkShared(worker, thread, offset, 8, SharedUse::Write, Site{file, line, nullptr});
}

void mbarrierArrive(unsigned address, int expectTx, unsigned txBytes, const char *file,
                    int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  MBarrier *barrier = findMbarrier(worker, address,
                                   expectTx ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive",
                                   file, line);
  if (!barrier)
    return;
  if (expectTx)
    barrier->tx += txBytes;
  maxInto(barrier->accumulated, thread.vc);
  tick(worker, thread);
  if (barrier->pending == 0) {
    report("synccheck", "mbarrier.arrive with no pending arrival left", siteString(file, line),
           barrier->offset, true);
    return;
  }
  --barrier->pending;
  maybeCompletePhase(worker, *barrier);
}

void mbarrierExpectTx(unsigned address, unsigned txBytes, const char *file, int line) {
  Worker &worker = *currentWorker;
  MBarrier *barrier = findMbarrier(worker, address, "mbarrier.expect_tx", file, line);
  if (barrier)
    barrier->tx += txBytes;
}

void mbarrierWait(unsigned address, unsigned parity, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  MBarrier *barrier = findMbarrier(worker, address, "mbarrier.try_wait.parity", file, line);
  if (!barrier)
    return;
  parity &= 1u;
  // The phase of parity `parity` has completed when the current phase's
  // parity differs (a fresh barrier passes a wait for parity 1).
  if ((barrier->phase & 1u) != parity) {
    maxInto(thread.vc, barrier->completed);
    return;
  }
  thread.waitBarrier = static_cast<int>(mbarrierIndex(worker, *barrier));
  thread.waitParity = parity;
  blockHere(thread, State::AtMbarrier, file, line);
  // Woken by maybeCompletePhase, which did the acquire.
  thread.waitBarrier = -1;
}

void bulkCopy(unsigned shared, const void *global, unsigned bytes, unsigned mbarrier,
              const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  Launch &launch = *worker.launch;
  const auto source = reinterpret_cast<uintptr_t>(global);
  if (bytes == 0 || bytes % 16 != 0 || shared % 16 != 0 || source % 16 != 0) {
    report("memcheck",
           "cp.async.bulk of " + std::to_string(bytes) + " bytes from " + hex(source) + " to " +
               hex(shared) + ": the size must be a non-zero multiple of 16 and both addresses "
               "16-byte aligned",
           siteString(file, line), shared, true);
    return;
  }
  const int64_t offset = sharedOffset(worker, worker.windowBase + shared, bytes);
  if (offset < 0) {
    report("memcheck",
           "cp.async.bulk destination " + sharedDescription(worker, shared) + " + " +
               std::to_string(bytes) + " bytes is outside the block's shared memory",
           siteString(file, line), shared, true);
    return;
  }
  MBarrier *barrier = findMbarrier(worker, mbarrier, "cp.async.bulk", file, line);
  if (!barrier)
    return;
  if (!checkGlobal(worker, source, bytes, false, Site{file, line, nullptr}))
    return;
  const unsigned index = mbarrierIndex(worker, *barrier);
  SharedAccess how;
  how.bulkWriter = static_cast<uint16_t>(worker.threadCount + index + 1);
  how.bulkClock = barrier->phase + 1;
  if (launch.checks.racecheck || launch.checks.initcheck)
    checkShared(worker, thread, offset, bytes, SharedUse::BulkWrite, Site{file, line, nullptr},
                how);
  std::memcpy(worker.window.get() + offset, global, bytes);
  ++worker.counters.bulkCopies;
  worker.counters.bulkCopyBytes += bytes;
  // The copy completes its bytes on the barrier's current phase.
  barrier->tx -= bytes;
  maybeCompletePhase(worker, *barrier);
}

void fence(int kind, const char *, int) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  if (kind == PAGEDC_EMU_FENCE_PROXY_ASYNC) {
    thread.fenceClock = thread.clock;
    if (worker.ordering)
      thread.fencedVc = thread.vc;
    tick(worker, thread);
  }
  // fence.mbarrier_init orders the thread's inits before its later
  // releases; within one CTA the barrier that follows it is what the
  // checker requires (findMbarrier).
}

void namedBarrier(unsigned id, unsigned threads, int sync, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  const char *name = sync ? "bar.sync" : "bar.arrive";
  if (id == 0 || id > 15 || threads == 0 || threads % 32 != 0 || threads > worker.threadCount) {
    report("synccheck",
           std::string(name) + " " + std::to_string(id) + ", " + std::to_string(threads) +
               ": the id must be 1 to 15 (0 is __syncthreads') and the thread count a multiple "
               "of 32 up to the block's " +
               std::to_string(worker.threadCount),
           siteString(file, line), 0, true);
    return;
  }
  startOrdering(worker);
  NamedBarrier &named = worker.named[id];
  if (named.arrived == 0) {
    named.expected = threads;
    named.file = file;
    named.line = line;
    named.accumulated.assign(clockEntries(worker), 0);
  } else if (named.expected != threads && worker.launch->checks.synccheck) {
    report("synccheck",
           std::string(name) + " " + std::to_string(id) + " with " + std::to_string(threads) +
               " threads while others use it with " + std::to_string(named.expected) + " (" +
               siteString(named.file, named.line) + ")",
           siteString(file, line), 0, true);
    return;
  }
  maxInto(named.accumulated, thread.vc);
  tick(worker, thread);
  ++named.arrived;
  if (sync)
    named.waiters.push_back(thread.linear);
  if (named.arrived == named.expected) {
    for (unsigned t : named.waiters) {
      Thread &waiter = worker.threads[t];
      maxInto(waiter.vc, named.accumulated);
      if (&waiter != &thread)
        waiter.state = State::Runnable;
    }
    named.arrived = 0;
    named.waiters.clear();
    return;
  }
  if (sync)
    blockHere(thread, State::AtNamedBarrier, file, line);
}

/// Joins the rendezvous of the running thread's warpgroup; returns true for
/// the last of its 128 threads, which then computes the collective.
bool arriveWarpgroup(Collective kind, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  const unsigned group = thread.linear / 128;
  if ((group + 1) * 128 > worker.threadCount) {
    report("synccheck",
           std::string(collectiveName(kind)) + " by thread " + std::to_string(thread.linear) +
               ", whose warpgroup (threads " + std::to_string(group * 128) + "-" +
               std::to_string(group * 128 + 127) + ") is not whole in a block of " +
               std::to_string(worker.threadCount) + " threads",
           siteString(file, line), 0, true);
    return false;
  }
  if (worker.launch->checks.synccheck && worker.warps[thread.warp].kind != Collective::None) {
    report("synccheck",
           std::string(collectiveName(kind)) + " while lanes of this warp wait at " +
               collectiveName(worker.warps[thread.warp].kind),
           siteString(file, line), 0, true);
    return false;
  }
  GroupRendezvous &rendezvous = worker.warpgroups[group];
  if (rendezvous.kind == Collective::None) {
    rendezvous.kind = kind;
    rendezvous.file = file;
    rendezvous.line = line;
    rendezvous.arrived = 0;
  } else if (worker.launch->checks.synccheck &&
             (rendezvous.kind != kind || rendezvous.line != line ||
              std::strcmp(rendezvous.file, file) != 0)) {
    report("synccheck",
           std::string("divergent warpgroup collective: thread ") +
               std::to_string(thread.linear) + " reached " + collectiveName(kind) + " while " +
               std::to_string(rendezvous.arrived) + " threads of its warpgroup wait at " +
               collectiveName(rendezvous.kind) + " (" +
               siteString(rendezvous.file, rendezvous.line) + ")",
           siteString(file, line), 0, true);
    return false;
  }
  if (++rendezvous.arrived < 128) {
    blockHere(thread, State::AtCollective, file, line);
    return false;
  }
  return true;
}

void completeWarpgroup(Worker &worker, unsigned group) {
  worker.warpgroups[group] = GroupRendezvous{};
  for (unsigned t = group * 128; t < group * 128 + 128; ++t)
    if (&worker.threads[t] != currentThread)
      worker.threads[t].state = State::Runnable;
}

void wgmmaFence(const char *, int) { currentThread->wgmmaFenced = true; }

void wgmmaCommit(const char *, int) {
  Thread &thread = *currentThread;
  thread.wgmmaGroups.push_back(std::move(thread.wgmmaOpen));
  thread.wgmmaOpen.clear();
}

void wgmmaWait(int pending, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  if (pending < 0 || pending > 7) {
    report("synccheck", "wgmma.wait_group " + std::to_string(pending) + " (0 to 7)",
           siteString(file, line), 0, true);
    return;
  }
  const bool synccheck = worker.launch->checks.synccheck;
  while (thread.wgmmaGroups.size() > static_cast<size_t>(pending)) {
    for (const PendingWgmma &result : thread.wgmmaGroups.front()) {
      // On the GPU such a write races with the wgmma's own; here the
      // result would silently overwrite it.
      if (synccheck && !result.before.empty() &&
          std::memcmp(result.d, result.before.data(), result.before.size() * sizeof(float)) !=
              0)
        report("synccheck",
               "accumulator registers of a wgmma.mma_async written while it was in flight "
               "(before the wgmma.wait_group that retires it)",
               siteString(file, line), 0, false);
      std::memcpy(result.d, result.values.data(), result.values.size() * sizeof(float));
      // The operand reads are done: what this thread releases from now on
      // covers them.
      if (worker.ordering)
        thread.vc[result.reader] = std::max(thread.vc[result.reader], result.readClock);
      if (thread.linear == result.reader && thread.clock < result.readClock) {
        thread.clock = result.readClock;
        if (worker.ordering)
          thread.vc[thread.linear] = thread.clock;
      }
    }
    thread.wgmmaGroups.pop_front();
  }
  // Code after the wait reads and writes the accumulators: the next wgmma
  // needs a wgmma.fence first.
  thread.wgmmaFenced = false;
}

/// The shared offset of element (mn, k) of a wgmma operand in shared
/// memory (`mn` is the row of A or the column of B), from its matrix
/// descriptor; -1 (after a fatal report) when `bytes` from there are
/// outside.
int64_t operandOffset(Worker &worker, uint64_t descriptor, bool mnMajor, unsigned mn,
                      unsigned k, const char *file, int line, size_t bytes) {
  const uint64_t start = (descriptor & 0x3fffu) << 4;
  const uint64_t leading = ((descriptor >> 16) & 0x3fffu) << 4;
  const uint64_t stride = ((descriptor >> 32) & 0x3fffu) << 4;
  const unsigned swizzle = static_cast<unsigned>(descriptor >> 62);
  // Bytes of a swizzled row: 128, 64, 32 for modes 1, 2, 3.
  const unsigned rowBytes = swizzle == 0 ? 16 : 256u >> swizzle;
  uint64_t address;
  if (swizzle == 0) {
    // Core matrices of 8 rows x 16 bytes.
    if (!mnMajor)
      address = start + (mn % 8) * 16 + (mn / 8) * stride + (k % 8) * 2 + (k / 8) * leading;
    else
      address = start + (mn % 8) * 2 + (mn / 8) * stride + (k % 8) * 16 + (k / 8) * leading;
  } else if (!mnMajor) {
    address = start + (mn % 8) * rowBytes + (mn / 8) * stride + k * 2;
  } else {
    const unsigned perRow = rowBytes / 2;
    address = start + (mn % perRow) * 2 + (mn / perRow) * leading + (k % 8) * rowBytes +
              (k / 8) * stride;
  }
  if (swizzle != 0) {
    const unsigned bits = 4 - swizzle; // 3, 2, 1 bits of 16-byte chunk index
    const uint64_t mask = ((uint64_t(1) << bits) - 1) << 4;
    address ^= (address >> 3) & mask;
  }
  const int64_t offset = sharedOffset(worker, worker.windowBase + address, bytes);
  if (offset < 0)
    report("memcheck",
           "wgmma operand element at " + sharedDescription(worker, address) +
               " (descriptor " + hex(descriptor) + ") is outside the block's shared memory",
           siteString(file, line), address, true);
  return offset;
}

void wgmmaIssue(const PagedcEmuWgmma *op, float *d, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  const Checks &checks = worker.launch->checks;
  if (op->n < 8 || op->n > 256 || op->n % 8 != 0) {
    report("synccheck", "wgmma with N = " + std::to_string(op->n) + " (8 to 256, by 8)",
           siteString(file, line), 0, true);
    return;
  }
  if (op->a_in_registers && op->trans_a) {
    report("synccheck", "wgmma with A in registers must be K-major (imm-trans-a = 0)",
           siteString(file, line), 0, true);
    return;
  }
  if (!thread.wgmmaFenced && checks.synccheck)
    report("synccheck",
           "wgmma.mma_async without a wgmma.fence since this thread's last wgmma.wait_group "
           "(or the kernel's start): its accumulator and A registers may not be ready",
           siteString(file, line), 0, false);
  thread.wgmmaOp = *op;
  thread.wgmmaD = d;
  if (!arriveWarpgroup(Collective::Wgmma, file, line))
    return;
  const unsigned group = thread.linear / 128, first = group * 128;
  Thread &leader = worker.threads[first];
  const PagedcEmuWgmma &shape = leader.wgmmaOp;
  for (unsigned t = first; t < first + 128; ++t) {
    const PagedcEmuWgmma &other = worker.threads[t].wgmmaOp;
    if (checks.synccheck &&
        (other.n != shape.n || other.bf16 != shape.bf16 ||
         other.a_in_registers != shape.a_in_registers || other.trans_a != shape.trans_a ||
         other.trans_b != shape.trans_b || other.scale_d != shape.scale_d ||
         other.desc_b != shape.desc_b || (!shape.a_in_registers && other.desc_a != shape.desc_a))) {
      reportedThread = &worker.threads[t];
      report("synccheck",
             "the threads of warpgroup " + std::to_string(group) +
                 " issue different wgmma operations (shape, types or descriptors)",
             siteString(file, line), 0, true);
      return;
    }
  }
  // The warpgroup acts as one: each thread acquires what the others did.
  if (worker.ordering)
    joinClocks(worker, first, 128);
  // The operand reads are the async proxy's, attributed to the
  // warpgroup's first thread with a clock it reaches only at its
  // wgmma.wait_group: a release before the wait does not cover them.
  SharedAccess how;
  how.asyncProxy = true;
  how.clock = leader.clock + 1;
  how.fencedFirst = first;
  how.fencedCount = 128;
  const unsigned n = shape.n;
  const bool bf16 = shape.bf16 != 0;
  // The operands as doubles (bf16 and f16 values are exact in them).
  std::vector<double> A(64 * 16), B(16 * size_t(n));
  // Eight elements from (mn, k) on in the operand's contiguous direction
  // (k for K-major, mn for MN-major): one 16-byte chunk in every layout and
  // swizzle (the swizzle permutes whole chunks), read and checked at once;
  // element j goes to values[j * step].
  auto load = [&](uint64_t descriptor, bool mnMajor, unsigned mn, unsigned k, double *values,
                  size_t step) {
    const int64_t offset = operandOffset(worker, descriptor, mnMajor, mn, k, file, line, 16);
    if (offset < 0)
      return false;
    if (checks.racecheck || checks.initcheck)
      checkShared(worker, leader, offset, 16, SharedUse::Read, Site{file, line, nullptr}, how);
    uint16_t bits[8];
    std::memcpy(bits, worker.window.get() + offset, 16);
    for (unsigned j = 0; j < 8; ++j)
      values[j * step] = elementValue(bits[j], bf16);
    return !worker.aborted;
  };
  reportedThread = &leader;
  if (shape.a_in_registers) {
    for (unsigned t = 0; t < 128; ++t) {
      const unsigned *a = worker.threads[first + t].wgmmaOp.a;
      const unsigned row = 16 * (t / 32) + (t % 32) / 4, col = 2 * (t % 4);
      auto split = [&](unsigned word, unsigned r, unsigned c) {
        A[r * 16 + c] = elementValue(static_cast<uint16_t>(word & 0xffffu), bf16);
        A[r * 16 + c + 1] = elementValue(static_cast<uint16_t>(word >> 16), bf16);
      };
      split(a[0], row, col);
      split(a[1], row + 8, col);
      split(a[2], row, col + 8);
      split(a[3], row + 8, col + 8);
    }
  } else if (shape.trans_a) {
    for (unsigned m = 0; m < 64; m += 8)
      for (unsigned k = 0; k < 16; ++k)
        if (!load(shape.desc_a, true, m, k, &A[m * 16 + k], 16))
          return;
  } else {
    for (unsigned m = 0; m < 64; ++m)
      for (unsigned k = 0; k < 16; k += 8)
        if (!load(shape.desc_a, false, m, k, &A[m * 16 + k], 1))
          return;
  }
  if (shape.trans_b) {
    for (unsigned k = 0; k < 16; ++k)
      for (unsigned col = 0; col < n; col += 8)
        if (!load(shape.desc_b, true, col, k, &B[k * n + col], 1))
          return;
  } else {
    for (unsigned col = 0; col < n; ++col)
      for (unsigned k = 0; k < 16; k += 8)
        if (!load(shape.desc_b, false, col, k, &B[k * n + col], n))
          return;
  }
  reportedThread = nullptr;
  // D = A B (+ D): exact products, one rounding to f32 (as mma.sync). The
  // warpgroup's 64 x n tile is computed whole in double (each element: its
  // accumulator or 0, then the 16 products in k order, as one thread's sum
  // would), then handed out in the accumulator layout.
  auto rowOf = [](unsigned t, unsigned i) {
    return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2);
  };
  auto colOf = [](unsigned t, unsigned i) { return 8 * (i / 4) + 2 * (t % 4) + (i % 2); };
  std::vector<double> C(64 * size_t(n));
  std::vector<PendingWgmma> results(128);
  for (unsigned t = 0; t < 128; ++t) {
    Thread &member = worker.threads[first + t];
    PendingWgmma &result = results[t];
    result.d = member.wgmmaD;
    result.values.resize(n / 2);
    result.reader = first;
    result.readClock = how.clock;
    // The accumulators this wgmma adds to: the latest pending result for
    // the same registers (wgmmas of one warpgroup run in order), else the
    // registers themselves.
    const float *current = member.wgmmaD;
    for (auto group = member.wgmmaGroups.begin(); group != member.wgmmaGroups.end(); ++group)
      for (const PendingWgmma &earlier : *group)
        if (earlier.d == member.wgmmaD)
          current = earlier.values.data();
    for (const PendingWgmma &earlier : member.wgmmaOpen)
      if (earlier.d == member.wgmmaD)
        current = earlier.values.data();
    if (current == member.wgmmaD)
      result.before.assign(current, current + n / 2);
    for (unsigned i = 0; i < n / 2; ++i)
      C[rowOf(t, i) * n + colOf(t, i)] = shape.scale_d ? static_cast<double>(current[i]) : 0.0;
  }
  for (unsigned row = 0; row < 64; ++row) {
    double *out = &C[row * size_t(n)];
    for (unsigned k = 0; k < 16; ++k) {
      const double a = A[row * 16 + k];
      const double *b = &B[k * size_t(n)];
      for (unsigned col = 0; col < n; ++col)
        out[col] += a * b[col];
    }
  }
  for (unsigned t = 0; t < 128; ++t) {
    PendingWgmma &result = results[t];
    for (unsigned i = 0; i < n / 2; ++i)
      result.values[i] = static_cast<float>(C[rowOf(t, i) * n + colOf(t, i)]);
    worker.threads[first + t].wgmmaOpen.push_back(std::move(result));
  }
  ++worker.counters.wgmma;
  worker.counters.wgmmaFlop += 2ull * 64 * n * 16;
  worker.counters.wgmmaSharedBytes += (shape.a_in_registers ? 0 : 64 * 16 * 2) + 16 * n * 2;
  completeWarpgroup(worker, group);
}

void setmaxnreg(unsigned count, int increase, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  if (count < 24 || count > 256 || count % 8 != 0) {
    report("synccheck",
           std::string("setmaxnreg.") + (increase ? "inc" : "dec") + " " + std::to_string(count) +
               ": the count must be 24 to 256 and a multiple of 8",
           siteString(file, line), 0, true);
    return;
  }
  thread.maskArgument = count | (increase ? 0x10000u : 0u);
  if (!arriveWarpgroup(Collective::Setmaxnreg, file, line))
    return;
  const unsigned group = thread.linear / 128;
  for (unsigned t = group * 128; t < group * 128 + 128; ++t)
    if (worker.threads[t].maskArgument != thread.maskArgument &&
        worker.launch->checks.synccheck) {
      reportedThread = &worker.threads[t];
      report("synccheck", "the threads of warpgroup " + std::to_string(group) +
                              " ask setmaxnreg for different register counts",
             siteString(file, line), 0, true);
      return;
    }
  completeWarpgroup(worker, group);
}

/// cp.async.bulk.tensor (tile mode, global -> shared).
void bulkTensorCopy(unsigned shared, const void *tensorMap, const int *coordinates, int rank,
                    unsigned mbarrier, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  Launch &launch = *worker.launch;
  TensorMap map;
  if (!decodeTensorMap(tensorMap, &map)) {
    report("memcheck",
           "cp.async.bulk.tensor with a tensor map the emulated cuTensorMapEncodeTiled did not "
           "write (or a copy of it in a register that changed)",
           siteString(file, line), shared, true);
    return;
  }
  if (static_cast<unsigned>(rank) != map.rank) {
    report("synccheck",
           "cp.async.bulk.tensor." + std::to_string(rank) + "d with a tensor map of rank " +
               std::to_string(map.rank),
           siteString(file, line), shared, true);
    return;
  }
  if (shared % 128 != 0) {
    report("memcheck", "cp.async.bulk.tensor destination " + hex(shared) +
                           " is not 128-byte aligned",
           siteString(file, line), shared, true);
    return;
  }
  uint64_t rows = 1;
  for (unsigned d = 1; d < map.rank; ++d)
    rows *= map.box[d];
  const uint64_t rowBytes = uint64_t(map.box[0]) * map.elementBytes;
  const uint64_t bytes = rows * rowBytes;
  const int64_t offset = sharedOffset(worker, worker.windowBase + shared, bytes);
  if (offset < 0) {
    report("memcheck",
           "cp.async.bulk.tensor box of " + std::to_string(bytes) + " bytes at " +
               sharedDescription(worker, shared) + " is outside the block's shared memory",
           siteString(file, line), shared, true);
    return;
  }
  MBarrier *barrier = findMbarrier(worker, mbarrier, "cp.async.bulk.tensor", file, line);
  if (!barrier)
    return;
  // The box lands as rows of box[0] elements (outer dimensions in order),
  // each 16-byte chunk moved by the swizzle of its shared address;
  // elements outside the tensor are zeros.
  std::vector<unsigned char> box(bytes, 0);
  for (uint64_t row = 0; row < rows; ++row) {
    uint64_t rest = row;
    bool inside = true;
    uint64_t rowAddress = map.address;
    for (unsigned d = 1; d < map.rank; ++d) {
      const int64_t index = int64_t(coordinates[d]) + int64_t(rest % map.box[d]);
      rest /= map.box[d];
      if (index < 0 || uint64_t(index) >= map.dims[d]) {
        inside = false;
        break;
      }
      rowAddress += uint64_t(index) * map.strides[d];
    }
    if (!inside)
      continue;
    // The in-bounds run of dimension 0.
    const int64_t first = std::max<int64_t>(coordinates[0], 0);
    const int64_t last =
        std::min<int64_t>(int64_t(coordinates[0]) + map.box[0], int64_t(map.dims[0]));
    if (first >= last)
      continue;
    const uintptr_t source = rowAddress + uint64_t(first) * map.elementBytes;
    const size_t runBytes = size_t(last - first) * map.elementBytes;
    if (!checkGlobal(worker, source, runBytes, false, Site{file, line, nullptr}))
      return;
    std::memcpy(box.data() + row * rowBytes + size_t(first - coordinates[0]) * map.elementBytes,
                reinterpret_cast<const void *>(source), runBytes);
  }
  const unsigned index = mbarrierIndex(worker, *barrier);
  SharedAccess how;
  how.bulkWriter = static_cast<uint16_t>(worker.threadCount + index + 1);
  how.bulkClock = barrier->phase + 1;
  const uint64_t swizzleMask = map.swizzle ? ((uint64_t(1) << map.swizzle) - 1) << 4 : 0;
  for (uint64_t at = 0; at < bytes; at += 16) {
    uint64_t address = shared + at;
    address ^= (address >> 3) & swizzleMask;
    const uint64_t target = uint64_t(offset) + (address - shared);
    if (target + 16 > uint64_t(offset) + bytes) {
      report("memcheck", "cp.async.bulk.tensor: the swizzle moves a chunk past the box",
             siteString(file, line), shared, true);
      return;
    }
    if (launch.checks.racecheck || launch.checks.initcheck)
      checkShared(worker, thread, target, 16, SharedUse::BulkWrite, Site{file, line, nullptr},
                  how);
    std::memcpy(worker.window.get() + target, box.data() + at, 16);
  }
  ++worker.counters.bulkCopies;
  worker.counters.bulkCopyBytes += bytes;
  barrier->tx -= static_cast<int64_t>(bytes);
  maybeCompletePhase(worker, *barrier);
}

/// cp.async.mbarrier.arrive.noinc: the thread's cp.asyncs land now (as its
/// own writes) and the arrival releases them.
void cpAsyncMbarrierArrive(unsigned mbarrier, const char *file, int line) {
  Worker &worker = *currentWorker;
  Thread &thread = *currentThread;
  MBarrier *barrier =
      findMbarrier(worker, mbarrier, "cp.async.mbarrier.arrive.noinc", file, line);
  if (!barrier)
    return;
  for (auto &group : thread.groups)
    landGroup(worker, thread, group);
  thread.groups.clear();
  landGroup(worker, thread, thread.openGroup);
  thread.openGroup.clear();
  mbarrierArrive(mbarrier, 0, 0, file, line);
}

const PagedcEmuRuntime kRuntime = {
    PAGEDC_EMU_ABI_VERSION,
    &threadIndex,
    &dynamicShared,
    &staticShared,
    &sharedAddress,
    &syncthreads,
    &shflXor,
    &ballot,
    &ldmatrix,
    &mma16816,
    &cpAsync16,
    &cpAsyncCommit,
    &cpAsyncWait,
    &atomicAddI32,
    &approx,
    &onAccess,
    &onAccessRange,
    &mbarrierInit,
    &mbarrierArrive,
    &mbarrierExpectTx,
    &mbarrierWait,
    &bulkCopy,
    &fence,
    &namedBarrier,
    &wgmmaFence,
    &wgmmaCommit,
    &wgmmaWait,
    &wgmmaIssue,
    &setmaxnreg,
    &bulkTensorCopy,
    &cpAsyncMbarrierArrive,
    &tally,
};

//===----------------------------------------------------------------------===//
// Worker pool
//===----------------------------------------------------------------------===//

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

unsigned poolSize() {
  if (const char *text = std::getenv("PAGEDC_EMU_THREADS")) {
    int value = std::atoi(text);
    if (value >= 1)
      return static_cast<unsigned>(std::min(value, 256));
  }
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

int collectSegments(dl_phdr_info *info, size_t, void *data) {
  auto *module = static_cast<Module *>(data);
  if (info->dlpi_addr != module->loadBase)
    return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) &header = info->dlpi_phdr[i];
    if (header.p_type != PT_LOAD)
      continue;
    module->segments.push_back(
        {info->dlpi_addr + header.p_vaddr, info->dlpi_addr + header.p_vaddr + header.p_memsz});
  }
  return 1;
}

} // namespace

//===----------------------------------------------------------------------===//
// Public interface
//===----------------------------------------------------------------------===//

namespace {
constexpr uint64_t kTensorMapMagic = 0x50414d5443444750ull; // "PGDCTMAP"
} // namespace

std::string encodeTensorMap(void *map128, const TensorMap &map) {
  if (map.rank < 1 || map.rank > 5)
    return "tensorRank " + std::to_string(map.rank) + " (1 to 5)";
  if (map.elementBytes != 1 && map.elementBytes != 2 && map.elementBytes != 4 &&
      map.elementBytes != 8)
    return "element size " + std::to_string(map.elementBytes) + " bytes";
  if (map.address % 16 != 0)
    return "globalAddress " + hex(map.address) + " is not 16-byte aligned";
  if (map.swizzle > 3)
    return "swizzle " + std::to_string(map.swizzle) + " (0 to 3)";
  for (unsigned d = 0; d < map.rank; ++d) {
    if (map.dims[d] == 0 || map.dims[d] > (uint64_t(1) << 32))
      return "globalDim[" + std::to_string(d) + "] = " + std::to_string(map.dims[d]) +
             " (1 to 2^32)";
    if (map.box[d] == 0 || map.box[d] > 256)
      return "boxDim[" + std::to_string(d) + "] = " + std::to_string(map.box[d]) +
             " (1 to 256)";
    if (d > 0 && (map.strides[d] % 16 != 0 || map.strides[d] >= (uint64_t(1) << 40)))
      return "globalStrides[" + std::to_string(d - 1) + "] = " +
             std::to_string(map.strides[d]) + " (a multiple of 16 below 2^40)";
  }
  const uint64_t innerBytes = uint64_t(map.box[0]) * map.elementBytes;
  if (innerBytes % 16 != 0)
    return "boxDim[0] * element size = " + std::to_string(innerBytes) +
           " bytes, not a multiple of 16";
  if (map.swizzle && innerBytes > (16u << map.swizzle))
    return "boxDim[0] * element size = " + std::to_string(innerBytes) +
           " bytes exceeds the swizzle span of " + std::to_string(16u << map.swizzle);
  unsigned char bytes[128] = {};
  std::memcpy(bytes, &kTensorMapMagic, 8);
  std::memcpy(bytes + 8, &map.address, 8);
  std::memcpy(bytes + 16, map.dims, 40);
  std::memcpy(bytes + 56, map.strides, 40);
  for (unsigned d = 0; d < 5; ++d) {
    const uint16_t box = static_cast<uint16_t>(map.box[d]);
    std::memcpy(bytes + 96 + 2 * d, &box, 2);
  }
  bytes[106] = static_cast<unsigned char>(map.rank);
  bytes[107] = static_cast<unsigned char>(map.elementBytes);
  bytes[108] = static_cast<unsigned char>(map.swizzle);
  std::memcpy(map128, bytes, 128);
  return "";
}

bool decodeTensorMap(const void *map128, TensorMap *map) {
  const auto *bytes = static_cast<const unsigned char *>(map128);
  uint64_t magic;
  std::memcpy(&magic, bytes, 8);
  if (magic != kTensorMapMagic)
    return false;
  std::memcpy(&map->address, bytes + 8, 8);
  std::memcpy(map->dims, bytes + 16, 40);
  std::memcpy(map->strides, bytes + 56, 40);
  for (unsigned d = 0; d < 5; ++d) {
    uint16_t box;
    std::memcpy(&box, bytes + 96 + 2 * d, 2);
    map->box[d] = box;
  }
  map->rank = bytes[106];
  map->elementBytes = bytes[107];
  map->swizzle = bytes[108];
  return map->rank >= 1 && map->rank <= 5;
}

Checks Checks::fromEnvironment() {
  Checks checks;
  const char *text = std::getenv("PAGEDC_EMU_CHECKS");
  if (!text || !*text || std::strcmp(text, "all") == 0)
    return checks;
  checks.memcheck = checks.racecheck = checks.initcheck = checks.synccheck = false;
  std::string list = text;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item == "memcheck")
      checks.memcheck = true;
    else if (item == "racecheck")
      checks.racecheck = true;
    else if (item == "initcheck")
      checks.initcheck = true;
    else if (item == "synccheck")
      checks.synccheck = true;
  }
  return checks;
}

std::string Report::format() const {
  std::string text = "pagedc-emu: " + checker + ": " + message + "\n    at " + location + " in " +
                     kernel + ", block (" + std::to_string(block[0]) + "," +
                     std::to_string(block[1]) + "," + std::to_string(block[2]) + "), thread (" +
                     std::to_string(thread[0]) + "," + std::to_string(thread[1]) + "," +
                     std::to_string(thread[2]) + ")";
  if (address)
    text += ", address " + hex(address);
  if (count > 1)
    text += " (" + std::to_string(count) + " times)";
  return text;
}

void Counters::add(const Counters &o) {
  gridBlocks = std::max(gridBlocks, o.gridBlocks);
  blocks += o.blocks;
  threads += o.threads;
  mma += o.mma;
  ldmatrix += o.ldmatrix;
  ldmatrixWavefronts += o.ldmatrixWavefronts;
  ldmatrixIdealWavefronts += o.ldmatrixIdealWavefronts;
  sharedLoadBytes += o.sharedLoadBytes;
  sharedStoreBytes += o.sharedStoreBytes;
  sharedRequests += o.sharedRequests;
  sharedWavefronts += o.sharedWavefronts;
  sharedIdealWavefronts += o.sharedIdealWavefronts;
  globalLoadBytes += o.globalLoadBytes;
  globalStoreBytes += o.globalStoreBytes;
  globalRequests += o.globalRequests;
  globalSectorsRequested += o.globalSectorsRequested;
  globalSectorsUnique += o.globalSectorsUnique;
  cpAsync += o.cpAsync;
  cpAsyncBytes += o.cpAsyncBytes;
  cpAsyncZeroFillBytes += o.cpAsyncZeroFillBytes;
  wgmma += o.wgmma;
  wgmmaFlop += o.wgmmaFlop;
  wgmmaSharedBytes += o.wgmmaSharedBytes;
  bulkCopies += o.bulkCopies;
  bulkCopyBytes += o.bulkCopyBytes;
  barriers += o.barriers;
  shuffles += o.shuffles;
  ballots += o.ballots;
  atomics += o.atomics;
  transcendentals += o.transcendentals;
  tilesKept += o.tilesKept;
  tilesMasked += o.tilesMasked;
  rowGroupsRescaled += o.rowGroupsRescaled;
}

std::string Counters::json() const {
  std::string text = "{";
  auto field = [&](const char *name, uint64_t value) {
    if (text.size() > 1)
      text += ", ";
    text += "\"" + std::string(name) + "\": " + std::to_string(value);
  };
  field("grid_blocks", gridBlocks);
  field("blocks", blocks);
  field("threads", threads);
  field("mma", mma);
  field("ldmatrix", ldmatrix);
  field("ldmatrix_wavefronts", ldmatrixWavefronts);
  field("ldmatrix_ideal_wavefronts", ldmatrixIdealWavefronts);
  field("shared_load_bytes", sharedLoadBytes);
  field("shared_store_bytes", sharedStoreBytes);
  field("shared_requests", sharedRequests);
  field("shared_wavefronts", sharedWavefronts);
  field("shared_ideal_wavefronts", sharedIdealWavefronts);
  field("global_load_bytes", globalLoadBytes);
  field("global_store_bytes", globalStoreBytes);
  field("global_requests", globalRequests);
  field("global_sectors_requested", globalSectorsRequested);
  field("global_sectors_unique", globalSectorsUnique);
  field("cp_async", cpAsync);
  field("cp_async_bytes", cpAsyncBytes);
  field("cp_async_zero_fill_bytes", cpAsyncZeroFillBytes);
  field("wgmma", wgmma);
  field("wgmma_flop", wgmmaFlop);
  field("wgmma_shared_bytes", wgmmaSharedBytes);
  field("bulk_copies", bulkCopies);
  field("bulk_copy_bytes", bulkCopyBytes);
  field("barriers", barriers);
  field("shuffles", shuffles);
  field("ballots", ballots);
  field("atomics", atomics);
  field("transcendentals", transcendentals);
  field("tiles_kept", tilesKept);
  field("tiles_masked", tilesMasked);
  field("row_groups_rescaled", rowGroupsRescaled);
  return text + "}";
}

void *allocate(size_t bytes) {
  const size_t size = std::max<size_t>(bytes, 1);
  // 256-byte alignment as cuMemAlloc gives; nothing past the end belongs
  // to the allocation, so any overrun is outside every allocation.
  void *memory = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (!memory)
    return nullptr;
  auto allocation = std::make_unique<Allocation>();
  allocation->base = reinterpret_cast<uintptr_t>(memory);
  allocation->bytes = size;
  // The initcheck shadow only when initcheck may run (it doubles memory).
  const bool tracked = Checks::fromEnvironment().initcheck;
  if (tracked)
    allocation->written.reset(new (std::nothrow) uint8_t[size]());
  allocation->sectorWords = (size + 32 * 64 - 1) / (32 * 64);
  allocation->sectors.reset(new (std::nothrow) std::atomic<uint64_t>[allocation->sectorWords]);
  if ((tracked && !allocation->written) || !allocation->sectors) {
    std::free(memory);
    return nullptr;
  }
  for (size_t i = 0; i < allocation->sectorWords; ++i)
    allocation->sectors[i].store(0, std::memory_order_relaxed);
  // Garbage, so that a read of never-written memory does not look like 0.
  std::memset(memory, 0xcd, size);
  std::unique_lock<std::shared_mutex> lock(memoryMutex);
  allocation->serial = ++allocationSerial;
  allocations()[allocation->base] = std::move(allocation);
  return memory;
}

bool release(void *pointer) {
  std::unique_ptr<Allocation> allocation;
  {
    std::unique_lock<std::shared_mutex> lock(memoryMutex);
    auto found = allocations().find(reinterpret_cast<uintptr_t>(pointer));
    if (found == allocations().end())
      return false;
    allocation = std::move(found->second);
    allocations().erase(found);
  }
  std::free(pointer);
  return true;
}

bool markWritten(const void *pointer, size_t bytes) {
  if (bytes == 0)
    return true;
  std::shared_lock<std::shared_mutex> lock(memoryMutex);
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  Allocation *allocation = findAllocation(address);
  if (!allocation || address - allocation->base + bytes > allocation->bytes)
    return false;
  if (allocation->written)
    std::memset(allocation->written.get() + (address - allocation->base), 1, bytes);
  return true;
}

bool isAllocated(const void *pointer, size_t bytes) {
  std::shared_lock<std::shared_mutex> lock(memoryMutex);
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  Allocation *allocation = findAllocation(address);
  return allocation && address - allocation->base + bytes <= allocation->bytes;
}

std::shared_ptr<Module> loadModule(const void *image, std::string *error) {
  auto fail = [&](std::string why) -> std::shared_ptr<Module> {
    if (error)
      *error = std::move(why);
    return nullptr;
  };
  if (!image)
    return fail("no image");
  const auto *bytes = static_cast<const unsigned char *>(image);
  if (std::memcmp(bytes, PAGEDC_EMU_IMAGE_MAGIC, 16) != 0)
    return fail("not an emulator image (a cubin or PTX image cannot run on the emulator; "
                "build the kernel for the emulator)");
  uint64_t size = 0;
  for (int i = 0; i < 8; ++i)
    size |= static_cast<uint64_t>(bytes[16 + i]) << (8 * i);
  if (size == 0 || size > (uint64_t(1) << 31))
    return fail("emulator image with an implausible size");
  auto module = std::make_shared<Module>();
  module->memfd = memfd_create("pagedc-emu-kernel.so", MFD_CLOEXEC);
  if (module->memfd < 0)
    return fail(std::string("memfd_create failed: ") + std::strerror(errno));
  const unsigned char *data = bytes + PAGEDC_EMU_IMAGE_HEADER_BYTES;
  for (uint64_t written = 0; written < size;) {
    ssize_t n = write(module->memfd, data + written, size - written);
    if (n <= 0)
      return fail(std::string("writing the image failed: ") + std::strerror(errno));
    written += static_cast<uint64_t>(n);
  }
  module->path = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(module->memfd);
  module->handle = dlopen(("/proc/self/fd/" + std::to_string(module->memfd)).c_str(),
                          RTLD_NOW | RTLD_LOCAL);
  if (!module->handle)
    return fail(std::string("loading the emulator image failed: ") + dlerror());
  auto bind = reinterpret_cast<PagedcEmuBindFunction>(dlsym(module->handle, "pagedc_emu_image_bind"));
  if (!bind)
    return fail("the emulator image has no pagedc_emu_image_bind");
  if (int version = bind(&kRuntime); version != 0)
    return fail("the emulator image has ABI version " + std::to_string(version) +
                ", this emulator " + std::to_string(PAGEDC_EMU_ABI_VERSION));
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(bind), &info) && info.dli_fbase)
    module->loadBase = reinterpret_cast<uintptr_t>(info.dli_fbase);
  dl_iterate_phdr(&collectSegments, module.get());
  return module;
}

const Kernel *findKernel(const Module &module, const std::string &name) {
  std::lock_guard<std::mutex> lock(module.kernelsMutex);
  auto found = module.kernels.find(name);
  if (found != module.kernels.end())
    return found->second.get();
  auto entry =
      reinterpret_cast<PagedcEmuEntryFunction>(dlsym(module.handle, ("pagedc_emu_entry_" + name).c_str()));
  auto sizes = reinterpret_cast<PagedcEmuParamsFunction>(
      dlsym(module.handle, ("pagedc_emu_params_" + name).c_str()));
  if (!entry || !sizes)
    return nullptr;
  auto kernel = std::make_unique<Kernel>();
  kernel->name = name;
  kernel->entry = entry;
  kernel->module = &module;
  unsigned count = 0;
  const unsigned long *list = sizes(&count);
  kernel->parameterSizes.assign(list, list + count);
  return module.kernels.emplace(name, std::move(kernel)).first->second.get();
}

LaunchResult launch(const Kernel &kernel, const LaunchConfig &config, void **params,
                    const Checks &checks) {
  LaunchResult result;
  const auto start = std::chrono::steady_clock::now();
  const uint64_t threads = uint64_t(config.block[0]) * config.block[1] * config.block[2];
  const uint64_t blocks = uint64_t(config.grid[0]) * config.grid[1] * config.grid[2];
  if (threads == 0 || threads > kMaxThreads || blocks == 0) {
    result.ok = false;
    result.error = "invalid launch: block of " + std::to_string(threads) + " threads (1.." +
                   std::to_string(kMaxThreads) + "), grid of " + std::to_string(blocks) + " blocks";
    return result;
  }
  if (config.dynamicSharedBytes > config.maxDynamicSharedBytes ||
      config.dynamicSharedBytes > kMaxDynamicShared) {
    result.ok = false;
    result.error = "invalid launch: " + std::to_string(config.dynamicSharedBytes) +
                   " bytes of dynamic shared memory, over the kernel's limit of " +
                   std::to_string(std::min(config.maxDynamicSharedBytes, kMaxDynamicShared));
    return result;
  }
  Launch state;
  state.kernel = &kernel;
  state.config = config;
  state.checks = checks;
  state.blockCount = blocks;
  state.serial = ++launchSerial;
  state.runBlocks = config.sampleBlocks && config.sampleBlocks < blocks ? config.sampleBlocks
                                                                        : blocks;
  state.staticBase = (config.dynamicSharedBytes + 127) / 128 * 128;
  // Copy the parameters, as the driver does at launch.
  size_t total = 0;
  for (unsigned long size : kernel.parameterSizes)
    total += (size + 15) / 16 * 16;
  state.parameterBytes.resize(std::max<size_t>(total, 1));
  size_t at = 0;
  for (size_t i = 0; i < kernel.parameterSizes.size(); ++i) {
    std::memcpy(state.parameterBytes.data() + at, params[i], kernel.parameterSizes[i]);
    state.parameterPointers.push_back(state.parameterBytes.data() + at);
    at += (kernel.parameterSizes[i] + 15) / 16 * 16;
  }
  // Fresh sector maps for the unique-sector counter.
  {
    std::shared_lock<std::shared_mutex> lock(memoryMutex);
    for (auto &entry : allocations())
      for (size_t i = 0; i < entry.second->sectorWords; ++i)
        entry.second->sectors[i].store(0, std::memory_order_relaxed);
  }
  const unsigned workers =
      static_cast<unsigned>(std::min<uint64_t>(poolSize(), state.runBlocks));
  std::mutex totalMutex;
  if (workers <= 1) {
    workerLoop(state, result.counters, totalMutex);
  } else {
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < workers; ++i)
      pool.emplace_back([&] { workerLoop(state, result.counters, totalMutex); });
    for (std::thread &thread : pool)
      thread.join();
  }
  {
    std::shared_lock<std::shared_mutex> lock(memoryMutex);
    for (auto &entry : allocations())
      for (size_t i = 0; i < entry.second->sectorWords; ++i)
        result.counters.globalSectorsUnique +=
            __builtin_popcountll(entry.second->sectors[i].load(std::memory_order_relaxed));
  }
  result.counters.gridBlocks = blocks;
  result.reports = std::move(state.reports);
  result.ok = result.reports.empty() && !state.aborted;
  if (state.aborted && result.reports.empty())
    result.error = "the launch was aborted";
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

} // namespace pagedc::emu
