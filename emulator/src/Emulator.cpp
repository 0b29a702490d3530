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

enum class State : uint8_t { Runnable, AtBarrier, AtCollective, Finished };
enum class Collective : uint8_t { None, Shuffle, Ballot, Ldmatrix, LdmatrixTrans, Mma };

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
struct SharedShadow {
  uint32_t writeEpoch = 0, readEpoch = 0;
  uint32_t writtenBlock = 0, asyncBlock = 0;
  uint16_t writer = 0, reader = 0;
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
  uint32_t blockSerial = 0;
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

/// "Prefill.cuh:123" for a return address in an image, through addr2line
/// (reports are rare; their cost does not matter).
std::string symbolize(const Module &module, const void *pc) {
  const auto offset = reinterpret_cast<uintptr_t>(pc) - module.loadBase - 1;
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

enum class SharedUse { Read, Write, Atomic, AsyncIssue };

/// Racecheck and initcheck of shared bytes [offset, offset + size) used by
/// `thread`; `where` locates the access for reports.
void checkShared(Worker &worker, Thread &thread, uint64_t offset, size_t size, SharedUse use,
                 const Site &where) {
  const uint32_t block = worker.blockSerial;
  const Checks &checks = worker.launch->checks;
  const uint16_t self = static_cast<uint16_t>(thread.linear + 1);
  bool raced = false, uninitialized = false;
  for (size_t i = 0; i < size; ++i) {
    SharedShadow &shadow = worker.shadow[offset + i];
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
        } else if (use == SharedUse::Read && shadow.writeEpoch == worker.epoch && shadow.writer &&
                   shadow.writer != self) {
          raced = true;
          report("racecheck",
                 "read-after-write hazard: " + sharedDescription(worker, offset + i) +
                     " written by thread " + std::to_string(shadow.writer - 1) +
                     " with no barrier in between",
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
          shadow.readEpoch = worker.epoch;
          shadow.reader = self;
          shadow.manyReaders = 0;
        } else if (shadow.reader != self) {
          shadow.manyReaders = 1;
        }
      } else {
        shadow.writtenBlock = block;
      }
      continue;
    }
    // Writes and cp.async issues.
    if (checks.racecheck && !raced) {
      const uint16_t asyncBy = shadow.asyncBlock == block ? shadow.asyncBy : 0;
      if (asyncBy && (use != SharedUse::AsyncIssue || asyncBy != self)) {
        raced = true;
        report("racecheck",
               "write to " + sharedDescription(worker, offset + i) +
                   " while a cp.async of thread " + std::to_string(asyncBy - 1) +
                   " into it has not landed",
               siteText(where), offset + i, false);
      } else if (shadow.writeEpoch == worker.epoch && shadow.writer && shadow.writer != self) {
        raced = true;
        report("racecheck",
               "write-after-write hazard: " + sharedDescription(worker, offset + i) +
                   " also written by thread " + std::to_string(shadow.writer - 1) +
                   " with no barrier in between",
               siteText(where), offset + i, false);
      } else if (shadow.readEpoch == worker.epoch && shadow.reader &&
                 (shadow.manyReaders || shadow.reader != self)) {
        raced = true;
        report("racecheck",
               "write-after-read hazard: " + sharedDescription(worker, offset + i) +
                   " read by thread " + std::to_string(shadow.reader - 1) +
                   (shadow.manyReaders ? " (and others)" : "") + " with no barrier in between",
               siteText(where), offset + i, false);
      }
    }
    if (use == SharedUse::AsyncIssue) {
      shadow.asyncBy = self;
      shadow.asyncBlock = block;
    } else {
      shadow.writtenBlock = block;
      shadow.writer = self;
      shadow.writeEpoch = worker.epoch;
    }
  }
}

/// Memcheck and initcheck of a global range; marks writes. Returns the
/// allocation, or null after a fatal report.
Allocation *checkGlobal(Worker &worker, uintptr_t address, size_t size, bool write,
                        const Site &where) {
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
  // read or written by another is a hazard.
  if (checks.racecheck && (write || allocation->blockWriters.load(std::memory_order_relaxed))) {
    if (std::atomic<uint64_t> *words = write ? blockWritersOf(*allocation)
                                             : allocation->blockWriters.load(
                                                   std::memory_order_acquire)) {
      const uint64_t mine = worker.blockTag;
      for (uintptr_t word = offset / 4; word <= (offset + size - 1) / 4; ++word) {
        const uint64_t other = write ? words[word].exchange(mine, std::memory_order_relaxed)
                                     : words[word].load(std::memory_order_relaxed);
        if (other == 0 || other == mine || (other >> 32) != (mine >> 32))
          continue;
        const uint64_t linear = (other & 0xffffffffu) - 1;
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
  size_t longest = 0;
  for (unsigned t = first; t < last; ++t)
    longest = std::max(longest, worker.threads[t].accesses.size());
  std::vector<const Access *> lanes;
  for (size_t k = 0; k < longest; ++k) {
    // The lanes' k-th accesses, one request per distinct instruction.
    std::map<const void *, std::vector<const Access *>> byInstruction;
    for (unsigned t = first; t < last; ++t)
      if (k < worker.threads[t].accesses.size())
        byInstruction[worker.threads[t].accesses[k].pc].push_back(
            &worker.threads[t].accesses[k]);
    for (auto &[pc, group] : byInstruction) {
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
  if (!checkGlobal(worker, address, 4, false, Site{file, line, nullptr}))
    return 0;
  checkGlobal(worker, address, 4, true, Site{file, line, nullptr});
  return __atomic_fetch_add(pointer, value, __ATOMIC_RELAXED);
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
  barriers += o.barriers;
  shuffles += o.shuffles;
  ballots += o.ballots;
  atomics += o.atomics;
  transcendentals += o.transcendentals;
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
  field("barriers", barriers);
  field("shuffles", shuffles);
  field("ballots", ballots);
  field("atomics", atomics);
  field("transcendentals", transcendentals);
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
