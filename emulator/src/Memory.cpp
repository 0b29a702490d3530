//===- Memory.cpp - Device memory and the memory checks -------------------===//
//
// The registered device allocations (what cuMemAlloc hands out) with their
// initcheck and cross-block racecheck shadows, and the checks of every
// load and store a kernel makes: memcheck against the shared window, the
// allocations and the fiber's stack; racecheck and initcheck of shared
// bytes through the shadow; the global range checks. It is a file of its
// own because it is the emulator's hot path: onAccess and everything it
// calls per access (checkShared, checkGlobal) live here together, so the
// compiler sees them in one unit.
//
//===----------------------------------------------------------------------===//

#include "EmulatorInternal.h"

#include <cstdlib>
#include <new>

namespace pagedc::emu::detail {

//===----------------------------------------------------------------------===//
// Device memory
//===----------------------------------------------------------------------===//

namespace {

/// The allocation's per-word block tags (Allocation::blockWriters), made
/// on first use; null when out of memory.
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

uint64_t allocationSerial = 0;

} // namespace

std::shared_mutex memoryMutex;
std::map<uintptr_t, std::unique_ptr<Allocation>> &allocations() {
  static std::map<uintptr_t, std::unique_ptr<Allocation>> all;
  return all;
}

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
// Memory checks
//===----------------------------------------------------------------------===//

std::string sharedDescription(const Worker &worker, uint64_t offset) {
  return "shared offset " + hex(offset) + " (dynamic " + std::to_string(worker.dynamicBytes) +
         " bytes, static " + std::to_string(staticLimit(worker)) + " bytes at " +
         hex(worker.launch->staticBase) + ")";
}

namespace {

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

/// Whether the generic store of thread `writer` (index) at `clock` in
/// `epoch` is ordered before the async proxy's write by a bulk copy that
/// `issuer` issues now: a fence.proxy.async after the store by its writer,
/// by the issuer once it had acquired the store (a __syncthreads or a
/// release), or by another thread that had acquired it and whose release
/// after the fence the issuer acquired (the PTX memory model orders the
/// two proxies' writes through a proxy fence anywhere in the causality
/// order between them).
bool storeFencedForBulkWrite(const Worker &worker, const Thread &issuer, unsigned writer,
                             uint32_t clock, uint32_t epoch) {
  const Thread &stored = worker.threads[writer];
  if (stored.fenceClock >= clock)
    return true;
  if (issuer.fenceClock && (issuer.fenceEpoch > epoch ||
                            (writer < issuer.fencedVc.size() && issuer.fencedVc[writer] >= clock)))
    return true;
  if (!worker.ordering)
    return false;
  for (unsigned t = 0; t < worker.threadCount; ++t) {
    const Thread &fencer = worker.threads[t];
    if (&fencer == &issuer || t >= issuer.vc.size())
      continue;
    for (const auto &[fenceClock, seen] : fencer.fenceHistory)
      if (issuer.vc[t] > fenceClock && seen.size() > writer && seen[writer] >= clock)
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

bool misaligned(uintptr_t address, size_t size) {
  return (size == 2 || size == 4 || size == 8 || size == 16) && (address & (size - 1)) != 0;
}

} // namespace

namespace {

/// The shared-memory checks of one access, byte by byte: racecheck and
/// initcheck against each byte's shadow, then the shadow updated with this
/// access. At most one race and one uninitialized read are reported per
/// access.
class SharedAccessCheck {
public:
  SharedAccessCheck(Worker &worker, Thread &thread, SharedUse use, const Site &where,
                    const SharedAccess &how)
      : worker(worker), thread(thread), use(use), where(where), how(how),
        checks(worker.launch->checks), block(worker.blockSerial),
        self(static_cast<uint16_t>(thread.linear + 1)),
        clock(how.clock ? how.clock : thread.clock) {}

  void byte(uint64_t offset) {
    SharedShadow &shadow = worker.shadow[offset];
    if (use == SharedUse::Read || use == SharedUse::Atomic) {
      if (checks.racecheck && !raced)
        raced = readRace(shadow, offset);
      if (checks.initcheck && shadow.writtenBlock != block && !uninitialized) {
        uninitialized = true;
        report("initcheck", "read of " + sharedDescription(worker, offset) + " never written",
               siteText(where), offset, false);
      }
      if (use == SharedUse::Read)
        recordRead(shadow, offset);
      else
        shadow.writtenBlock = block;
      return;
    }
    // Writes, cp.async issues and bulk copies (checked as the issuing
    // thread's writes).
    if (checks.racecheck && !raced)
      raced = writeRace(shadow, offset);
    recordWrite(shadow);
  }

private:
  Worker &worker;
  Thread &thread;
  const SharedUse use;
  const Site &where;
  const SharedAccess &how;
  const Checks &checks;
  const uint32_t block;
  const uint16_t self;
  const uint32_t clock;
  bool raced = false, uninitialized = false;
  // The bytes of a chunk come from one store: its proxy-fence answer once.
  unsigned fencedWriter = ~0u;
  uint32_t fencedClock = 0, fencedEpoch = 0;
  bool fencedAnswer = false;

  bool written(const SharedShadow &shadow) const {
    return shadow.writtenBlock == block && shadow.writer;
  }

  bool fencedForBulkWrite(unsigned writer, uint32_t writerClock, uint32_t epoch) {
    if (writer != fencedWriter || writerClock != fencedClock || epoch != fencedEpoch) {
      fencedWriter = writer;
      fencedClock = writerClock;
      fencedEpoch = epoch;
      fencedAnswer = storeFencedForBulkWrite(worker, thread, writer, writerClock, epoch);
    }
    return fencedAnswer;
  }

  /// Reports a read (or atomic) of the byte that no ordering puts after its
  /// last write or cp.async; true if it did.
  bool readRace(const SharedShadow &shadow, uint64_t offset) {
    const uint16_t asyncBy = shadow.asyncBlock == block ? shadow.asyncBy : 0;
    if (asyncBy && asyncBy != self) {
      report("racecheck",
             "read of " + sharedDescription(worker, offset) + " while a cp.async of thread " +
                 std::to_string(asyncBy - 1) +
                 " into it has not landed (no cp.async.wait_group + barrier in between)",
             siteText(where), offset, false);
      return true;
    }
    if (asyncBy == self) {
      report("racecheck",
             "read of " + sharedDescription(worker, offset) +
                 " before this thread's own cp.async into it was waited for",
             siteText(where), offset, false);
      return true;
    }
    if (use == SharedUse::Read && written(shadow) &&
        !orderedBefore(worker, thread, shadow.writer, shadow.writerClock, shadow.writeEpoch)) {
      if (shadow.writer > worker.threadCount)
        report("racecheck",
               "read before the mbarrier phase that delivers it: " +
                   sharedDescription(worker, offset) + " is written by " +
                   bulkWriterDescription(worker, shadow.writer, shadow.writerClock) +
                   ", which this thread has not waited for",
               siteText(where), offset, false);
      else
        report("racecheck",
               "read-after-write hazard: " + sharedDescription(worker, offset) +
                   " written by thread " + std::to_string(shadow.writer - 1) +
                   (worker.ordering ? " with no barrier or mbarrier ordering in between"
                                    : " with no barrier in between"),
               siteText(where), offset, false);
      return true;
    }
    if (how.asyncProxy && written(shadow) && shadow.writer <= worker.threadCount &&
        worker.threads[shadow.writer - 1].fenceClock < shadow.writerClock &&
        !readerFenced(worker, how, shadow.writer - 1u, shadow.writerClock)) {
      report("racecheck",
             "async-proxy read of a generic store with no proxy fence: wgmma reads " +
                 sharedDescription(worker, offset) + ", which thread " +
                 std::to_string(shadow.writer - 1) +
                 " stored, with no fence.proxy.async.shared::cta by that thread after the "
                 "store nor by the reading warpgroup after it acquired the store",
             siteText(where), offset, false);
      return true;
    }
    return false;
  }

  /// Adds this thread to the byte's readers (two kept inline, more in
  /// worker.manyReaders when ordering is tracked).
  void recordRead(SharedShadow &shadow, uint64_t offset) {
    const uint8_t generic = how.asyncProxy ? 0 : 1;
    if (shadow.readEpoch != worker.epoch) {
      if (shadow.manyReaders)
        worker.manyReaders.erase(offset);
      shadow.readEpoch = worker.epoch;
      shadow.reader = self;
      shadow.readerClock = clock;
      shadow.reader2 = 0;
      shadow.manyReaders = 0;
      shadow.genericReads = generic;
    } else if (shadow.reader == self) {
      shadow.readerClock = std::max(shadow.readerClock, clock);
      shadow.genericReads |= generic;
    } else if (shadow.reader2 == self) {
      shadow.reader2Clock = std::max(shadow.reader2Clock, clock);
      shadow.genericReads |= generic << 1;
    } else if (!shadow.reader2) {
      shadow.reader2 = self;
      shadow.reader2Clock = clock;
      shadow.genericReads |= generic << 1;
    } else {
      shadow.genericReads |= generic << 2;
      // Every reader's clock, for the ordering check of a later write;
      // only from the third reader on (a byte that had many readers
      // before the block began ordering stays conservative: the
      // readers between the first two and now are not known).
      if (worker.ordering && (!shadow.manyReaders || worker.manyReaders.count(offset) != 0)) {
        std::vector<uint32_t> &clocks = worker.manyReaders[offset];
        if (clocks.empty()) {
          clocks.assign(worker.threadCount, 0);
          clocks[shadow.reader - 1] = shadow.readerClock;
          clocks[shadow.reader2 - 1] = shadow.reader2Clock;
        }
        clocks[self - 1] = std::max(clocks[self - 1], clock);
      }
      shadow.manyReaders = 1;
    }
  }

  /// A reader of this epoch that a write now is not ordered after, or 0.
  uint16_t unorderedReader(const SharedShadow &shadow, uint64_t offset) const {
    if (shadow.readEpoch != worker.epoch)
      return 0;
    auto readBy = [&](uint16_t reader, uint32_t readClock) {
      return reader && !orderedBefore(worker, thread, reader, readClock, shadow.readEpoch);
    };
    if (readBy(shadow.reader, shadow.readerClock))
      return shadow.reader;
    if (readBy(shadow.reader2, shadow.reader2Clock))
      return shadow.reader2;
    // More than two readers: with their clocks kept, a reader this write
    // is not ordered after; without, any (conservatively).
    if (!shadow.manyReaders)
      return 0;
    auto found = worker.manyReaders.find(offset);
    if (found == worker.manyReaders.end())
      return shadow.reader;
    const std::vector<uint32_t> &clocks = found->second;
    for (size_t t = 0; t < clocks.size(); ++t)
      if (clocks[t] && readBy(static_cast<uint16_t>(t + 1), clocks[t]))
        return static_cast<uint16_t>(t + 1);
    return 0;
  }

  /// Reports a write, cp.async issue or bulk write of the byte that races
  /// with an earlier access; true if it did.
  bool writeRace(const SharedShadow &shadow, uint64_t offset) {
    const uint16_t asyncBy = shadow.asyncBlock == block ? shadow.asyncBy : 0;
    if (asyncBy && (use != SharedUse::AsyncIssue || asyncBy != self)) {
      report("racecheck",
             "write to " + sharedDescription(worker, offset) + " while a cp.async of thread " +
                 std::to_string(asyncBy - 1) + " into it has not landed",
             siteText(where), offset, false);
      return true;
    }
    if (written(shadow) &&
        !orderedBefore(worker, thread, shadow.writer, shadow.writerClock, shadow.writeEpoch)) {
      report("racecheck",
             "write-after-write hazard: " + sharedDescription(worker, offset) +
                 " also written by " +
                 (shadow.writer > worker.threadCount
                      ? bulkWriterDescription(worker, shadow.writer, shadow.writerClock)
                      : "thread " + std::to_string(shadow.writer - 1)) +
                 " with no ordering in between",
             siteText(where), offset, false);
      return true;
    }
    if (use == SharedUse::BulkWrite && written(shadow) && shadow.writer <= worker.threadCount &&
        !fencedForBulkWrite(shadow.writer - 1u, shadow.writerClock, shadow.writeEpoch)) {
      report("racecheck",
             "async-proxy write over a generic store with no proxy fence: a bulk copy writes " +
                 sharedDescription(worker, offset) + ", which thread " +
                 std::to_string(shadow.writer - 1) +
                 " stored, with no fence.proxy.async.shared::cta after the store by that "
                 "thread, nor by the issuing thread (or one whose release it acquired) after "
                 "it acquired the store",
             siteText(where), offset, false);
      return true;
    }
    if (const uint16_t reader = unorderedReader(shadow, offset)) {
      report("racecheck",
             std::string(use == SharedUse::BulkWrite ? "bulk copy write-after-read hazard: "
                                                     : "write-after-read hazard: ") +
                 sharedDescription(worker, offset) + " read by thread " +
                 std::to_string(reader - 1) + (shadow.manyReaders ? " (and others)" : "") +
                 (worker.ordering
                      ? " with no barrier in between, and no release of that read this thread "
                        "acquired"
                      : " with no barrier in between"),
             siteText(where), offset, false);
      return true;
    }
    if (use == SharedUse::BulkWrite) {
      if (const uint16_t reader = unfencedGenericReader(shadow, offset)) {
        report("racecheck",
               "async-proxy write over a generic read with no proxy fence: a bulk copy writes " +
                   sharedDescription(worker, offset) + ", which thread " +
                   std::to_string(reader - 1) +
                   " read (ld.shared, the generic proxy), with no "
                   "fence.proxy.async.shared::cta after the read by that thread, nor by the "
                   "issuing thread (or one whose release it acquired) after it acquired the "
                   "read",
               siteText(where), offset, false);
        return true;
      }
    }
    return false;
  }

  /// A generic-proxy reader of the byte, ordered before the bulk copy now
  /// issued, that no fence.proxy.async orders before the copy's writes (the
  /// PTX memory model orders accesses of two proxies to one address only
  /// through a proxy fence in the causality order between them), or 0.
  /// Readers of this block's latest read epoch are known: two inline, more
  /// through worker.manyReaders' clocks; past two without those clocks
  /// (read before the block ordered), the third and later are not checked.
  uint16_t unfencedGenericReader(const SharedShadow &shadow, uint64_t offset) {
    if (!shadow.genericReads || shadow.readEpoch < worker.blockEpoch)
      return 0;
    auto unfenced = [&](uint16_t reader, uint32_t readClock) {
      return reader && reader <= worker.threadCount &&
             !fencedForBulkWrite(reader - 1u, readClock, shadow.readEpoch);
    };
    if ((shadow.genericReads & 1) && unfenced(shadow.reader, shadow.readerClock))
      return shadow.reader;
    if ((shadow.genericReads & 2) && unfenced(shadow.reader2, shadow.reader2Clock))
      return shadow.reader2;
    if (shadow.genericReads & 4) {
      auto found = worker.manyReaders.find(offset);
      if (found != worker.manyReaders.end())
        for (size_t t = 0; t < found->second.size(); ++t)
          if (found->second[t] && unfenced(static_cast<uint16_t>(t + 1), found->second[t]))
            return static_cast<uint16_t>(t + 1);
    }
    return 0;
  }

  void recordWrite(SharedShadow &shadow) const {
    if (use == SharedUse::AsyncIssue) {
      shadow.asyncBy = self;
      shadow.asyncBlock = block;
      return;
    }
    shadow.writtenBlock = block;
    shadow.writeEpoch = worker.epoch;
    if (use == SharedUse::BulkWrite) {
      shadow.writer = how.bulkWriter;
      shadow.writerClock = how.bulkClock;
    } else {
      shadow.writer = self;
      shadow.writerClock = clock;
    }
  }
};

} // namespace

/// Racecheck and initcheck of shared bytes [offset, offset + size) used by
/// `thread`; `where` locates the access for reports.
void checkShared(Worker &worker, Thread &thread, uint64_t offset, size_t size, SharedUse use,
                 const Site &where, const SharedAccess &how) {
  SharedAccessCheck check(worker, thread, use, where, how);
  for (size_t i = 0; i < size; ++i)
    check.byte(offset + i);
}

/// Memcheck and initcheck of a global range; marks writes. Returns the
/// allocation, or null after a fatal report.
Allocation *checkGlobal(Worker &worker, uintptr_t address, size_t size, bool write,
                        const Site &where, bool atomic) {
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

} // namespace pagedc::emu::detail

namespace pagedc::emu {

using namespace detail;

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

} // namespace pagedc::emu
