//===- EmulatorInternal.h - What the emulator's sources share ---*- C++ -*-===//
//
// The emulator is split along its seams: device memory and the memory
// checks (Memory.cpp), modules (Modules.cpp), the block scheduler and the
// worker pool (Scheduling.cpp), reports and request counters (Reports.cpp),
// the runtime table the kernel images call (RuntimeTable.cpp), the sm_90
// operations (Hopper.cpp) and the public interface (Emulator.cpp). This
// header is what they share: the per-launch and per-block state, the worker
// and thread running on this OS thread, and the functions one file calls in
// another. All of it is in pagedc::emu::detail with hidden visibility, as
// it was file-local before the split.
//
// Helpers on a per-access path (sharedOffset, orderedBefore, elementValue,
// tick, ...) are defined inline here, so their callers in every file inline
// them as before.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_EMU_EMULATORINTERNAL_H
#define PAGEDC_EMU_EMULATORINTERNAL_H

#include "pagedc-emu/Emulator.h"

#include "Fiber.h"
#include "pagedc-emu/KernelAbi.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#pragma GCC visibility push(hidden)

namespace pagedc::emu::detail {

//===----------------------------------------------------------------------===//
// Device memory (Memory.cpp)
//===----------------------------------------------------------------------===//

/// A device allocation (allocate) and its shadows.
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

/// Guards allocations(): shared by the checks, exclusive for allocate and
/// release.
extern std::shared_mutex memoryMutex;

/// The registered device allocations by base address (under memoryMutex).
std::map<uintptr_t, std::unique_ptr<Allocation>> &allocations();

/// The allocation holding `address`, or null (caller holds memoryMutex).
Allocation *findAllocation(uintptr_t address);

} // namespace pagedc::emu::detail

#pragma GCC visibility pop

namespace pagedc::emu {

//===----------------------------------------------------------------------===//
// Modules (Modules.cpp)
//===----------------------------------------------------------------------===//

namespace detail {

/// A loaded segment of a kernel image (its constant tables are readable).
struct Segment {
  uintptr_t begin, end;
};

} // namespace detail

/// A loaded kernel image: the dlopen'ed shared object and what the
/// emulator keeps about it.
class Module {
public:
  ~Module();
  void *handle = nullptr;
  int memfd = -1;
  std::string path;
  uintptr_t loadBase = 0;
  std::vector<detail::Segment> segments;
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

} // namespace pagedc::emu

#pragma GCC visibility push(hidden)

namespace pagedc::emu::detail {

//===----------------------------------------------------------------------===//
// Per-launch and per-block state
//===----------------------------------------------------------------------===//

/// Limits of the emulated device (the shared memory of an sm_90 SM, the
/// static __shared__ arrays, a block) and of a fiber's stack.
constexpr unsigned kMaxDynamicShared = 227 * 1024;
constexpr unsigned kStaticSharedLimit = 48 * 1024;
constexpr unsigned kWindowBytes = kMaxDynamicShared + kStaticSharedLimit + 128;
constexpr size_t kStackBytes = 128 * 1024;
constexpr unsigned kMaxThreads = 1024;

/// Where a fiber stands for the scheduler.
enum class State : uint8_t { Runnable, AtBarrier, AtCollective, AtMbarrier, AtNamedBarrier, Finished };

/// The collective a warp or warpgroup rendezvous is for.
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

/// The CUDA name of a collective, for reports (Reports.cpp).
const char *collectiveName(Collective kind);

/// A queued cp.async of 16 bytes (fewer valid, the rest zero-filled).
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

/// A CUDA thread: its fiber, where it waits, its collective operands,
/// queued copies and wgmmas, and its clocks.
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
  /// The __syncthreads epoch of that fence: generic stores of any thread
  /// from an earlier epoch were acquired before it, with or without clocks.
  uint32_t fenceEpoch = 0;
  /// Under ordering, the thread's last kFenceHistory fences (clock, vc
  /// then), oldest first: a bulk copy's issuer that acquired one of them
  /// sees the generic stores that fence covered (release and acquire carry
  /// a proxy fence's effect).
  std::deque<std::pair<uint32_t, std::vector<uint32_t>>> fenceHistory;
  int waitBarrier = -1;
  unsigned waitParity = 0;
  // wgmma: the operation at the rendezvous, open and committed groups.
  bool wgmmaFenced = false;
  PagedcEmuWgmma wgmmaOp{};
  float *wgmmaD = nullptr;
  std::vector<PendingWgmma> wgmmaOpen;
  std::deque<std::vector<PendingWgmma>> wgmmaGroups;
};

/// Fences a thread remembers for the bulk-write proxy check (a thread that
/// fences once a tile keeps the last few tiles' worth).
constexpr size_t kFenceHistory = 16;

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

/// The rendezvous of a warp collective (up to 32 lanes).
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
  /// Which of readEpoch's reads were the generic proxy's (not wgmma's):
  /// 1 reader, 2 reader2, 4 one of the readers past those two.
  uint8_t genericReads = 0;
};

/// Where an access comes from: a source site, or a return address in the
/// image that is symbolized only when a report needs it.
struct Site {
  const char *file = nullptr;
  int line = 0;
  const void *pc = nullptr;
};

/// One kernel launch: its configuration, parameters and findings, shared
/// by the workers running its blocks.
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

/// An OS thread of the pool and the block it runs: fibers, the shared
/// window and its shadow, barriers and counters.
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
  /// setmaxnreg: each warp's registers per thread now, and the CTA's pool
  /// (registers per thread at launch x threads) their sum must fit in.
  std::vector<unsigned> warpRegisters;
  uint64_t registerPool = 0;
  /// Per warpgroup: the thread that completed a setmaxnreg.inc rendezvous
  /// and waits for other warps' .dec to free registers (-1: none).
  std::vector<int> registerWaiter;
  bool aborted = false;
  uintptr_t windowBase = 0;
  unsigned dynamicBytes = 0;
  Counters counters;
  Allocation *lastAllocation = nullptr;
};

/// The worker on this OS thread (null outside a launch).
inline thread_local Worker *currentWorker = nullptr;
/// The fiber running now (null on the scheduler's own stack).
inline thread_local Thread *currentThread = nullptr;
/// The thread reports name when not the running one (ldmatrix rows are
/// attributed to the lane that gave the address).
inline thread_local Thread *reportedThread = nullptr;

/// Bytes of the static shared region: what the module has assigned so far.
inline unsigned staticLimit(const Worker &worker) {
  std::lock_guard<std::mutex> lock(worker.launch->kernel->module->staticMutex);
  return worker.launch->kernel->module->staticBytes;
}

//===----------------------------------------------------------------------===//
// Reports (Reports.cpp)
//===----------------------------------------------------------------------===//

/// "file:line" of a source site (the file's last path component), or "?".
std::string siteString(const char *file, int line);

/// Records a finding of `checker` for the running thread (or
/// reportedThread): repeats of one site and kind only count. A fatal one
/// aborts the launch and switches the fiber back to the scheduler.
void report(const char *checker, std::string message, std::string location, uint64_t address,
            bool fatal);

/// The source location of a return address in the running kernel's image.
std::string pcLocation(const void *pc);

/// The text of a Site: its file and line, else its symbolized pc.
std::string siteText(const Site &site);

/// "0x..." of a value.
std::string hex(uint64_t value);

/// Lanes of a mask as ranges ("0-3,8"), or "none".
std::string lanesString(unsigned mask);

//===----------------------------------------------------------------------===//
// Scheduling (Scheduling.cpp)
//===----------------------------------------------------------------------===//

/// Blocks the running fiber and returns to the block scheduler.
inline void blockHere(Thread &thread, State state, const char *file, int line) {
  thread.state = state;
  thread.waitFile = file;
  thread.waitLine = line;
  switchContext(thread.context, currentWorker->scheduler);
}

/// Vector clocks of a block that orders through mbarriers: every thread,
/// then one entry per mbarrier (its completed phases).
inline size_t clockEntries(const Worker &worker) { return worker.threadCount + kMaxMbarriers; }

/// Raises every entry of `into` to at least that of `from`.
inline void maxInto(std::vector<uint32_t> &into, const std::vector<uint32_t> &from) {
  for (size_t i = 0; i < into.size(); ++i)
    into[i] = std::max(into[i], from[i]);
}

/// Called at the block's first mbarrier or named barrier: from here on
/// the threads keep vector clocks.
inline void startOrdering(Worker &worker) {
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
inline void tick(Worker &worker, Thread &thread) {
  ++thread.clock;
  if (worker.ordering)
    thread.vc[thread.linear] = thread.clock;
}

/// Threads [first, first + count) synchronize: each acquires what all of
/// them did so far (__syncthreads, a warpgroup collective).
void joinClocks(Worker &worker, unsigned first, unsigned count);

/// Completes the block's __syncthreads: every waiting thread runs on.
void releaseBarrier(Worker &worker);

/// The worker pool's size: Settings::threads (PAGEDC_EMU_THREADS), else one
/// per core.
unsigned poolSize();

/// One pool thread of a launch: takes blocks until none are left and
/// adds its counters to `total`.
void workerLoop(Launch &launch, Counters &total, std::mutex &totalMutex);

//===----------------------------------------------------------------------===//
// Memory checks (Memory.cpp)
//===----------------------------------------------------------------------===//

/// The offset of [address, address + size) in the block's shared window,
/// or -1 when it is not inside the dynamic or the assigned static region.
inline int64_t sharedOffset(const Worker &worker, uintptr_t address, size_t size) {
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

/// Whether `address` falls in the block's shared window at all.
inline bool inWindow(const Worker &worker, uintptr_t address) {
  return address - worker.windowBase < kWindowBytes;
}

/// "shared offset 0x... (dynamic N bytes, static M bytes at 0x...)".
std::string sharedDescription(const Worker &worker, uint64_t offset);

/// What a checked shared access does.
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

/// Whether an access of `earlier` (thread id + 1, or an mbarrier's id) at
/// `clock` in `epoch` is ordered before what `thread` does now: the same
/// thread, a __syncthreads in between (threads only: a bulk copy completes
/// on its mbarrier, not at a barrier), or a release `thread` has acquired.
inline bool orderedBefore(const Worker &worker, const Thread &thread, uint16_t earlier,
                          uint32_t clock, uint32_t epoch) {
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
                 const Site &where, const SharedAccess &how = {});

/// Memcheck and initcheck of a global range; marks writes. Returns the
/// allocation, or null after a fatal report.
Allocation *checkGlobal(Worker &worker, uintptr_t address, size_t size, bool write,
                        const Site &where, bool atomic = false);

/// The runtime table's access hooks: every instrumented load and store,
/// and ranges (memcpy-like accesses) without an alignment check.
void onAccess(const void *pointer, unsigned long size, int flags, const void *pc);
void onAccessRange(const void *pointer, unsigned long size, int flags, const void *pc);

//===----------------------------------------------------------------------===//
// Counters of warp-level requests (Reports.cpp)
//===----------------------------------------------------------------------===//

/// Counts the warp's accesses since its last rendezvous as warp-level
/// requests (shared wavefronts, global sectors) and clears them.
void flushWarpAccesses(Worker &worker, unsigned warp);

//===----------------------------------------------------------------------===//
// The runtime table (RuntimeTable.cpp)
//===----------------------------------------------------------------------===//

/// Lands a committed cp.async group into shared memory (at its
/// wait_group, an mbarrier arrive, or the thread's exit).
void landGroup(Worker &worker, Thread &thread, const std::vector<AsyncCopy> &group);

/// The f32 value of a bf16 or f16 element (mma.sync and wgmma operands).
inline float elementValue(uint16_t bits, bool bf16) {
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

/// The function table handed to every kernel image at bind.
extern const PagedcEmuRuntime kRuntime;

//===----------------------------------------------------------------------===//
// sm_90 entry points of the runtime table (Hopper.cpp)
//===----------------------------------------------------------------------===//

/// mbarrier.init, .arrive[.expect_tx], .expect_tx, .try_wait.parity;
/// cp.async.bulk (global -> shared, completing on an mbarrier); fences;
/// bar.sync / bar.arrive with an id; wgmma.fence, .commit_group,
/// .wait_group, .mma_async; setmaxnreg; cp.async.bulk.tensor; and
/// cp.async.mbarrier.arrive.noinc.
void mbarrierInit(unsigned address, unsigned count, const char *file, int line);
void mbarrierArrive(unsigned address, int expectTx, unsigned txBytes, const char *file,
                    int line);
void mbarrierExpectTx(unsigned address, unsigned txBytes, const char *file, int line);
void mbarrierWait(unsigned address, unsigned parity, const char *file, int line);
void bulkCopy(unsigned shared, const void *global, unsigned bytes, unsigned mbarrier,
              const char *file, int line);
void fence(int kind, const char *, int);
void namedBarrier(unsigned id, unsigned threads, int sync, const char *file, int line);
void wgmmaFence(const char *, int);
void wgmmaCommit(const char *, int);
void wgmmaWait(int pending, const char *file, int line);
void wgmmaIssue(const PagedcEmuWgmma *op, float *d, const char *file, int line);
void setmaxnreg(unsigned count, int increase, const char *file, int line);
void bulkTensorCopy(unsigned shared, const void *tensorMap, const int *coordinates, int rank,
                    unsigned mbarrier, const char *file, int line);
void cpAsyncMbarrierArrive(unsigned mbarrier, const char *file, int line);

} // namespace pagedc::emu::detail

#pragma GCC visibility pop

#endif // PAGEDC_EMU_EMULATORINTERNAL_H
