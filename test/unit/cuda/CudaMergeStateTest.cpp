//===- CudaMergeStateTest.cpp - mergeState on the emulated device ---------===//
//
// mergeState, mergeStateInPlace and mergeStates on device tensors, run on
// the SIMT emulator with every checker on, against float64: attention over
// random keys split into disjoint ranges, each range's (out, lse) stored in
// f32, bf16 or f16, merged on the device and compared with the float64
// attention over all keys. Rows whose keys are all masked in one range
// (that range's lse -inf, its values NaN: never read) or in every range
// (out 0, lse -inf), rows whose maximum lies in the second range, strided
// inputs, a stream, and the refusals, which write nothing.
//
//===----------------------------------------------------------------------===//
#include "EmulatorEnvironment.h"

#include "pagedc/BatchAttention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace pagedc;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Random attention over `keys` keys per (t, h) row, with the float64
/// (out, lse) of any key range. Row t sees no key of [0, split) when
/// t % 4 == 1 and no key at all when t % 5 == 3; elsewhere every fourth
/// key is masked.
struct MergeProblem {
  int64_t tokens, heads, dim, keys;
  std::vector<double> q, k, v; // [T, H, D], [N, H, D], [N, H, D]

  MergeProblem(int64_t tokens, int64_t heads, int64_t dim, int64_t keys, uint64_t seed)
      : tokens(tokens), heads(heads), dim(dim), keys(keys) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    auto fill = [&](std::vector<double> &x, int64_t n) {
      x.resize(static_cast<size_t>(n));
      for (double &value : x)
        value = uniform(rng);
    };
    fill(q, tokens * heads * dim);
    fill(k, keys * heads * dim);
    fill(v, keys * heads * dim);
    // Large logits on late keys of some rows: the row maximum lies in the
    // last range.
    for (int64_t n = keys - 3; n < keys; ++n)
      for (int64_t d = 0; d < dim; ++d)
        k[(n * heads + 1 % heads) * dim + d] *= 4.0;
  }

  bool visible(int64_t t, int64_t n, int64_t split) const {
    if (t % 5 == 3)
      return false;
    if (t % 4 == 1 && n < split)
      return false;
    return (n + t) % 4 != 0;
  }

  /// The float64 attention of row (t, h) over keys [begin, end); out
  /// gets dim values.
  double attend(int64_t t, int64_t h, int64_t begin, int64_t end, int64_t split,
                std::vector<double> &out) const {
    out.assign(static_cast<size_t>(dim), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    std::vector<double> scores;
    double maximum = kNegInf;
    for (int64_t n = begin; n < end; ++n) {
      double score = kNegInf;
      if (visible(t, n, split)) {
        score = 0.0;
        for (int64_t d = 0; d < dim; ++d)
          score += q[(t * heads + h) * dim + d] * k[(n * heads + h) * dim + d];
        score *= scale;
      }
      scores.push_back(score);
      maximum = std::max(maximum, score);
    }
    if (maximum == kNegInf)
      return kNegInf;
    double sum = 0.0;
    for (int64_t n = begin; n < end; ++n) {
      const double weight = std::exp(scores[n - begin] - maximum);
      sum += weight;
      for (int64_t d = 0; d < dim; ++d)
        out[d] += weight * v[(n * heads + h) * dim + d];
    }
    for (double &value : out)
      value /= sum;
    return maximum + std::log(sum);
  }
};

/// A device tensor of `type` with a host copy to fill and read back.
struct DeviceTensor {
  HostTensor host;
  DeviceBuffer device;
  TensorView view;

  DeviceTensor(DType type, std::vector<int64_t> shape) : host(type, shape) {
    device = DeviceBuffer(bytes(), 0);
    fillNaN();
    view = TensorView(device.data(), type, host.shape(), host.view().strides(), Device::cuda(0));
  }
  size_t bytes() const { return static_cast<size_t>(host.numel()) * dtypeSize(host.dtype()); }
  void fillNaN() {
    device.fill(0xff);
    device.download(host.data(), bytes());
  }
  void upload() { device.upload(host.data(), bytes()); }
  void download() { device.download(host.data(), bytes()); }
  void set(int64_t offset, float value) {
    if (host.dtype() == DType::BF16)
      host.dataAs<uint16_t>()[offset] = floatToBF16(value);
    else if (host.dtype() == DType::F16)
      host.dataAs<uint16_t>()[offset] = floatToHalf(value);
    else
      host.dataAs<float>()[offset] = value;
  }
  float get(int64_t offset) const {
    if (host.dtype() == DType::BF16)
      return bf16ToFloat(host.dataAs<const uint16_t>()[offset]);
    if (host.dtype() == DType::F16)
      return halfToFloat(host.dataAs<const uint16_t>()[offset]);
    return host.dataAs<const float>()[offset];
  }
  /// Whether every byte is still the 0xff fill.
  bool untouched() {
    download();
    const auto *data = static_cast<const unsigned char *>(host.data());
    for (size_t i = 0; i < bytes(); ++i)
      if (data[i] != 0xff)
        return false;
    return true;
  }
};

/// The tolerance of a merged value stored as `type`: the inputs' rounding
/// (each part's values carry it) plus the output's.
double valueTolerance(DType type) {
  return type == DType::BF16 ? 2e-2 : type == DType::F16 ? 3e-3 : 2e-5;
}

struct MergeErrors {
  double out = 0, lse = 0;
  int64_t maskedRows = 0, badMasked = 0;
};

/// Compares v [T, H, D] and s [T, H] (read back) with the float64
/// attention over all keys.
MergeErrors compareWhole(const MergeProblem &p, int64_t split, const DeviceTensor &v,
                         const DeviceTensor &s) {
  MergeErrors errors;
  std::vector<double> want;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t h = 0; h < p.heads; ++h) {
      const double lse = p.attend(t, h, 0, p.keys, split, want);
      const float gotLse = s.get(t * p.heads + h);
      if (lse == kNegInf) {
        ++errors.maskedRows;
        bool ok = gotLse == -std::numeric_limits<float>::infinity();
        for (int64_t d = 0; d < p.dim; ++d)
          ok = ok && v.get((t * p.heads + h) * p.dim + d) == 0.0f;
        errors.badMasked += ok ? 0 : 1;
        continue;
      }
      errors.lse = std::max(errors.lse, std::abs(gotLse - lse));
      if (std::isnan(gotLse))
        errors.lse = std::numeric_limits<double>::infinity();
      for (int64_t d = 0; d < p.dim; ++d) {
        const double got = v.get((t * p.heads + h) * p.dim + d);
        const double error =
            std::isnan(got) ? std::numeric_limits<double>::infinity() : std::abs(got - want[d]);
        errors.out = std::max(errors.out, error);
      }
    }
  return errors;
}

/// Writes part `part` of `parts` (keys [begin, end)) into v / s at
/// element offsets (t, h) -> vBase(t, h) + d and sOffset(t, h). A -inf
/// part's values are NaN: the merge must not read them.
template <typename ValueAt, typename LseAt>
void writePart(const MergeProblem &p, int64_t begin, int64_t end, int64_t split, DeviceTensor &v,
               DeviceTensor &s, ValueAt valueAt, LseAt lseAt) {
  std::vector<double> out;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t h = 0; h < p.heads; ++h) {
      const double lse = p.attend(t, h, begin, end, split, out);
      s.set(lseAt(t, h), static_cast<float>(lse));
      for (int64_t d = 0; d < p.dim; ++d)
        v.set(valueAt(t, h) + d, lse == kNegInf ? std::nanf("") : static_cast<float>(out[d]));
    }
}

#define EXPECT_MERGED(errors, type)                                                                \
  do {                                                                                             \
    EXPECT_LE((errors).out, valueTolerance(type)) << dtypeName(type);                              \
    EXPECT_LE((errors).lse, 1e-5) << dtypeName(type);                                              \
    EXPECT_GT((errors).maskedRows, 0);                                                             \
    EXPECT_EQ((errors).badMasked, 0) << dtypeName(type);                                           \
  } while (0)

TEST(CudaMergeState, TwoHalvesEqualTheWholeRange) {
  const int64_t tokens = 13, heads = 3, dim = 40, keys = 70, split = 29;
  for (DType type : {DType::F32, DType::BF16, DType::F16}) {
    MergeProblem p(tokens, heads, dim, keys, 7 + static_cast<uint64_t>(type));
    DeviceTensor vA(type, {tokens, heads, dim}), sA(DType::F32, {tokens, heads});
    // v_b and s_b strided: rows of dim + 8 elements, lse of every other slot.
    DeviceTensor vBStorage(type, {tokens, heads, dim + 8}),
        sBStorage(DType::F32, {tokens, heads, 2});
    writePart(
        p, 0, split, split, vA, sA, [&](int64_t t, int64_t h) { return (t * heads + h) * dim; },
        [&](int64_t t, int64_t h) { return t * heads + h; });
    writePart(
        p, split, keys, split, vBStorage, sBStorage,
        [&](int64_t t, int64_t h) { return (t * heads + h) * (dim + 8); },
        [&](int64_t t, int64_t h) { return (t * heads + h) * 2; });
    for (DeviceTensor *tensor : {&vA, &sA, &vBStorage, &sBStorage})
      tensor->upload();
    const Device device = Device::cuda(0);
    TensorView vB(vBStorage.device.data(), type, {tokens, heads, dim},
                  {heads * (dim + 8), dim + 8, 1}, device);
    TensorView sB(sBStorage.device.data(), DType::F32, {tokens, heads}, {heads * 2, 2}, device);

    // Into new tensors, on the legacy stream (the call waits).
    DeviceTensor vOut(type, {tokens, heads, dim}), sOut(DType::F32, {tokens, heads});
    mergeState(vA.view, sA.view, vB, sB, vOut.view, sOut.view);
    vOut.download();
    sOut.download();
    EXPECT_MERGED(compareWhole(p, split, vOut, sOut), type);

    // In place, on a stream.
    const CudaDriver &driver = CudaDriver::get();
    cu::Stream stream = nullptr;
    driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
    MergeStateOptions options;
    options.stream = stream;
    mergeStateInPlace(vA.view, sA.view, vB, sB, options);
    driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
    driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");
    vA.download();
    sA.download();
    EXPECT_MERGED(compareWhole(p, split, vA, sA), type);
  }
}

TEST(CudaMergeState, ThreeWayMergeStates) {
  const int64_t tokens = 11, heads = 2, dim = 24, keys = 61, parts = 3;
  const int64_t bounds[parts + 1] = {0, 17, 40, keys};
  for (DType type : {DType::F32, DType::BF16, DType::F16}) {
    // The masks' "first range" is [0, 17): rows t % 4 == 1 have part 0 -inf.
    MergeProblem p(tokens, heads, dim, keys, 11 + static_cast<uint64_t>(type));
    DeviceTensor v(type, {tokens, parts, heads, dim}), s(DType::F32, {tokens, parts, heads});
    for (int64_t part = 0; part < parts; ++part)
      writePart(
          p, bounds[part], bounds[part + 1], bounds[1], v, s,
          [&](int64_t t, int64_t h) { return ((t * parts + part) * heads + h) * dim; },
          [&](int64_t t, int64_t h) { return (t * parts + part) * heads + h; });
    v.upload();
    s.upload();
    DeviceTensor vOut(type, {tokens, heads, dim}), sOut(DType::F32, {tokens, heads});
    mergeStates(v.view, s.view, vOut.view, sOut.view);
    vOut.download();
    sOut.download();
    EXPECT_MERGED(compareWhole(p, bounds[1], vOut, sOut), type);
  }
}

TEST(CudaMergeState, RefusalsWriteNothing) {
  const int64_t tokens = 5, heads = 2, dim = 16;
  DeviceTensor vA(DType::BF16, {tokens, heads, dim}), sA(DType::F32, {tokens, heads});
  DeviceTensor vB(DType::BF16, {tokens, heads, dim}), sB(DType::F32, {tokens, heads});
  DeviceTensor vOut(DType::BF16, {tokens, heads, dim}), sOut(DType::F32, {tokens, heads});
  DeviceTensor shortV(DType::BF16, {tokens - 1, heads, dim});
  DeviceTensor f16Lse(DType::F16, {tokens, heads});
  DeviceTensor parts(DType::BF16, {tokens, 2, heads, dim}), partLse(DType::F32, {tokens, 3, heads});
  HostTensor hostV(DType::BF16, {tokens, heads, dim});
  auto expectError = [](auto call, const std::string &text) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one containing '" << text << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
    }
  };
  expectError([&] { mergeState(vA.view, sA.view, shortV.view, sB.view, vOut.view, sOut.view); },
              "v_b must have v_a's shape");
  expectError([&] { mergeState(vA.view, sA.view, vB.view, f16Lse.view, vOut.view, sOut.view); },
              "s_b must be f32");
  expectError([&] { mergeState(vA.view, sA.view, hostV.view(), sB.view, vOut.view, sOut.view); },
              "v_b is on cpu but the merge runs on cuda:0");
  expectError([&] { mergeState(vA.view, sA.view, vB.view, sB.view, vOut.view, shortV.view); },
              "s_out must be f32");
  expectError([&] { mergeState(vA.view, sA.view, vB.view, sB.view); },
              "on a device pass v_out and s_out");
  expectError([&] { mergeStates(parts.view, partLse.view, vOut.view, sOut.view); },
              "s must be [5, 2, 2]");
  for (DeviceTensor *tensor : {&vA, &sA, &vB, &sB, &vOut, &sOut, &shortV, &parts, &partLse})
    EXPECT_TRUE(tensor->untouched());
}

} // namespace
