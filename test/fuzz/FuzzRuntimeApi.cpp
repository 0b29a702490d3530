//===- FuzzRuntimeApi.cpp - libFuzzer target: KV cache and block masks ----===//
//
// The input is decoded into a sequence of runtime API calls, as an embedding
// application (a server) makes them: PagedKVCache construction, reserve,
// erase, fork, assign and the page-table queries; createBlockMask(Into) over
// hand-written mask mods (causal, sliding window, document ids read from a
// buffer, a hash of all four indices, no mask); blockMaskFromKvBlocks and
// denseToBlockMask from arbitrary arrays; convertLogicalBlockMask onto the
// cache. Sizes come from the stream: mostly small, sometimes extreme
// (negative, zero, int32/int64 limits), so overflow checks are exercised.
//
// pagedc::Error is the expected answer to a bad call. Findings: a crash, a
// sanitizer report, any other exception (std::bad_alloc, std::length_error,
// ... issue 10: every entry point throws pagedc::Error); a failed call that
// changed the cache; a block mask that fails validateBlockMask() or whose
// dense form differs from the mask mod evaluated element by element; Auto and
// ElementWise classification disagreeing; inconsistent page tables.
//
//===----------------------------------------------------------------------===//

#include "pagedc/BlockMask.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"
#include "pagedc/Mods.h"
#include "pagedc/PhysicalBlockMask.h"

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

using namespace pagedc;

namespace {

[[noreturn]] void finding(const std::string &what) {
  std::fprintf(stderr, "pagedc-fuzz-runtime-api: FINDING: %s\n", what.c_str());
  std::abort();
}

//===----------------------------------------------------------------------===//
// Mask mods (plain C++ functions with the compiled mods' ABI)
//===----------------------------------------------------------------------===//

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q,
               int32_t kvBegin, int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= int64_t(kvBegin) + i;
}

int32_t causalClass(const PagedcModContext *, int32_t, int32_t, int32_t qLo,
                    int32_t qHi, int32_t kvLo, int32_t kvHi) {
  if (qLo >= kvHi)
    return 2;
  if (qHi < kvLo)
    return 0;
  return 1;
}

/// (q >= kv) & (q - kv <= window), window = param 0.
void slidingRow(const PagedcModContext *context, int32_t, int32_t, int32_t q,
                int32_t kvBegin, int32_t count, uint8_t *out) {
  int64_t window = context->params[0].i32;
  for (int32_t i = 0; i < count; ++i) {
    int64_t kv = int64_t(kvBegin) + i;
    out[i] = q >= kv && q - kv <= window;
  }
}

/// doc[q] == doc[kv] for a rank-1 i32 buffer; indices past it are masked.
bool sameDocument(const PagedcModContext *context, int64_t q, int64_t kv) {
  const PagedcBufferRef &doc = context->buffers[0];
  if (q < 0 || kv < 0 || q >= doc.sizes[0] || kv >= doc.sizes[0])
    return false;
  const int32_t *ids = static_cast<const int32_t *>(doc.data);
  return ids[q * doc.strides[0]] == ids[kv * doc.strides[0]];
}

void documentRow(const PagedcModContext *context, int32_t, int32_t, int32_t q,
                 int32_t kvBegin, int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = sameDocument(context, q, int64_t(kvBegin) + i);
}

/// A hash of (b, h, q, kv, seed = param 0) that keeps about half.
bool hashKeeps(const PagedcModContext *context, int64_t b, int64_t h, int64_t q,
               int64_t kv) {
  uint64_t x = uint64_t(context->params[0].i32) * 0x9e3779b97f4a7c15ull;
  for (int64_t part : {b, h, q, kv}) {
    x ^= uint64_t(part) + 0x632be59bd9b4e019ull + (x << 6) + (x >> 2);
    x *= 0xff51afd7ed558ccdull;
  }
  return (x >> 61) & 1;
}

void hashRow(const PagedcModContext *context, int32_t b, int32_t h, int32_t q,
             int32_t kvBegin, int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = hashKeeps(context, b, h, q, int64_t(kvBegin) + i);
}

int32_t unknownClass(const PagedcModContext *, int32_t, int32_t, int32_t,
                     int32_t, int32_t, int32_t) {
  return 1;
}

/// One of the mods above with a true dependence description.
CompiledMods makeMods(unsigned which, bool withClassifier) {
  CompiledMods mods;
  ModDependence &dep = mods.maskDependence;
  switch (which % 5) {
  case 0:
    return mods; // no mask mod
  case 1:
    mods.maskName = "causal";
    mods.maskRow = causalRow;
    if (withClassifier)
      mods.maskBlockClass = causalClass;
    dep.b = dep.h = false;
    dep.diagonal = true;
    break;
  case 2:
    mods.maskName = "sliding";
    mods.maskRow = slidingRow;
    dep.b = dep.h = false;
    dep.diagonal = true;
    dep.params = {"window"};
    mods.params.push_back({"window", ScalarKind::I32, std::nullopt});
    break;
  case 3:
    mods.maskName = "document";
    mods.maskRow = documentRow;
    dep.b = dep.h = false;
    dep.buffers = {"doc"};
    mods.buffers.push_back({"doc", DType::I32, {BufferDim{}}});
    break;
  default:
    mods.maskName = "hash";
    mods.maskRow = hashRow;
    if (withClassifier)
      mods.maskBlockClass = unknownClass;
    dep.params = {"seed"};
    mods.params.push_back({"seed", ScalarKind::I32, std::nullopt});
    break;
  }
  return mods;
}

/// a * b * c * d when it fits in int64 and all are >= 0, else INT64_MAX.
int64_t product(int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t result = 1;
  for (int64_t factor : {a, b, c, d})
    if (factor < 0 || __builtin_mul_overflow(result, factor, &result))
      return std::numeric_limits<int64_t>::max();
  return result;
}

bool maskKeeps(const CompiledMods &mods, const PagedcModContext &context,
               int64_t b, int64_t h, int64_t q, int64_t kv) {
  if (!mods.hasMask())
    return true;
  uint8_t out = 0;
  mods.maskRow(&context, int32_t(b), int32_t(h), int32_t(q), int32_t(kv), 1,
               &out);
  return out != 0;
}

//===----------------------------------------------------------------------===//
// The decoder
//===----------------------------------------------------------------------===//

class Session {
public:
  explicit Session(FuzzedDataProvider &in) : in(in) {}

  void run() {
    for (unsigned step = 0; step < 48 && in.remaining_bytes() > 0; ++step) {
      unsigned op = in.ConsumeIntegralInRange<unsigned>(0, 11);
      try {
        dispatch(op);
      } catch (const Error &) {
        // The expected answer to a bad call; checked to change nothing.
        checkUnchangedAfterError();
      } catch (const std::exception &error) {
        finding(std::string("operation ") + std::to_string(op) +
                " threw a non-pagedc exception: " + error.what());
      }
    }
  }

private:
  /// A size: usually in [low, high], sometimes an extreme value.
  int64_t size(int64_t low, int64_t high) {
    if (in.ConsumeIntegralInRange<unsigned>(0, 15) != 0)
      return in.ConsumeIntegralInRange<int64_t>(low, high);
    static const int64_t kExtreme[] = {0,
                                       -1,
                                       std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max(),
                                       int64_t(1) << 32,
                                       int64_t(1) << 40,
                                       int64_t(1) << 62,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
    return kExtreme[in.ConsumeIntegralInRange<size_t>(
        0, sizeof(kExtreme) / sizeof(kExtreme[0]) - 1)];
  }

  void dispatch(unsigned op) {
    before.reset();
    switch (op) {
    case 0:
      return newCache();
    case 1:
      return withCache([&] {
        int64_t slot = size(-1, cache->maxBatch()), len = size(0, 300);
        cache->reserve(slot, len);
      });
    case 2:
      return withCache([&] { cache->erase(size(-1, cache->maxBatch())); });
    case 3:
      return withCache([&] {
        int64_t src = size(-1, cache->maxBatch());
        int64_t dst = size(-1, cache->maxBatch());
        if (in.ConsumeBool())
          cache->fork(src, dst);
        else
          cache->fork(src, dst, size(0, 300));
      });
    case 4:
      return withCache([&] { assign(); });
    case 5:
      return queries();
    case 6:
    case 7:
      return blockMask();
    case 8:
      return fromKvBlocks();
    case 9:
      return fromDense();
    case 10:
    case 11:
      return convert();
    }
  }

  //===--- KV cache
  //--------------------------------------------------------===//

  void newCache() {
    KVCacheConfig config;
    config.numPages = size(0, 64);
    config.pageSize = in.ConsumeBool()
                          ? int64_t(1) << in.ConsumeIntegralInRange<int>(0, 6)
                          : size(-2, 70);
    config.maxBatch = size(0, 6);
    config.heads = size(0, 3);
    config.headDim = size(0, 8);
    config.valueHeadDim = size(0, 8);
    config.dtype = in.PickValueInArray({DType::F32, DType::F16, DType::BF16,
                                        DType::I32, DType::U8, DType::F64});
    // A valid cache of 2^31 one-token pages is 24 GB of page bookkeeping
    // plus its K/V storage: an allocation the harness asked for, not a
    // finding. Valid configurations keep at most 2^20 tokens; the extremes
    // that the configuration checks refuse stay as they are.
    if (config.pageSize >= 1 && config.numPages >= 1 &&
        config.numPages <= std::numeric_limits<int32_t>::max() / config.pageSize &&
        config.numPages * config.pageSize > (int64_t(1) << 20))
      config.numPages = std::max<int64_t>(1, (int64_t(1) << 20) / config.pageSize);
    cache.reset();
    cache = std::make_unique<PagedKVCache>(config);
    checkCache();
  }

  /// Small enough to snapshot and check after every call.
  bool checkable() const {
    return cache && cache->maxBatch() <= 64 && cache->numPages() <= 4096;
  }

  template <typename Call> void withCache(Call call) {
    if (!cache)
      return;
    if (checkable())
      before = std::make_unique<Snapshot>(snapshot());
    call();
    before.reset();
    checkCache();
  }

  void assign() {
    const int64_t batch = in.ConsumeIntegralInRange<int64_t>(0, 3);
    const int64_t seqLen = in.ConsumeIntegralInRange<int64_t>(0, 6);
    int64_t heads = cache->heads(), dim = cache->headDim(),
            vdim = cache->valueHeadDim();
    if (in.ConsumeIntegralInRange<unsigned>(0, 7) == 0) {
      heads = in.ConsumeIntegralInRange<int64_t>(0, 3);
      dim = in.ConsumeIntegralInRange<int64_t>(0, 9);
    }
    if (heads < 0 || heads > 64 || dim < 0 || dim > 64 || vdim < 0 || vdim > 64)
      return; // a cache this big cannot exist; nothing to write from
    bool wide = in.ConsumeBool();
    std::vector<int64_t> slots64(batch), pos64(batch * seqLen);
    for (int64_t &slot : slots64)
      slot = size(-1, cache->maxBatch());
    for (int64_t &pos : pos64)
      pos = size(-1, 200);
    std::vector<int32_t> slots32(slots64.begin(), slots64.end()),
        pos32(pos64.begin(), pos64.end());
    TensorView batchIdx = wide
                              ? TensorView(slots64.data(), DType::I64, {batch})
                              : TensorView(slots32.data(), DType::I32, {batch});
    TensorView inputPos =
        wide ? TensorView(pos64.data(), DType::I64, {batch, seqLen})
             : TensorView(pos32.data(), DType::I32, {batch, seqLen});
    DType dtype = in.ConsumeIntegralInRange<unsigned>(0, 7) == 0
                      ? DType::F64
                      : cache->dtype();
    std::vector<uint8_t> kData(batch * heads * seqLen * dim * 8),
        vData(batch * heads * seqLen * vdim * 8);
    for (size_t i = 0; i < kData.size(); ++i)
      kData[i] = uint8_t(i * 131 + 7);
    TensorView k(kData.data(), dtype, {batch, heads, seqLen, dim});
    TensorView v(vData.data(), dtype, {batch, heads, seqLen, vdim});
    cache->assign(batchIdx, inputPos, k, v);
  }

  void queries() {
    if (!cache)
      return;
    int64_t slot = size(-1, cache->maxBatch());
    cache->capacity(slot);
    cache->pageTable(slot);
    cache->physicalToLogical(slot, size(-1, cache->numPages()));
    cache->pageRefCount(size(-1, cache->numPages()));
    std::vector<int32_t> slots(in.ConsumeIntegralInRange<size_t>(0, 4));
    for (int32_t &s : slots)
      s = int32_t(size(-1, cache->maxBatch()));
    cache->densePageTable(slots, size(-2, 40));
  }

  struct Snapshot {
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> freePages;
  };

  Snapshot snapshot() const {
    Snapshot s;
    for (int64_t slot = 0; slot < cache->maxBatch(); ++slot)
      s.tables.push_back(cache->pageTable(slot));
    s.freePages = cache->freePages();
    return s;
  }

  void checkUnchangedAfterError() {
    if (!before || !cache)
      return;
    Snapshot after = snapshot();
    if (after.tables != before->tables || after.freePages != before->freePages)
      finding("a cache operation that threw changed the cache");
    before.reset();
  }

  /// Every page is free or owned; reference counts match the owners.
  void checkCache() const {
    if (!checkable())
      return;
    const int64_t pages = cache->numPages();
    std::vector<int32_t> owners(pages, 0);
    for (int64_t slot = 0; slot < cache->maxBatch(); ++slot) {
      const std::vector<int32_t> &table = cache->pageTable(slot);
      if (int64_t(table.size()) * cache->pageSize() != cache->capacity(slot))
        finding("capacity() disagrees with the page table");
      for (size_t logical = 0; logical < table.size(); ++logical) {
        int32_t page = table[logical];
        if (page < 0 || page >= pages)
          finding("a page table holds a page out of range");
        ++owners[page];
        if (cache->physicalToLogical(slot, page) != int32_t(logical))
          finding("physicalToLogical() disagrees with the page table");
      }
    }
    for (int32_t page : cache->freePages()) {
      if (page < 0 || page >= pages)
        finding("the free list holds a page out of range");
      if (owners[page] != 0)
        finding("a page is both free and owned");
      owners[page] = -1;
    }
    for (int64_t page = 0; page < pages; ++page) {
      if (owners[page] == 0)
        finding("a page is neither free nor owned (leaked)");
      if (owners[page] > 0 && cache->pageRefCount(page) != owners[page])
        finding("pageRefCount() disagrees with the page tables");
    }
  }

  //===--- Block masks
  //-----------------------------------------------------===//

  void bindContext() {
    params[0].i32 = int32_t(size(-3, 40));
    docIds.resize(in.ConsumeIntegralInRange<size_t>(0, 300));
    int32_t id = 0;
    for (int32_t &doc : docIds) {
      if (in.ConsumeIntegralInRange<unsigned>(0, 15) == 0)
        ++id;
      doc = id;
    }
    buffers[0] = PagedcBufferRef{
        docIds.data(), {int64_t(docIds.size()), 0, 0, 0}, {1, 0, 0, 0}};
    context = PagedcModContext{buffers, params};
  }

  int32_t blockSize() {
    static const int32_t kSizes[] = {1, 2, 16, 32, 64, 128};
    if (in.ConsumeBool())
      return in.PickValueInArray(kSizes);
    return int32_t(size(-1, 200));
  }

  void blockMask() {
    mods = makeMods(in.ConsumeIntegral<unsigned>(), in.ConsumeBool());
    bindContext();
    int64_t batch = size(1, 3), heads = size(1, 3);
    int64_t qLength = size(0, 260), kvLength = size(0, 260);
    int32_t qBlock = blockSize(), kvBlock = blockSize();
    BlockMaskMethod method =
        in.ConsumeBool() ? BlockMaskMethod::Auto : BlockMaskMethod::ElementWise;
    // A mask mod evaluated per element (ElementWise, or a mod without a
    // block classifier) costs one call per (b, h, q, kv) it depends on:
    // 2^31 x 2^31 calls are days of honest work, not a hang to report. Such
    // requests are shrunk to at most 1024 x 1024 elements; sizes that are
    // classified per block, negative, or refused before any evaluation keep
    // their extremes.
    const bool perElement =
        mods.hasMask() &&
        (method == BlockMaskMethod::ElementWise || !mods.maskBlockClass);
    const ModDependence &dep = mods.maskDependence;
    if (perElement && batch >= 0 && heads >= 0 && qLength >= 0 &&
        kvLength >= 0 &&
        product(dep.b ? batch : 1, dep.h ? heads : 1, qLength, kvLength) >
            (int64_t(1) << 24)) {
      qLength %= 1025;
      kvLength %= 1025;
      if (dep.b)
        batch = std::min<int64_t>(batch, 3);
      if (dep.h)
        heads = std::min<int64_t>(heads, 3);
    }
    // Masks within the runtime's 2 GiB budget but of more than 2^18 blocks
    // take up to tens of seconds to build, validate and convert (once per
    // later operation of the input) under the sanitizers and coverage:
    // honest work, not a hang. Shrink those; sizes refused by the budget
    // (checked before anything is built) keep their extremes.
    if (qBlock > 0 && kvBlock > 0 && batch >= 0 && heads >= 0 && qLength >= 0 &&
        kvLength >= 0) {
      // Per (b, h) row set, and in all: the mask is broadcast over b and h
      // when the mod does not read them, so either may be what gets built.
      const int64_t rowBlocks =
          product(1, 1, qLength / qBlock + (qLength % qBlock > 0),
                  kvLength / kvBlock + (kvLength % kvBlock > 0));
      const int64_t blocks = product(batch, heads, 1, rowBlocks);
      auto buildable = [](int64_t n) {
        return n > (int64_t(1) << 18) && n <= (int64_t(1) << 30);
      };
      if (buildable(rowBlocks) || buildable(blocks)) {
        qLength %= 1025;
        kvLength %= 1025;
        batch = std::min<int64_t>(batch, 3);
        heads = std::min<int64_t>(heads, 3);
      }
    }
    if (in.ConsumeBool()) {
      haveMask = false;
      mask = createBlockMask(mods, context, batch, heads, qLength, kvLength,
                             qBlock, kvBlock, method);
    } else {
      // Into a mask that may hold an older one: must be all replaced.
      BlockMask previous = mask;
      try {
        createBlockMaskInto(mods, context, batch, heads, qLength, kvLength,
                            qBlock, kvBlock, method, mask);
      } catch (const Error &) {
        if (mask.kvIndices != previous.kvIndices ||
            mask.kvNumBlocks != previous.kvNumBlocks ||
            mask.qLength != previous.qLength)
          finding("createBlockMaskInto() changed the mask and then threw");
        throw;
      }
      haveMask = false;
    }
    validateOrFind(mask, "createBlockMask");
    haveMask = true;
    checkAgainstMod(batch, heads);
    if (product(mask.batch, mask.heads, mask.qLength, mask.kvLength) <=
        (1 << 16)) {
      BlockMaskMethod other = method == BlockMaskMethod::Auto
                                  ? BlockMaskMethod::ElementWise
                                  : BlockMaskMethod::Auto;
      BlockMask again = createBlockMask(mods, context, batch, heads, qLength,
                                        kvLength, qBlock, kvBlock, other);
      if (toDense(again, &mods, &context) != toDense(mask, &mods, &context))
        finding("Auto and ElementWise block masks mean different elements");
    }
  }

  void validateOrFind(const BlockMask &m, const char *what) {
    try {
      validateBlockMask(m);
    } catch (const Error &error) {
      finding(std::string(what) + " returned an invalid mask: " + error.what());
    }
  }

  /// The dense form of the mask equals the mod, element by element.
  void checkAgainstMod(int64_t batch, int64_t heads) {
    // A few batch rows and heads are enough to check a broadcast extent.
    batch = std::min<int64_t>(batch, 3);
    heads = std::min<int64_t>(heads, 3);
    if (product(batch, heads, mask.qLength, mask.kvLength) > (1 << 16) ||
        product(mask.batch, mask.heads, mask.qLength, mask.kvLength) >
            (1 << 16))
      return;
    std::vector<uint8_t> dense = toDense(mask, &mods, &context);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t q = 0; q < mask.qLength; ++q)
          for (int64_t kv = 0; kv < mask.kvLength; ++kv) {
            int64_t bb = mask.batch == 1 ? 0 : b, hh = mask.heads == 1 ? 0 : h;
            size_t at = size_t(((bb * mask.heads + hh) * mask.qLength + q) *
                                   mask.kvLength +
                               kv);
            if ((dense[at] != 0) != maskKeeps(mods, context, b, h, q, kv))
              finding("block mask of '" + mods.maskName +
                      "' differs from the mod at b=" + std::to_string(b) +
                      " h=" + std::to_string(h) + " q=" + std::to_string(q) +
                      " kv=" + std::to_string(kv));
          }
  }

  std::vector<int32_t> intArray(size_t maxCount, int32_t low, int32_t high) {
    std::vector<int32_t> values(in.ConsumeIntegralInRange<size_t>(0, maxCount));
    for (int32_t &value : values)
      value = in.ConsumeIntegralInRange<int32_t>(low, high);
    return values;
  }

  void fromKvBlocks() {
    int64_t batch = size(1, 2), heads = size(1, 2), maxKv = size(0, 6);
    int64_t qLength = size(0, 80), kvLength = size(0, 80);
    int32_t qBlock = blockSize(), kvBlock = blockSize();
    std::vector<int32_t> num = intArray(8, -1, 7), idx = intArray(48, -1, 7);
    std::vector<int32_t> fullNum, fullIdx;
    if (in.ConsumeBool()) {
      fullNum = intArray(8, -1, 7);
      fullIdx = intArray(48, -1, 7);
    }
    BlockMask made =
        blockMaskFromKvBlocks(num, idx, fullNum, fullIdx, batch, heads, maxKv,
                              qLength, kvLength, qBlock, kvBlock);
    validateOrFind(made, "blockMaskFromKvBlocks");
    if (product(made.batch, made.heads, made.qLength, made.kvLength) <=
        (1 << 16))
      toDense(made);
  }

  void fromDense() {
    int64_t batch = in.ConsumeIntegralInRange<int64_t>(0, 2);
    int64_t heads = in.ConsumeIntegralInRange<int64_t>(0, 2);
    int64_t qLength = in.ConsumeIntegralInRange<int64_t>(0, 40);
    int64_t kvLength = in.ConsumeIntegralInRange<int64_t>(0, 40);
    int32_t qBlock = blockSize(), kvBlock = blockSize();
    std::vector<uint8_t> dense(size_t(batch * heads * qLength * kvLength));
    for (uint8_t &value : dense)
      value = in.ConsumeIntegralInRange<uint8_t>(0, 3) != 0;
    BlockMask made = denseToBlockMask(dense.data(), batch, heads, qLength,
                                      kvLength, qBlock, kvBlock);
    validateOrFind(made, "denseToBlockMask");
    if (made.batch != batch || made.heads != heads)
      return;
    // Each block's class follows from the dense elements it covers.
    std::vector<uint8_t> classes = toDenseBlocks(made);
    const int64_t qBlocks = made.numQBlocks, kvBlocks = made.numKvBlocks();
    for (int64_t bh = 0; bh < batch * heads; ++bh)
      for (int64_t qb = 0; qb < qBlocks; ++qb)
        for (int64_t kb = 0; kb < kvBlocks; ++kb) {
          bool any = false, all = true;
          for (int64_t q = qb * qBlock;
               q < std::min<int64_t>(qLength, (qb + 1) * qBlock); ++q)
            for (int64_t kv = kb * kvBlock;
                 kv < std::min<int64_t>(kvLength, (kb + 1) * kvBlock); ++kv) {
              bool keep =
                  dense[size_t((bh * qLength + q) * kvLength + kv)] != 0;
              any = any || keep;
              all = all && keep;
            }
          uint8_t expected = !any ? EmptyBlock : all ? FullBlock : PartialBlock;
          if (classes[size_t((bh * qBlocks + qb) * kvBlocks + kb)] != expected)
            finding("denseToBlockMask classifies a block against its elements");
        }
  }

  void convert() {
    if (!cache || !haveMask)
      return;
    std::vector<int32_t> batchIdx, kvLength;
    if (in.ConsumeBool())
      batchIdx =
          intArray(4, -1, int32_t(std::min<int64_t>(cache->maxBatch(), 8)));
    if (in.ConsumeBool())
      kvLength = intArray(4, -1, 300);
    PhysicalBlockMask physical;
    if (in.ConsumeBool()) {
      physical = convertLogicalBlockMask(*cache, mask, batchIdx, kvLength);
    } else {
      convertLogicalBlockMaskInto(*cache, mask, batchIdx, kvLength,
                                  physicalMask);
      physical = physicalMask;
    }
    if (physical.pageTable.size() !=
        physical.slots.size() * size_t(physical.pageTableStride))
      finding("convertLogicalBlockMask: page table size is not slots x stride");
    for (int32_t page : physical.pageTable)
      if (page < -1 || page >= cache->numPages())
        finding("convertLogicalBlockMask: page table entry out of range");
  }

  FuzzedDataProvider &in;
  std::unique_ptr<PagedKVCache> cache;
  std::unique_ptr<Snapshot> before;
  CompiledMods mods;
  PagedcParamSlot params[1] = {};
  PagedcBufferRef buffers[1] = {};
  std::vector<int32_t> docIds;
  PagedcModContext context{buffers, params};
  BlockMask mask;
  bool haveMask = false;
  PhysicalBlockMask physicalMask;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzedDataProvider in(data, size);
  Session(in).run();
  return 0;
}
