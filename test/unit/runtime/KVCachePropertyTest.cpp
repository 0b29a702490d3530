//===- KVCachePropertyTest.cpp - Random operations against a model --------===//
//
// 100,000 seeded random reserve / erase / assign / fork / convert operations
// on caches of page sizes 1 to 256, checked after every operation against a
// simple model: each page is owned (with the right reference count) or free,
// exactly once; capacities, page tables and physical-to-logical answers
// agree; every written K/V element reads back; and a failed operation leaves
// the whole state (tables, free list, reference counts, storage) unchanged.
//
//===----------------------------------------------------------------------===//
#include "pagedc/KVCache.h"
#include "pagedc/PhysicalBlockMask.h"

#include "TestMods.h"
#include "TestUtil.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>

using namespace pagedc;
using namespace pagedc::test;

namespace {

/// What a slot holds, by logical position.
struct SlotModel {
  int64_t pages = 0;
  std::vector<float> k, v;    // [capacity, heads, D] / [capacity, heads, Dv]
  std::vector<uint8_t> known; // [capacity]: position written (or forked)
};

/// Everything observable about a cache, for "nothing changed" checks.
struct Snapshot {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> freePages, refCounts;
  std::vector<unsigned char> storage;
  bool operator==(const Snapshot &other) const {
    return tables == other.tables && freePages == other.freePages && refCounts == other.refCounts &&
           storage == other.storage;
  }
};

class PropertyRun {
public:
  PropertyRun(std::mt19937 &rng) : rng_(rng) {
    const int64_t pageSizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    config_.pageSize = pageSizes[pick(0, 8)];
    const int64_t maxPages = std::clamp<int64_t>(1024 / config_.pageSize, 2, 48);
    config_.numPages = pick(2, maxPages);
    config_.maxBatch = pick(2, 6);
    config_.heads = pick(1, 2);
    config_.headDim = pick(1, 3);
    config_.valueHeadDim = pick(1, 3);
    cache_ = std::make_unique<PagedKVCache>(config_);
    slots_.resize(config_.maxBatch);
  }

  void step() {
    const int64_t choice = pick(0, 99);
    if (choice < 30)
      reserve();
    else if (choice < 45)
      erase();
    else if (choice < 80)
      assign();
    else if (choice < 93)
      fork();
    else
      convert();
    checkInvariants();
  }

  int64_t failures = 0;
  int64_t forks = 0, copyOnWriteAssigns = 0, converts = 0;

private:
  int64_t pick(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  int64_t ps() const { return config_.pageSize; }
  int64_t capacity(int64_t slot) const { return slots_[slot].pages * ps(); }

  Snapshot snapshot() const {
    Snapshot s;
    for (int64_t slot = 0; slot < config_.maxBatch; ++slot)
      s.tables.push_back(cache_->pageTable(slot));
    s.freePages = cache_->freePages();
    for (int64_t page = 0; page < config_.numPages; ++page)
      s.refCounts.push_back(cache_->pageRefCount(page));
    for (const TensorView *view : {&cache_->kCache(), &cache_->vCache()}) {
      const auto *bytes = static_cast<const unsigned char *>(view->data());
      s.storage.insert(s.storage.end(), bytes, bytes + view->numel() * sizeof(float));
    }
    return s;
  }

  /// Runs `op`, which the model says must fail (`expectFailure`) or succeed,
  /// and checks that a failure changed nothing.
  template <typename Op> bool run(bool expectFailure, const char *expectedText, Op op) {
    // Snapshots are only needed when a failure is expected: an unexpected
    // failure is reported by the outcome check anyway.
    const Snapshot before = expectFailure ? snapshot() : Snapshot();
    std::string message;
    try {
      op();
    } catch (const Error &error) {
      message = error.what();
    }
    const bool failed = !message.empty();
    EXPECT_EQ(failed, expectFailure) << "message: " << message;
    if (failed) {
      ++failures;
      EXPECT_NE(message.find(expectedText), std::string::npos) << message;
      if (expectFailure) {
        EXPECT_TRUE(snapshot() == before) << "a failed operation changed the cache: " << message;
      }
    }
    return failed;
  }

  void resizeSlot(int64_t slot) {
    SlotModel &model = slots_[slot];
    const int64_t capacityNow = capacity(slot);
    model.k.resize(capacityNow * config_.heads * config_.headDim);
    model.v.resize(capacityNow * config_.heads * config_.valueHeadDim);
    model.known.resize(capacityNow, 0);
  }

  void reserve() {
    const int64_t slot = pick(0, config_.maxBatch - 1);
    const int64_t length = pick(0, config_.numPages * ps() / 2 + 1);
    int64_t needed = 0;
    if (length > capacity(slot))
      needed = (length - capacity(slot) + ps() - 1) / ps();
    const bool fails = needed > cache_->freePageCount();
    if (run(fails, "requested", [&] { cache_->reserve(slot, length); }))
      return;
    slots_[slot].pages += needed;
    resizeSlot(slot);
  }

  void erase() {
    const int64_t slot = pick(0, config_.maxBatch - 1);
    run(false, "", [&] { cache_->erase(slot); });
    slots_[slot] = SlotModel();
  }

  void assign() {
    const int64_t batch = pick(1, 3), seqLen = pick(1, 4);
    std::vector<int32_t> batchIdx(batch), positions(batch * seqLen);
    bool invalid = false;
    for (int64_t b = 0; b < batch; ++b) {
      batchIdx[b] = static_cast<int32_t>(pick(0, config_.maxBatch - 1));
      for (int64_t s = 0; s < seqLen; ++s) {
        // Mostly valid positions, some just past the capacity.
        const int64_t position =
            pick(0, std::max<int64_t>(0, capacity(batchIdx[b]) + (pick(0, 9) == 0 ? 2 : -1)));
        positions[b * seqLen + s] = static_cast<int32_t>(position);
        invalid |= positions[b * seqLen + s] >= capacity(batchIdx[b]);
      }
    }
    // Copy-on-write needs one page per (slot, logical page) written while
    // still shared.
    int64_t copies = 0;
    if (!invalid) {
      std::set<std::pair<int32_t, int64_t>> seen;
      std::map<int32_t, int32_t> dropped;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t s = 0; s < seqLen; ++s) {
          const int64_t logical = positions[b * seqLen + s] / ps();
          const int32_t page = cache_->pageTable(batchIdx[b])[logical];
          if (!seen.insert({batchIdx[b], logical}).second)
            continue;
          if (cache_->pageRefCount(page) - dropped[page] > 1) {
            ++copies;
            ++dropped[page];
          }
        }
    }
    const int64_t heads = config_.heads, d = config_.headDim, dv = config_.valueHeadDim;
    std::vector<float> k(batch * heads * seqLen * d), v(batch * heads * seqLen * dv);
    for (float &x : k)
      x = nextValue();
    for (float &x : v)
      x = nextValue();
    const bool fails = invalid || copies > cache_->freePageCount();
    const char *expected = invalid ? "reserved capacity" : "copy-on-write";
    if (run(fails, expected, [&] {
          cache_->assign(i32View(batchIdx), i32View(positions, {batch, seqLen}),
                         TensorView(k.data(), DType::F32, {batch, heads, seqLen, d}),
                         TensorView(v.data(), DType::F32, {batch, heads, seqLen, dv}));
        }))
      return;
    copyOnWriteAssigns += copies > 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < seqLen; ++s) {
        SlotModel &model = slots_[batchIdx[b]];
        const int64_t position = positions[b * seqLen + s];
        model.known[position] = 1;
        for (int64_t h = 0; h < heads; ++h) {
          std::copy_n(&k[((b * heads + h) * seqLen + s) * d], d,
                      &model.k[(position * heads + h) * d]);
          std::copy_n(&v[((b * heads + h) * seqLen + s) * dv], dv,
                      &model.v[(position * heads + h) * dv]);
        }
      }
  }

  void fork() {
    const int64_t src = pick(0, config_.maxBatch - 1);
    int64_t dst = pick(0, config_.maxBatch - 1);
    if (pick(0, 3) != 0) // mostly aim at an empty destination
      for (int64_t slot = 0; slot < config_.maxBatch; ++slot)
        if (slot != src && slots_[slot].pages == 0)
          dst = slot;
    const int64_t length = pick(0, capacity(src) + (pick(0, 9) == 0 ? 1 : 0));
    const bool partial = length % ps() != 0;
    const char *expected = "fork";
    bool fails = true;
    if (src == dst)
      expected = "same slot";
    else if (slots_[dst].pages != 0)
      expected = "is not empty";
    else if (length > capacity(src))
      expected = "outside the source slot";
    else if (partial && cache_->freePageCount() == 0)
      expected = "requested 1 pages but there are only 0 empty pages";
    else
      fails = false;
    if (run(fails, expected, [&] { cache_->fork(src, dst, length); }))
      return;
    ++forks;
    SlotModel &target = slots_[dst];
    target.pages = (length + ps() - 1) / ps();
    resizeSlot(dst);
    const SlotModel &source = slots_[src];
    for (int64_t position = 0; position < length; ++position) {
      target.known[position] = source.known[position];
      std::copy_n(&source.k[position * config_.heads * config_.headDim],
                  config_.heads * config_.headDim,
                  &target.k[position * config_.heads * config_.headDim]);
      std::copy_n(&source.v[position * config_.heads * config_.valueHeadDim],
                  config_.heads * config_.valueHeadDim,
                  &target.v[position * config_.heads * config_.valueHeadDim]);
    }
  }

  void convert() {
    const int32_t blockSizes[] = {1, 4, 16, 64};
    const int32_t kvBlock = pick(0, 1) ? static_cast<int32_t>(ps()) : blockSizes[pick(0, 3)];
    const int64_t qLength = pick(1, 40);
    const int64_t kvLength = pick(1, 600);
    const CompiledMods causal = maskMods(causalRow, nullptr, false, false, true);
    const CompiledMods none;
    const PagedcModContext context{nullptr, nullptr};
    const BlockMask logical =
        createBlockMask(pick(0, 1) ? causal : none, context, 1, 1, qLength, kvLength, 8, kvBlock);
    std::vector<int32_t> batchIdx(pick(1, 3)), kvLen;
    for (int32_t &slot : batchIdx)
      slot = static_cast<int32_t>(pick(0, config_.maxBatch - 1));
    if (pick(0, 1))
      for (int32_t slot : batchIdx)
        kvLen.push_back(static_cast<int32_t>(pick(0, capacity(slot))));
    PhysicalBlockMask converted;
    if (run(false, "",
            [&] { converted = convertLogicalBlockMask(*cache_, logical, batchIdx, kvLen); }))
      return;
    ++converts;
    const bool physical = kvBlock == ps();
    ASSERT_EQ(converted.indexSpace == PhysicalBlockMask::IndexSpace::PhysicalPages, physical);
    for (size_t b = 0; b < batchIdx.size(); ++b) {
      const int64_t bound = kvLen.empty() ? capacity(batchIdx[b]) : kvLen[b];
      const std::vector<int32_t> &table = cache_->pageTable(batchIdx[b]);
      for (int64_t i = 0; i < logical.numQBlocks; ++i) {
        std::multiset<int32_t> partial, full;
        for (int32_t k = 0; k < logical.partialCount(0, 0, i); ++k) {
          const int32_t block = logical.partialRow(0, 0, i)[k];
          if (int64_t(block) * kvBlock < bound)
            partial.insert(physical ? table[block] : block);
        }
        for (int32_t k = 0; k < logical.fullCount(0, 0, i); ++k) {
          const int32_t block = logical.fullRow(0, 0, i)[k];
          const int64_t end = std::min<int64_t>(int64_t(block + 1) * kvBlock, kvLength);
          if (int64_t(block) * kvBlock >= bound)
            continue;
          (end > bound ? partial : full).insert(physical ? table[block] : block);
        }
        const BlockMask &mask = converted.mask;
        EXPECT_EQ(std::multiset<int32_t>(mask.partialRow(b, 0, i),
                                         mask.partialRow(b, 0, i) + mask.partialCount(b, 0, i)),
                  partial);
        EXPECT_EQ(std::multiset<int32_t>(mask.fullRow(b, 0, i),
                                         mask.fullRow(b, 0, i) + mask.fullCount(b, 0, i)),
                  full);
      }
    }
  }

  float nextValue() { return static_cast<float>(++counter_ % (1 << 24)); }

  void checkInvariants() {
    // Ownership: reference counts equal owners; free pages are exactly the
    // unowned ones, each listed once.
    std::vector<int32_t> owners(config_.numPages, 0);
    for (int64_t slot = 0; slot < config_.maxBatch; ++slot) {
      const std::vector<int32_t> &table = cache_->pageTable(slot);
      ASSERT_EQ(static_cast<int64_t>(table.size()), slots_[slot].pages) << "slot " << slot;
      ASSERT_EQ(cache_->capacity(slot), capacity(slot));
      std::set<int32_t> distinct(table.begin(), table.end());
      ASSERT_EQ(distinct.size(), table.size()) << "a page twice in slot " << slot;
      for (size_t logical = 0; logical < table.size(); ++logical) {
        ASSERT_GE(table[logical], 0);
        ASSERT_LT(table[logical], config_.numPages);
        ++owners[table[logical]];
        ASSERT_EQ(cache_->physicalToLogical(slot, table[logical]), int32_t(logical));
      }
      // A page the slot does not own answers -1.
      const int64_t page = pick(0, config_.numPages - 1);
      if (!distinct.count(static_cast<int32_t>(page))) {
        ASSERT_EQ(cache_->physicalToLogical(slot, page), -1);
      }
    }
    std::vector<int32_t> freeCount(config_.numPages, 0);
    for (int32_t page : cache_->freePages())
      ++freeCount[page];
    for (int64_t page = 0; page < config_.numPages; ++page) {
      ASSERT_EQ(cache_->pageRefCount(page), owners[page]) << "page " << page;
      ASSERT_EQ(freeCount[page], owners[page] == 0 ? 1 : 0) << "page " << page;
    }
    // Data: every known position reads back through the page table.
    const float *kCache = cache_->kCache().dataAs<const float>();
    const float *vCache = cache_->vCache().dataAs<const float>();
    const int64_t heads = config_.heads, d = config_.headDim, dv = config_.valueHeadDim;
    const int64_t rows = config_.numPages * ps();
    for (int64_t slot = 0; slot < config_.maxBatch; ++slot) {
      const SlotModel &model = slots_[slot];
      const std::vector<int32_t> &table = cache_->pageTable(slot);
      for (int64_t position = 0; position < capacity(slot); ++position) {
        if (!model.known[position])
          continue;
        const int64_t row = table[position / ps()] * ps() + position % ps();
        for (int64_t h = 0; h < heads; ++h) {
          ASSERT_EQ(std::memcmp(&kCache[(h * rows + row) * d], &model.k[(position * heads + h) * d],
                                d * sizeof(float)),
                    0)
              << "K of slot " << slot << " position " << position;
          ASSERT_EQ(std::memcmp(&vCache[(h * rows + row) * dv],
                                &model.v[(position * heads + h) * dv], dv * sizeof(float)),
                    0)
              << "V of slot " << slot << " position " << position;
        }
      }
    }
  }

  std::mt19937 &rng_;
  KVCacheConfig config_;
  std::unique_ptr<PagedKVCache> cache_;
  std::vector<SlotModel> slots_;
  uint32_t counter_ = 0;
};

} // namespace

TEST(KVCacheProperty, HundredThousandRandomOperationsAgreeWithTheModel) {
  std::mt19937 rng(20240611);
  constexpr int64_t kOperations = 100000, kPerCache = 500;
  int64_t failures = 0, forks = 0, copyOnWriteAssigns = 0, converts = 0;
  for (int64_t done = 0; done < kOperations && !::testing::Test::HasFailure();) {
    PropertyRun run(rng);
    for (int64_t i = 0; i < kPerCache && !::testing::Test::HasFailure(); ++i, ++done)
      run.step();
    failures += run.failures;
    forks += run.forks;
    copyOnWriteAssigns += run.copyOnWriteAssigns;
    converts += run.converts;
  }
  // Both outcomes must be exercised for the run to mean anything.
  EXPECT_GT(failures, kOperations / 100);
  EXPECT_LT(failures, kOperations / 2);
  EXPECT_GT(forks, kOperations / 50);
  EXPECT_GT(copyOnWriteAssigns, kOperations / 200);
  EXPECT_GT(converts, kOperations / 50);
  std::printf("%lld failed as predicted, %lld forks, %lld copy-on-write assigns, %lld converts\n",
              (long long)failures, (long long)forks, (long long)copyOnWriteAssigns,
              (long long)converts);
}
