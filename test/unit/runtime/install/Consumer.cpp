//===- Consumer.cpp - Uses the installed pagedc runtime -------------------===//
//
// Fills a paged cache with V = 1, runs a causal attention call and checks
// that every output is 1 (the softmax weights sum to one). Exit status 0 on
// success.
//
//===----------------------------------------------------------------------===//
#include <pagedc/pagedc.h>

#include <cstdio>
#include <vector>

namespace {
void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kvBegin,
               int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kvBegin + i;
}
} // namespace

int main() {
  using namespace pagedc;
  KVCacheConfig config;
  config.numPages = 8;
  config.pageSize = 4;
  config.maxBatch = 1;
  config.heads = 1;
  config.headDim = 2;
  config.valueHeadDim = 2;
  PagedKVCache cache(config);
  cache.reserve(0, 10);
  std::vector<int32_t> slot = {0}, positions(10);
  for (int32_t i = 0; i < 10; ++i)
    positions[i] = i;
  std::vector<float> k(10 * 2, 0.5f), v(10 * 2, 1.0f), q(3 * 2, 0.25f);
  cache.assign(TensorView(slot.data(), DType::I32, {1}),
               TensorView(positions.data(), DType::I32, {1, 10}),
               TensorView(k.data(), DType::F32, {1, 1, 10, 2}),
               TensorView(v.data(), DType::F32, {1, 1, 10, 2}));
  CompiledMods mods;
  mods.maskName = "causal";
  mods.maskRow = causalRow;
  const PagedcModContext context{nullptr, nullptr};
  const BlockMask mask = createBlockMask(mods, context, 1, 1, 10, 10, 4, 4);
  AttentionOptions options;
  options.kvLength = {10};
  options.qOffset = {7};
  AttentionResult result = flexAttention(TensorView(q.data(), DType::F32, {1, 1, 3, 2}), cache,
                                         &mask, mods, Bindings(), options);
  for (int64_t i = 0; i < result.out.numel(); ++i)
    if (result.out.dataAs<float>()[i] < 0.999f || result.out.dataAs<float>()[i] > 1.001f) {
      std::printf("unexpected output %f\n", result.out.dataAs<float>()[i]);
      return 1;
    }
  std::printf("pagedc runtime install OK\n");
  return 0;
}
