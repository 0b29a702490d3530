//===- RuntimeTable.cpp - The operations kernel images call ---------------===//
//
// The functions behind PagedcEmuRuntime (KernelAbi.h) up to sm_80:
// index variables, shared memory, __syncthreads, the warp collectives
// (shuffle, ballot, ldmatrix, mma.sync) computed by the last lane to
// arrive, cp.async and its groups, atomics and approximate math; and the
// table itself, which also points at the access hooks (Memory.cpp) and
// the sm_90 operations (Hopper.cpp). It is separate because it is the
// boundary to the kernel: each function runs on the fiber of the CUDA
// thread doing the operation.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"

#include <cmath>

namespace pagedc::emu::detail {

namespace {

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

} // namespace

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

namespace {

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

} // namespace

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

} // namespace pagedc::emu::detail
