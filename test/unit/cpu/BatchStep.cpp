//===- BatchStep.cpp - One serving step and its float64 reference ---------===//
#include "BatchStep.h"

#include "TestMods.h"
#include "cpu/Reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pagedc::testutil {

float randomValue(std::mt19937 &rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  float value = uniform(rng);
  return value == 0.0f ? 0.5f : value;
}

void storeAs(HostTensor &tensor, int64_t offset, float value) {
  if (isFloat8(tensor.dtype()))
    tensor.dataAs<uint8_t>()[offset] = floatToFloat8(value, tensor.dtype());
  else if (tensor.dtype() == DType::BF16)
    tensor.dataAs<uint16_t>()[offset] = floatToBF16(value);
  else if (tensor.dtype() == DType::F16)
    tensor.dataAs<uint16_t>()[offset] = floatToHalf(value);
  else
    tensor.dataAs<float>()[offset] = value;
}

float roundTo(DType type, float value) {
  if (type == DType::BF16)
    return bf16ToFloat(floatToBF16(value));
  if (type == DType::F16)
    return halfToFloat(floatToHalf(value));
  return value;
}

HostTensor nanTensor(DType type, std::vector<int64_t> shape) {
  HostTensor tensor(type, std::move(shape));
  for (int64_t i = 0; i < tensor.numel(); ++i)
    storeAs(tensor, i, std::numeric_limits<float>::quiet_NaN());
  return tensor;
}

EngineCache::EngineCache(KVLayout layout, int64_t pages, int64_t pageSize, int64_t heads,
                         int64_t dim, int64_t vDim, DType type, bool valuesInKeys)
    : layout(layout), pages(pages), pageSize(pageSize), heads(heads), dim(dim), vDim(vDim),
      valuesInKeys(valuesInKeys) {
  k = nanTensor(type, shape(0));
  if (layout != KVLayout::VLLM && !valuesInKeys)
    v = nanTensor(type, shape(1));
}

TensorView EngineCache::vView() {
  if (layout == KVLayout::VLLM)
    return TensorView();
  if (!valuesInKeys)
    return v.view();
  std::vector<int64_t> shape = k.view().shape();
  shape.back() = vDim;
  return TensorView(k.data(), k.dtype(), shape, k.view().strides(), k.view().device());
}

std::vector<int64_t> EngineCache::shape(int part) const {
  int64_t width = part == 0 ? dim : vDim;
  switch (layout) {
  case KVLayout::Pagedc:
    return {heads, pages, pageSize, width};
  case KVLayout::NHD:
    return {pages, pageSize, heads, width};
  case KVLayout::HND:
    return {pages, heads, pageSize, width};
  case KVLayout::VLLM:
    return {2, pages, pageSize, heads, width};
  }
  return {};
}

void EngineCache::set(int part, int64_t page, int64_t slot, int64_t head, int64_t d, float value) {
  int64_t width = part == 0 ? dim : vDim;
  int64_t offset = 0;
  switch (layout) {
  case KVLayout::Pagedc:
    offset = ((head * pages + page) * pageSize + slot) * width + d;
    break;
  case KVLayout::NHD:
    offset = ((page * pageSize + slot) * heads + head) * width + d;
    break;
  case KVLayout::HND:
    offset = ((page * heads + head) * pageSize + slot) * width + d;
    break;
  case KVLayout::VLLM:
    offset = (((part * pages + page) * pageSize + slot) * heads + head) * width + d;
    break;
  }
  storeAs(layout == KVLayout::VLLM || part == 0 ? k : v, offset, value);
}

StepBindings::StepBindings(int64_t batch, int64_t heads, int64_t length, std::mt19937 &rng) {
  std::uniform_int_distribution<int32_t> run(1, 48);
  documents.resize(std::max<int64_t>(1, batch * length));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    for (int64_t position = 0; position < length; ++id)
      for (int32_t i = 0, n = run(rng); i < n && position < length; ++i)
        documents[b * length + position++] = id;
  }
  for (int64_t h = 0; h < heads; ++h)
    slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads)));
  bindings.buffers["doc"] = TensorView(documents.data(), DType::I32, {batch, length});
  bindings.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {heads});
  bindings.params["window"] = ParamValue::ofI32(37);
  bindings.params["temperature"] = ParamValue::ofF32(1.5f);
  bindings.params["softcap"] = ParamValue::ofF32(2.0f);
}

std::string BatchStepCheck::describe() const {
  return "rows " + std::to_string(rows) + ", fully masked " + std::to_string(maskedRows) +
         ", out violations " + std::to_string(outViolations) + " (max err " +
         std::to_string(maxOutError) + "), lse violations " + std::to_string(lseViolations) +
         " (max err " + std::to_string(maxLseError) + "), non-finite " + std::to_string(nonFinite) +
         ", lse rows past the plan written " + std::to_string(rowsPastWritten);
}

BatchStep::BatchStep(const BatchStepCase &stepCase) : c(stepCase) {
  std::mt19937 rng(static_cast<uint32_t>(c.seed));
  batch = static_cast<int64_t>(c.seqs.size());
  int64_t totalPages = 3;
  for (const BatchSeq &s : c.seqs) {
    maxQ = std::max<int64_t>(maxQ, s.qLen);
    maxKv = std::max<int64_t>(maxKv, s.seqLen);
    totalPages += (s.seqLen + c.pageSize - 1) / c.pageSize;
    tokens += s.qLen;
  }

  // Dense logical inputs (rounded to the storage type, which the reference
  // reads too), the packed q, and the cache on shuffled pages.
  q4 = HostTensor(DType::F64, {batch, c.qHeads, maxQ, c.dim});
  k4 = HostTensor(DType::F64, {batch, c.kvHeads, maxKv, c.dim});
  v4 = HostTensor(DType::F64, {batch, c.kvHeads, maxKv, c.vDim});
  for (HostTensor *t : {&q4, &k4, &v4})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->dataAs<double>()[i] = roundTo(c.storage, randomValue(rng));
  // MLA: each value row is its key row's first vDim columns.
  if (c.valuesInKeys)
    for (int64_t row = 0; row < batch * c.kvHeads * maxKv; ++row)
      for (int64_t d = 0; d < c.vDim; ++d)
        v4.dataAs<double>()[row * c.vDim + d] = k4.dataAs<double>()[row * c.dim + d];
  // 8-bit K/V: each value becomes what its code means (code * scale), which
  // is what the reference reads; scales differ per head and are not powers
  // of two, so the scale is really applied.
  if (c.kvFloat8) {
    for (int64_t h = 0; h < c.kvHeads; ++h) {
      kScale.push_back(c.perHeadScale ? 0.0137f * static_cast<float>(h + 1) : 0.0211f);
      vScale.push_back(c.perHeadScale ? 0.0093f * static_cast<float>(h + 2) : 0.0173f);
    }
    for (auto [t, scale] : {std::pair{&k4, &kScale}, std::pair{&v4, &vScale}}) {
      const int64_t perHead = t->numel() / (batch * c.kvHeads);
      for (int64_t i = 0; i < t->numel(); ++i) {
        const float factor = (*scale)[(i / perHead) % c.kvHeads];
        const uint8_t code =
            floatToFloat8(static_cast<float>(t->dataAs<double>()[i]) / factor, *c.kvFloat8);
        t->dataAs<double>()[i] = static_cast<double>(float8ToFloat(code, *c.kvFloat8)) * factor;
      }
    }
  }
  // A shared prefix: sequence 0's keys and values.
  for (int64_t b = 1; b < batch && c.sharedPrefix > 0; ++b)
    for (HostTensor *t : {&k4, &v4}) {
      const int64_t width = t == &k4 ? c.dim : c.vDim;
      for (int64_t h = 0; h < c.kvHeads; ++h)
        for (int64_t i = 0; i < c.sharedPrefix * width; ++i)
          t->dataAs<double>()[(b * c.kvHeads + h) * maxKv * width + i] =
              t->dataAs<double>()[h * maxKv * width + i];
    }
  const DType cacheType = c.kvFloat8 ? *c.kvFloat8 : c.storage;
  std::vector<int32_t> pageOrder(static_cast<size_t>(totalPages));
  std::iota(pageOrder.begin(), pageOrder.end(), 0);
  std::shuffle(pageOrder.begin(), pageOrder.end(), rng);
  cache = std::make_unique<EngineCache>(c.layout, totalPages, c.pageSize, c.kvHeads, c.dim, c.vDim,
                                        cacheType, c.valuesInKeys);
  for (const BatchSeq &s : c.seqs)
    columns = std::max<int64_t>(columns, (s.seqLen + c.pageSize - 1) / c.pageSize + 1);
  blockTable.assign(static_cast<size_t>(batch * columns), -1);
  queryStartLoc = {0};
  q = HostTensor(c.storage, {std::max<int64_t>(tokens, 1), c.qHeads, c.dim});
  size_t nextPage = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const BatchSeq &s = c.seqs[b];
    for (int64_t j = 0; j < (s.seqLen + c.pageSize - 1) / c.pageSize; ++j)
      blockTable[b * columns + j] =
          b > 0 && j < c.sharedPrefix / c.pageSize ? blockTable[j] : pageOrder[nextPage++];
    for (int64_t pos = 0; pos < s.seqLen; ++pos)
      for (int64_t h = 0; h < c.kvHeads; ++h) {
        int64_t page = blockTable[b * columns + pos / c.pageSize], slot = pos % c.pageSize;
        for (int64_t d = 0; d < c.dim; ++d)
          cache->set(0, page, slot, h, d,
                     static_cast<float>(
                         k4.dataAs<double>()[((b * c.kvHeads + h) * maxKv + pos) * c.dim + d]) /
                         (c.kvFloat8 ? kScale[h] : 1.0f));
        for (int64_t d = 0; d < (c.valuesInKeys ? 0 : c.vDim); ++d)
          cache->set(1, page, slot, h, d,
                     static_cast<float>(
                         v4.dataAs<double>()[((b * c.kvHeads + h) * maxKv + pos) * c.vDim + d]) /
                         (c.kvFloat8 ? vScale[h] : 1.0f));
      }
    for (int64_t i = 0; i < s.qLen; ++i)
      for (int64_t h = 0; h < c.qHeads; ++h)
        for (int64_t d = 0; d < c.dim; ++d)
          storeAs(
              q, ((queryStartLoc.back() + i) * c.qHeads + h) * c.dim + d,
              static_cast<float>(q4.dataAs<double>()[((b * c.qHeads + h) * maxQ + i) * c.dim + d]));
    queryStartLoc.push_back(queryStartLoc.back() + s.qLen);
    seqLens.push_back(s.seqLen);
    kvLength.push_back(s.seqLen);
    qOffset.push_back(s.seqLen - s.qLen);
  }
  mods = makeTestMods(c.mask, c.score);
  bindings = std::make_unique<StepBindings>(batch, c.qHeads, maxKv, rng);
  if (c.mask == "prefix_lm") {
    // Each prefix ends among the sequence's new tokens or right after them:
    // rows before its end see keys past their own position, rows after it
    // do not, and the ends differ between sequences (drawn after the
    // other inputs, which stay what they are for the other masks).
    for (const BatchSeq &s : c.seqs)
      bindings->prefix.push_back(s.seqLen - s.qLen +
                                 std::uniform_int_distribution<int32_t>(0, s.qLen)(rng));
    bindings->bindings.buffers["prefix"] = TensorView(bindings->prefix.data(), DType::I32, {batch});
  }
  if (c.sinks) {
    // An engine of its own keeps the other inputs what they are without
    // sinks.
    std::mt19937 sinkRng(static_cast<uint32_t>(c.seed) + 17);
    std::uniform_real_distribution<float> nearLse(0.5f, 3.0f);
    const float fixed[] = {9.0f, -9.0f, -std::numeric_limits<float>::infinity()};
    for (int64_t h = 0; h < c.qHeads; ++h)
      sinks.push_back(h % 4 == 0 ? nearLse(sinkRng) : fixed[h % 4 - 1]);
  }
}

TensorView BatchStep::sinksView() const {
  if (sinks.empty())
    return {};
  return TensorView(const_cast<float *>(sinks.data()), DType::F32, {c.qHeads});
}

double BatchStep::scale() const {
  return c.scale > 0.0f ? static_cast<double>(c.scale)
                        : 1.0 / std::sqrt(static_cast<double>(c.dim));
}

BatchAttentionConfig BatchStep::config() const {
  BatchAttentionConfig config;
  config.numQHeads = c.qHeads;
  config.numKVHeads = c.kvHeads;
  config.headDim = c.dim;
  config.valueHeadDim = c.vDim;
  config.pageSize = c.pageSize;
  config.layout = c.layout;
  config.maxNumSeqs = batch + 2;
  config.maxNumTokens = tokens + 5;
  config.maxBlocksPerSeq = columns;
  config.threads = c.threads;
  return config;
}

void BatchStep::plan(BatchAttention &attention) const {
  attention.plan(
      TensorView(const_cast<int32_t *>(queryStartLoc.data()), DType::I32, {batch + 1}),
      TensorView(const_cast<int32_t *>(seqLens.data()), DType::I32, {batch}),
      TensorView(const_cast<int32_t *>(blockTable.data()), DType::I32, {batch, columns}));
}

BatchStepCheck BatchStep::compare(const TensorView &out, const TensorView &lse,
                                  bool cudaTolerance) const {
  // The reference, one sequence at a time (its own rows and keys only, so
  // it costs what the step holds, not B x the longest chunk x the longest
  // context); sequence b's row of the per-sequence buffer is bound as a
  // batch of one, so the mods read what they read in the call.
  std::vector<cpu::ReferenceResult> references;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qLen = c.seqs[b].qLen;
    Bindings one = bindings->bindings;
    one.buffers["doc"] = TensorView(bindings->documents.data() + b * maxKv, DType::I32, {1, maxKv});
    if (one.buffers.count("prefix"))
      one.buffers["prefix"] = TensorView(bindings->prefix.data() + b, DType::I32, {1});
    ResolvedBindings resolved = resolveBindings(mods, one, Device::cpu());
    auto rows = [&](const HostTensor &t, int64_t heads, int64_t length, int64_t width) {
      return TensorView(const_cast<double *>(t.dataAs<double>()) + b * heads * length * width,
                        DType::F64, {1, heads, qLen > 0 && &t == &q4 ? qLen : length, width},
                        {heads * length * width, length * width, width, 1}, Device::cpu());
    };
    cpu::ReferenceArgs ref;
    ref.q = rows(q4, c.qHeads, maxQ, c.dim);
    ref.k = rows(k4, c.kvHeads, maxKv, c.dim);
    ref.v = rows(v4, c.kvHeads, maxKv, c.vDim);
    ref.kvLength = &kvLength[b];
    ref.qOffset = &qOffset[b];
    ref.mods = &mods;
    ref.context = &resolved.context();
    ref.scale = scale();
    ref.sinks = sinks.empty() ? nullptr : sinks.data();
    references.push_back(qLen > 0 ? cpu::referenceAttention(ref) : cpu::ReferenceResult{});
  }

  BatchStepCheck check;
  const bool roundedOut = out.dtype() != DType::F32;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < c.seqs[b].qLen; ++i)
      for (int64_t h = 0; h < c.qHeads; ++h) {
        const int64_t row = queryStartLoc[b] + i;
        ++check.rows;
        const cpu::ReferenceResult &reference = references[b];
        const double expectedLse = reference.lseAt(0, h, i);
        // Every key masked: lse -inf, or exactly the sink.
        const bool masked = std::isinf(expectedLse) ||
                            (!sinks.empty() && expectedLse == static_cast<double>(sinks[h]));
        check.maskedRows += masked;
        for (int64_t d = 0; d < c.vDim; ++d) {
          const double expected = reference.outAt(0, h, i, d);
          const double actual =
              cpu::readAsDouble(out, row * out.stride(0) + h * out.stride(1) + d * out.stride(2));
          if (!std::isfinite(actual)) {
            ++check.nonFinite;
            continue;
          }
          const double error = std::abs(actual - expected);
          check.maxOutError = std::max(check.maxOutError, error);
          // CUDA: probabilities and outputs in f16 / bf16 (inputs in [-1, 1]).
          const double tolerance =
              cudaTolerance ? 1e-2 + std::ldexp(std::abs(expected), -7)
                            : 1e-4 + (roundedOut ? std::ldexp(std::abs(expected), -8) : 0.0);
          check.outViolations += error > tolerance;
        }
        const double actualLse = lse.dataAs<float>()[row * lse.stride(0) + h * lse.stride(1)];
        if (std::isnan(actualLse)) {
          ++check.nonFinite;
        } else if (std::isinf(expectedLse) || std::isinf(actualLse)) {
          check.lseViolations +=
              !(std::isinf(expectedLse) && std::isinf(actualLse) && actualLse < 0);
        } else {
          const double error = std::abs(actualLse - expectedLse);
          check.maxLseError = std::max(check.maxLseError, error);
          check.lseViolations +=
              error > (cudaTolerance ? 1e-2 : 1e-4) * std::max(1.0, std::abs(expectedLse));
        }
      }
  // Rows past the plan's tokens are not written.
  for (int64_t row = tokens; row < lse.size(0); ++row)
    for (int64_t h = 0; h < c.qHeads; ++h)
      check.rowsPastWritten +=
          !std::isnan(lse.dataAs<float>()[row * lse.stride(0) + h * lse.stride(1)]);
  return check;
}

} // namespace pagedc::testutil
