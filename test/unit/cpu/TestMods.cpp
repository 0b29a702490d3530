//===- TestMods.cpp - Hand-written mods for the CPU attention tests -------===//
#include "TestMods.h"

#include "pagedc/Error.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace pagedc::testutil {
namespace {

// Declaration order of the test program's buffers and params.
// (prefix_lm declares a third buffer, prefix, after these two.)
enum BufferSlot { DocBuffer = 0, SlopesBuffer = 1, PrefixBuffer = 2 };
enum ParamSlot { WindowParam = 0, TemperatureParam = 1, SoftcapParam = 2 };

int32_t documentAt(const PagedcModContext *ctx, int32_t b, int32_t position) {
  const PagedcBufferRef &doc = ctx->buffers[DocBuffer];
  return static_cast<const int32_t *>(doc.data)[b * doc.strides[0] + position * doc.strides[1]];
}
float slopeAt(const PagedcModContext *ctx, int32_t h) {
  const PagedcBufferRef &slopes = ctx->buffers[SlopesBuffer];
  return static_cast<const float *>(slopes.data)[h * slopes.strides[0]];
}

//===- Mask mods (ABI and reference) --------------------------------------===//

bool causal(int32_t q, int32_t kv) { return q >= kv; }
bool sliding(const PagedcModContext &ctx, int32_t q, int32_t kv) {
  return q >= kv && q - kv <= ctx.params[WindowParam].i32;
}
bool document(const PagedcModContext &ctx, int32_t b, int32_t q, int32_t kv) {
  return q >= kv && documentAt(&ctx, b, q) == documentAt(&ctx, b, kv);
}
bool holes(int32_t h, int32_t q, int32_t kv) { return (q + h) % 3 != 0 && q >= kv; }
/// A window of kFixedWindow keys ending at the query, fixed in the mod (no
/// param): the block classifier can bound it when plan() runs.
constexpr int32_t kFixedWindow = 100;
bool fixedWindow(int32_t q, int32_t kv) { return q >= kv && q - kv < kFixedWindow; }
bool prefixLm(const PagedcModContext &ctx, int32_t b, int32_t q, int32_t kv) {
  const PagedcBufferRef &prefix = ctx.buffers[PrefixBuffer];
  return kv < static_cast<const int32_t *>(prefix.data)[b * prefix.strides[0]] || q >= kv;
}

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kv,
               int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = causal(q, kv + i);
}
void slidingRow(const PagedcModContext *ctx, int32_t, int32_t, int32_t q, int32_t kv,
                int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = sliding(*ctx, q, kv + i);
}
void documentRow(const PagedcModContext *ctx, int32_t b, int32_t, int32_t q, int32_t kv,
                 int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = document(*ctx, b, q, kv + i);
}
void windowRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kv,
               int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = fixedWindow(q, kv + i);
}
void holesRow(const PagedcModContext *, int32_t, int32_t h, int32_t q, int32_t kv,
              int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = holes(h, q, kv + i);
}
void prefixLmRow(const PagedcModContext *ctx, int32_t b, int32_t, int32_t q, int32_t kv,
                 int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = prefixLm(*ctx, b, q, kv + i);
}
void neverRow(const PagedcModContext *, int32_t, int32_t, int32_t, int32_t, int32_t count,
              uint8_t *out) {
  std::fill(out, out + count, 0);
}

/// Exact classification of causal over q in [qLow, qHigh], kv in [kvLow, kvHigh].
int32_t causalBlockClass(const PagedcModContext *, int32_t, int32_t, int32_t qLow,
                         int32_t qHigh, int32_t kvLow, int32_t kvHigh) {
  if (qHigh < kvLow)
    return 0;
  if (qLow >= kvHigh)
    return 2;
  return 1;
}

/// Exact classification of window over the same rectangles.
int32_t windowBlockClass(const PagedcModContext *, int32_t, int32_t, int32_t qLow,
                         int32_t qHigh, int32_t kvLow, int32_t kvHigh) {
  if (qHigh < kvLow || qLow - kvHigh >= kFixedWindow)
    return 0;
  if (qLow >= kvHigh && qHigh - kvLow < kFixedWindow)
    return 2;
  return 1;
}
int32_t neverBlockClass(const PagedcModContext *, int32_t, int32_t, int32_t, int32_t, int32_t,
                        int32_t) {
  return 0;
}

//===- Score mods ---------------------------------------------------------===//

void alibiRow(const PagedcModContext *ctx, int32_t, int32_t h, int32_t q, int32_t kv,
              int32_t count, float *scores) {
  float temperature = ctx->params[TemperatureParam].f32;
  float slope = slopeAt(ctx, h);
  for (int32_t i = 0; i < count; ++i)
    scores[i] = scores[i] * temperature + slope * static_cast<float>(kv + i - q);
}
void softcapRow(const PagedcModContext *ctx, int32_t, int32_t, int32_t, int32_t,
                int32_t count, float *scores) {
  float cap = ctx->params[SoftcapParam].f32;
  for (int32_t i = 0; i < count; ++i)
    scores[i] = cap * std::tanh(scores[i] / cap);
}

/// The mods' CUDA code (templates/Hooks.cuh's hooks) for the declarations
/// above: Params holds the params, then per buffer its pointer, strides and
/// sizes (ParamsLayout), so the kernel reads what the CPU functions read.
std::string cudaModCode(const std::string &mask, const std::string &score) {
  std::string code = R"(namespace pagedc_mods {
struct Params {
  int32_t window;
  float temperature;
  float softcap;
  const int32_t *doc;
  int64_t doc_stride[2];
  int64_t doc_size[2];
  const float *slopes;
  int64_t slopes_stride[1];
  int64_t slopes_size[1];
};
struct MaskRow {};
struct ScoreRow {};
__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int) { return {}; }
__device__ __forceinline__ ScoreRow score_row(const Params &, int, int, int) { return {}; }
__device__ __forceinline__ int32_t document_at(const Params &p, int b, int position) {
  return p.doc[b * p.doc_stride[0] + position * p.doc_stride[1]];
}
)";
  // prefix_lm's third buffer, laid out as ParamsLayout lays out a buffer.
  if (mask == "prefix_lm")
    code.insert(code.find("};\nstruct MaskRow"),
                "  const int32_t *prefix;\n  int64_t prefix_stride[1];\n"
                "  int64_t prefix_size[1];\n");
  std::string keep = "true";
  if (mask == "causal")
    keep = "q >= kv";
  else if (mask == "sliding")
    keep = "q >= kv && q - kv <= p.window";
  else if (mask == "document")
    keep = "q >= kv && document_at(p, b, q) == document_at(p, b, kv)";
  else if (mask == "holes")
    keep = "(q + h) % 3 != 0 && q >= kv";
  else if (mask == "window")
    keep = "q >= kv && q - kv < " + std::to_string(kFixedWindow);
  else if (mask == "prefix_lm")
    keep = "kv < p.prefix[b * p.prefix_stride[0]] || q >= kv";
  else if (mask == "never")
    keep = "false";
  std::string modded = "s";
  if (score == "alibi")
    modded = "s * p.temperature + p.slopes[h * p.slopes_stride[0]] * static_cast<float>(kv - q)";
  else if (score == "softcap")
    modded = "p.softcap * tanhf(s / p.softcap)";
  code += "constexpr bool kHasMask = " + std::string(mask.empty() ? "false" : "true") + ";\n";
  code += "constexpr bool kHasScore = " + std::string(score.empty() ? "false" : "true") + ";\n";
  code += "__device__ __forceinline__ bool mask(const Params &p, const MaskRow &, int b, int h, "
          "int q, int kv) {\n  (void)p; (void)b; (void)h; (void)q; (void)kv;\n  return " +
          keep + ";\n}\n";
  code += "__device__ __forceinline__ float score(const Params &p, const ScoreRow &, float s, "
          "int b, int h, int q, int kv) {\n  (void)p; (void)b; (void)h; (void)q; (void)kv;\n"
          "  return " +
          modded + ";\n}\n";
  code += "PAGEDC_MASK_COL_UNSPLIT()\n} // namespace pagedc_mods\n";
  return code;
}

} // namespace

CompiledMods makeTestMods(const std::string &mask, const std::string &score) {
  CompiledMods mods;
  BufferDecl doc;
  doc.name = "doc";
  doc.elementType = DType::I32;
  doc.dims = {BufferDim{BufferDim::Named, 0, "B"}, BufferDim{BufferDim::Named, 0, "S"}};
  BufferDecl slopes;
  slopes.name = "slopes";
  slopes.elementType = DType::F32;
  slopes.dims = {BufferDim{BufferDim::Named, 0, "H"}};
  mods.buffers = {doc, slopes};
  ParamDecl window{"window", ScalarKind::I32, std::nullopt};
  ParamDecl temperature{"temperature", ScalarKind::F32, std::nullopt};
  ParamDecl softcap{"softcap", ScalarKind::F32, std::nullopt};
  mods.params = {window, temperature, softcap};

  mods.maskName = mask;
  if (mask == "causal") {
    mods.maskRow = causalRow;
    mods.maskBlockClass = causalBlockClass;
    mods.maskReference = [](const PagedcModContext &, int32_t, int32_t, int32_t q,
                            int32_t kv) { return causal(q, kv); };
    mods.maskDependence = {false, false, true, true, true, {}, {}};
  } else if (mask == "sliding") {
    mods.maskRow = slidingRow;
    mods.maskReference = [](const PagedcModContext &ctx, int32_t, int32_t, int32_t q,
                            int32_t kv) { return sliding(ctx, q, kv); };
    mods.maskDependence = {false, false, true, true, true, {}, {"window"}};
  } else if (mask == "document") {
    mods.maskRow = documentRow;
    mods.maskReference = [](const PagedcModContext &ctx, int32_t b, int32_t, int32_t q,
                            int32_t kv) { return document(ctx, b, q, kv); };
    mods.maskDependence = {true, false, true, true, false, {"doc"}, {}};
  } else if (mask == "window") {
    mods.maskRow = windowRow;
    mods.maskBlockClass = windowBlockClass;
    mods.maskReference = [](const PagedcModContext &, int32_t, int32_t, int32_t q,
                            int32_t kv) { return fixedWindow(q, kv); };
    mods.maskDependence = {false, false, true, true, true, {}, {}};
  } else if (mask == "holes") {
    mods.maskRow = holesRow;
    mods.maskReference = [](const PagedcModContext &, int32_t, int32_t h, int32_t q,
                            int32_t kv) { return holes(h, q, kv); };
    mods.maskDependence = {false, true, true, true, false, {}, {}};
  } else if (mask == "prefix_lm") {
    BufferDecl prefix;
    prefix.name = "prefix";
    prefix.elementType = DType::I32;
    prefix.dims = {BufferDim{BufferDim::Named, 0, "B"}};
    mods.buffers.push_back(prefix);
    mods.maskRow = prefixLmRow;
    mods.maskReference = [](const PagedcModContext &ctx, int32_t b, int32_t, int32_t q,
                            int32_t kv) { return prefixLm(ctx, b, q, kv); };
    mods.maskDependence = {true, false, true, true, false, {"prefix"}, {}};
  } else if (mask == "never") {
    mods.maskRow = neverRow;
    mods.maskBlockClass = neverBlockClass;
    mods.maskReference = [](const PagedcModContext &, int32_t, int32_t, int32_t,
                            int32_t) { return false; };
    mods.maskDependence = {false, false, false, false, false, {}, {}};
  } else if (!mask.empty()) {
    throw Error("makeTestMods: unknown mask mod '" + mask + "'");
  }

  mods.scoreName = score;
  if (score == "alibi") {
    mods.scoreRow = alibiRow;
    mods.scoreReference = [](const PagedcModContext &ctx, double s, int32_t, int32_t h,
                             int32_t q, int32_t kv) {
      return s * ctx.params[TemperatureParam].f32 +
             static_cast<double>(slopeAt(&ctx, h)) * (static_cast<double>(kv) - q);
    };
    mods.scoreDependence = {false, true, true, true, true, {"slopes"}, {"temperature"}};
  } else if (score == "softcap") {
    mods.scoreRow = softcapRow;
    mods.scoreReference = [](const PagedcModContext &ctx, double s, int32_t, int32_t,
                             int32_t, int32_t) {
      double cap = ctx.params[SoftcapParam].f32;
      return cap * std::tanh(s / cap);
    };
    mods.scoreDependence = {false, false, false, false, false, {}, {"softcap"}};
  } else if (!score.empty()) {
    throw Error("makeTestMods: unknown score mod '" + score + "'");
  }
  mods.cuda.modCode = cudaModCode(mask, score);
  return mods;
}

TestBindings::TestBindings(int64_t batch, int64_t heads, int64_t length, uint64_t seed,
                           int32_t window, float temperature, float softcap,
                           int32_t meanDocument) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> documentLength(1, 2 * meanDocument);
  documents_.resize(batch * length);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    int64_t position = 0;
    while (position < length) {
      int32_t run = documentLength(rng);
      for (int32_t i = 0; i < run && position < length; ++i)
        documents_[b * length + position++] = id;
      ++id;
    }
  }
  slopes_.resize(heads);
  for (int64_t h = 0; h < heads; ++h)
    slopes_[h] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads));

  buffers_[DocBuffer] = {documents_.data(), {batch, length, 0, 0}, {length, 1, 0, 0}};
  buffers_[SlopesBuffer] = {slopes_.data(), {heads, 0, 0, 0}, {1, 0, 0, 0}};
  params_[WindowParam].i32 = window;
  params_[TemperatureParam].f32 = temperature;
  params_[SoftcapParam].f32 = softcap;
  context_ = {buffers_, params_};
}

} // namespace pagedc::testutil
