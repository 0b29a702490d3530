//===- Hopper.cpp - sm_90 operations of the runtime table -----------------===//
//
// mbarriers (init, arrive, expect_tx, the parity wait), bulk and
// tensor-map copies that complete on them, proxy fences, named barriers,
// wgmma (fence, commit, wait, and the warpgroup's 64 x N x 16 product
// with its shared operands read through their matrix descriptors and
// checked as async-proxy reads) and setmaxnreg. It is separate because
// it is the sm_90 half of the table, and the ordering beyond
// __syncthreads that these operations add (vector clocks, see
// Worker::ordering) is theirs.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"

namespace pagedc::emu::detail {

//===----------------------------------------------------------------------===//
// sm_90: mbarriers, bulk copies, fences, named barriers, wgmma, setmaxnreg
//===----------------------------------------------------------------------===//

namespace {

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

/// The index of an mbarrier in the block's list (its clock's slot).
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

} // namespace

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
    thread.fenceEpoch = worker.epoch;
    if (worker.ordering) {
      if (thread.fenceHistory.size() == kFenceHistory)
        thread.fenceHistory.pop_front();
      thread.fenceHistory.emplace_back(thread.clock, thread.vc);
      thread.fencedVc = thread.vc;
    }
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

namespace {

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

/// Wakes the other threads of a completed warpgroup collective.
void completeWarpgroup(Worker &worker, unsigned group) {
  worker.warpgroups[group] = GroupRendezvous{};
  for (unsigned t = group * 128; t < group * 128 + 128; ++t)
    if (&worker.threads[t] != currentThread)
      worker.threads[t].state = State::Runnable;
}

} // namespace

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

namespace {

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

} // namespace

// One wgmma as the ISA defines it: operand descriptors decoded, every
// operand read checked (bounds, races, initialisation, wgmma.fence order),
// the products accumulated. The checks share the decoded state of the whole instruction,
// so they stay in one function.
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
  // .dec only releases registers and .inc only requests them: a count the
  // other way is undefined behaviour in the PTX ISA, which no compiler or
  // assembler sees (the warp's count is known only at run time).
  const std::string what = std::string("setmaxnreg.") + (increase ? "inc" : "dec") + " " +
                           std::to_string(count) + " by warpgroup " + std::to_string(group);
  for (unsigned w = 4 * group; w < 4 * group + 4; ++w) {
    const unsigned current = worker.warpRegisters[w];
    if (worker.launch->checks.synccheck && (increase ? count < current : count > current)) {
      reportedThread = &worker.threads[32 * w];
      report("synccheck",
             what + ": warp " + std::to_string(w) + " holds " + std::to_string(current) +
                 " registers per thread, so ." + (increase ? "inc" : "dec") + " would " +
                 (increase ? "lower" : "raise") + " its count (." + (increase ? "inc" : "dec") +
                 " must not go " + (increase ? "below" : "above") + " the warp's current count)",
             siteString(file, line), 0, true);
      return;
    }
  }
  // .inc waits until other warps' .dec have freed enough of the CTA's
  // pool; if none ever does, the block deadlocks (reportDeadlock says why).
  auto inUseAfter = [&]() {
    uint64_t total = 0;
    for (unsigned w = 0; w < worker.warpRegisters.size(); ++w)
      total += 32 * uint64_t(w / 4 == group ? count : worker.warpRegisters[w]);
    return total;
  };
  while (increase && worker.launch->checks.synccheck && inUseAfter() > worker.registerPool) {
    worker.registerWaiter[group] = static_cast<int>(thread.linear);
    blockHere(thread, State::AtCollective, file, line);
    worker.registerWaiter[group] = -1;
    if (worker.aborted)
      return;
  }
  for (unsigned w = 4 * group; w < 4 * group + 4; ++w)
    worker.warpRegisters[w] = count;
  if (!increase)
    for (unsigned g = 0; g < worker.registerWaiter.size(); ++g)
      if (worker.registerWaiter[g] >= 0)
        worker.threads[worker.registerWaiter[g]].state = State::Runnable;
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

} // namespace pagedc::emu::detail
