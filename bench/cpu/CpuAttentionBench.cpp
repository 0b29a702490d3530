//===- CpuAttentionBench.cpp - CPU paged attention throughput -------------===//
//
// bench/README.md targets §3: prefill (B=1, H=8, S=2048, D=64; causal with a
// 128x128 block mask, and ALiBi) and decode (B=16, Hq=32, Hkv=8, 4k context,
// D=128, page 16), f32. Each case runs the tiled kernel and, as the anchor,
// a naive single-pass loop with the same semantics (page lookup and mod call
// per element, online softmax, one thread). Reports medians over --reps runs.
//
// Usage: pagedc-bench-cpu-attention [--reps N] [--threads T]
//          [--variant auto|generic|avx2|avx512] [--naive-reps N] [--only CASE]
//          [--json FILE]
//
//===----------------------------------------------------------------------===//
#include "AttentionCase.h"
#include "cpu/CpuAttention.h"
#include "cpu/Reference.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace pagedc;

namespace {

//===- Hand-written mods (the JIT emits the same ABI) ---------------------===//

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kv,
               int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kv + i;
}
int32_t causalClass(const PagedcModContext *, int32_t, int32_t, int32_t qLow, int32_t qHigh,
                    int32_t kvLow, int32_t kvHigh) {
  return qHigh < kvLow ? 0 : (qLow >= kvHigh ? 2 : 1);
}
/// s + slopes[h] * (kv - q), slopes in buffer 0.
void alibiRow(const PagedcModContext *ctx, int32_t, int32_t h, int32_t q, int32_t kv,
              int32_t count, float *scores) {
  float slope = static_cast<const float *>(ctx->buffers[0].data)[h];
  for (int32_t i = 0; i < count; ++i)
    scores[i] += slope * static_cast<float>(kv + i - q);
}

/// A causal block mask over [length, length] with square blocks.
BlockMask causalBlockMask(int64_t length, int32_t blockSize) {
  BlockMask mask;
  mask.qLength = mask.kvLength = length;
  mask.qBlockSize = mask.kvBlockSize = blockSize;
  mask.numQBlocks = mask.maxKvBlocks = (length + blockSize - 1) / blockSize;
  mask.kvNumBlocks.assign(mask.numQBlocks, 1);
  mask.fullKvNumBlocks.resize(mask.numQBlocks);
  mask.kvIndices.assign(mask.numQBlocks * mask.maxKvBlocks, 0);
  mask.fullKvIndices.assign(mask.numQBlocks * mask.maxKvBlocks, 0);
  for (int64_t row = 0; row < mask.numQBlocks; ++row) {
    mask.kvIndices[row * mask.maxKvBlocks] = static_cast<int32_t>(row);
    mask.fullKvNumBlocks[row] = static_cast<int32_t>(row);
    for (int64_t k = 0; k < row; ++k)
      mask.fullKvIndices[row * mask.maxKvBlocks + k] = static_cast<int32_t>(k);
  }
  return mask;
}

//===- The naive anchor ---------------------------------------------------===//

/// One thread, one pass per query row: per key a page lookup, the mask mod,
/// a dot product, the score mod and an online-softmax update.
void naiveAttention(const cpu::PagedAttentionArgs &args) {
  int64_t batch = args.q.size(0), qHeads = args.q.size(1), qLength = args.q.size(2);
  int64_t dim = args.q.size(3), kvHeads = args.kCache.size(0), vDim = args.vCache.size(3);
  int64_t group = qHeads / kvHeads;
  const float *k = args.kCache.dataAs<const float>();
  const float *v = args.vCache.dataAs<const float>();
  const CompiledMods *mods = args.mods;
  std::vector<float> acc(vDim);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < qHeads; ++h)
      for (int64_t i = 0; i < qLength; ++i) {
        const float *q = args.q.dataAs<const float>() + ((b * qHeads + h) * qLength + i) * dim;
        int32_t position = static_cast<int32_t>((args.qOffset ? args.qOffset[b] : 0) + i);
        float maxScore = -std::numeric_limits<float>::infinity(), sum = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int32_t kv = 0; kv < args.kvLength[b]; ++kv) {
          if (mods->maskRow) {
            uint8_t keep;
            mods->maskRow(args.context, static_cast<int32_t>(b), static_cast<int32_t>(h),
                          position, kv, 1, &keep);
            if (!keep)
              continue;
          }
          int64_t page = args.pageTable[b * args.pageTableStride + kv / args.pageSize];
          int64_t row = ((h / group) * args.kCache.size(1) + page) * args.pageSize +
                        kv % args.pageSize;
          float score = 0.0f;
          for (int64_t d = 0; d < dim; ++d)
            score += q[d] * k[row * dim + d];
          score *= args.scale;
          if (mods->scoreRow)
            mods->scoreRow(args.context, static_cast<int32_t>(b), static_cast<int32_t>(h),
                           position, kv, 1, &score);
          float newMax = std::max(maxScore, score);
          float correction = std::exp(maxScore - newMax);
          float weight = std::exp(score - newMax);
          sum = sum * correction + weight;
          for (int64_t d = 0; d < vDim; ++d)
            acc[d] = acc[d] * correction + weight * v[row * vDim + d];
          maxScore = newMax;
        }
        float *out = args.out.dataAs<float>() + ((b * qHeads + h) * qLength + i) * vDim;
        for (int64_t d = 0; d < vDim; ++d)
          out[d] = sum > 0 ? acc[d] / sum : 0.0f;
      }
}

//===- Cases --------------------------------------------------------------===//

using Case = bench::AttentionCase;

struct Measurement {
  double medianSeconds = 0, minSeconds = 0;
  /// Median CPU time of the whole process (all threads) per run: less
  /// sensitive than wall time to other jobs sharing the machine.
  double medianCpuSeconds = 0;
};

double processCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

Measurement measure(int reps, const std::function<void()> &run) {
  std::vector<double> seconds, cpuSeconds;
  run(); // warm-up: page faults, pool start, caches
  for (int r = 0; r < reps; ++r) {
    double cpuStart = processCpuSeconds();
    auto start = std::chrono::steady_clock::now();
    run();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    cpuSeconds.push_back(processCpuSeconds() - cpuStart);
  }
  std::sort(seconds.begin(), seconds.end());
  std::sort(cpuSeconds.begin(), cpuSeconds.end());
  return {seconds[seconds.size() / 2], seconds.front(), cpuSeconds[cpuSeconds.size() / 2]};
}

struct Options {
  int reps = 7;
  int naiveReps = 3;
  int threads = 0;
  cpu::KernelVariant variant = cpu::KernelVariant::Auto;
  std::string json;
  std::string only; // run just the case of this name
};

bench::Json runCase(const Case &c, const Options &options) {
  auto [q, k, v] = bench::randomInputs(c);
  std::vector<int32_t> kvLength(c.batch, static_cast<int32_t>(c.kvLength));
  std::vector<int32_t> qOffset(c.batch, static_cast<int32_t>(c.kvLength - c.qLength));
  cpu::PagedCache cache =
      cpu::buildPagedCache(k.view(), v.view(), kvLength.data(), c.pageSize, DType::F32, 7, 0);
  std::vector<float> slopes(c.qHeads);
  for (int64_t h = 0; h < c.qHeads; ++h)
    slopes[h] = std::exp2(-8.0f * (h + 1) / c.qHeads);
  PagedcBufferRef slopesRef{slopes.data(), {c.qHeads, 0, 0, 0}, {1, 0, 0, 0}};
  PagedcModContext context{&slopesRef, nullptr};
  CompiledMods mods;
  if (c.causal) {
    mods.maskName = "causal";
    mods.maskRow = causalRow;
    mods.maskBlockClass = causalClass;
  }
  if (c.alibi) {
    mods.scoreName = "alibi";
    mods.scoreRow = alibiRow;
  }
  BlockMask blockMask = causalBlockMask(c.kvLength, 128);
  HostTensor out(DType::F32, {c.batch, c.qHeads, c.qLength, c.dim});
  HostTensor lse(DType::F32, {c.batch, c.qHeads, c.qLength});

  cpu::PagedAttentionArgs args;
  args.q = q.view();
  args.kCache = cache.kCache.view();
  args.vCache = cache.vCache.view();
  args.pageTable = cache.pageTable.data();
  args.pageTableStride = cache.pageTableStride;
  args.pageSize = cache.pageSize;
  args.kvLength = kvLength.data();
  args.qOffset = qOffset.data();
  args.blockMask = c.causal && c.qLength > 1 ? &blockMask : nullptr;
  args.mods = &mods;
  args.context = &context;
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  args.out = out.view();
  args.lse = lse.view();
  args.threads = options.threads;
  args.variant = options.variant;

  Measurement tiled = measure(options.reps, [&] { cpu::pagedAttention(args); });
  std::vector<float> tiledOut(out.dataAs<float>(), out.dataAs<float>() + out.numel());
  Measurement naive = measure(options.naiveReps, [&] { naiveAttention(args); });
  double maxDifference = 0;
  for (int64_t i = 0; i < out.numel(); ++i)
    maxDifference = std::max<double>(maxDifference, std::abs(tiledOut[i] - out.dataAs<float>()[i]));

  // Visible (q, kv) pairs: with the causal mask the rows at the end of the
  // context see position + 1 keys.
  double pairs = 0;
  for (int64_t i = 0; i < c.qLength; ++i)
    pairs += c.causal ? static_cast<double>(c.kvLength - c.qLength + i + 1)
                      : static_cast<double>(c.kvLength);
  pairs *= static_cast<double>(c.batch * c.qHeads);
  double flops = 4.0 * pairs * static_cast<double>(c.dim);
  double tokens = static_cast<double>(c.batch * c.qLength);
  double ratio = naive.medianSeconds / tiled.medianSeconds;
  fmt::print("{:<16} {:>9.2f} {:>9.2f} {:>11.0f} {:>8.1f} {:>10.1f} {:>8.1f} {:>7.1f}x  {:.1e}\n",
             c.name, tiled.medianSeconds * 1e3, tiled.medianCpuSeconds * 1e3,
             tokens / tiled.medianSeconds, flops / tiled.medianSeconds * 1e-9,
             naive.medianSeconds * 1e3, flops / naive.medianSeconds * 1e-9, ratio,
             maxDifference);
  using bench::rounded;
  bench::Json row = bench::caseJson(c);
  row.update(bench::Json{{"median_ms", rounded(tiled.medianSeconds * 1e3, 4)},
                          {"min_ms", rounded(tiled.minSeconds * 1e3, 4)},
                          {"cpu_ms", rounded(tiled.medianCpuSeconds * 1e3, 4)},
                          {"tokens_per_s", rounded(tokens / tiled.medianSeconds, 1)},
                          {"gflops", rounded(flops / tiled.medianSeconds * 1e-9, 2)},
                          {"naive_median_ms", rounded(naive.medianSeconds * 1e3, 4)},
                          {"naive_gflops", rounded(flops / naive.medianSeconds * 1e-9, 3)},
                          {"speedup_vs_naive", rounded(ratio, 2)},
                          {"max_abs_diff_vs_naive", bench::significant(maxDifference, 3)}});
  return row;
}

} // namespace

int main(int argc, char **argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "{} needs a value\n", arg);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--reps") {
      options.reps = std::max(1, std::stoi(value()));
    } else if (arg == "--naive-reps") {
      options.naiveReps = std::max(1, std::stoi(value()));
    } else if (arg == "--threads") {
      options.threads = std::stoi(value());
    } else if (arg == "--only") {
      options.only = value();
    } else if (arg == "--json") {
      options.json = value();
    } else if (arg == "--variant") {
      std::string name = value();
      bool known = false;
      for (auto variant : {cpu::KernelVariant::Auto, cpu::KernelVariant::Generic,
                           cpu::KernelVariant::Avx2, cpu::KernelVariant::Avx512})
        if (name == cpu::kernelVariantName(variant)) {
          options.variant = variant;
          known = true;
        }
      if (!known) {
        fmt::print(stderr, "unknown variant '{}'\n", name);
        return 2;
      }
    } else {
      fmt::print(stderr, "usage: {} [--reps N] [--naive-reps N] [--threads T] "
                         "[--variant auto|generic|avx2|avx512] [--only CASE] [--json FILE]\n", argv[0]);
      return 2;
    }
  }

  const Case cases[] = {
      {"prefill-causal", 1, 8, 8, 2048, 2048, 64, 16, true, false},
      {"prefill-alibi", 1, 8, 8, 2048, 2048, 64, 16, false, true},
      {"decode", 16, 32, 8, 1, 4096, 128, 16, false, false},
      {"decode-causal", 16, 32, 8, 1, 4096, 128, 16, true, false},
  };
  int threads = options.threads > 0 ? options.threads
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Auto resolves to the widest supported variant.
  cpu::KernelVariant variant = options.variant == cpu::KernelVariant::Auto
                                   ? cpu::supportedKernelVariants().back()
                                   : options.variant;
  fmt::print("CPU paged attention, f32, {} threads, variant {}, median of {} (naive: {}, 1 thread)\n",
             threads, cpu::kernelVariantName(variant), options.reps, options.naiveReps);
  fmt::print("{:<16} {:>9} {:>9} {:>11} {:>8} {:>10} {:>8} {:>8}  {}\n", "case", "ms", "cpu ms",
             "tokens/s", "GFLOP/s", "naive ms", "GFLOP/s", "speedup", "max|diff|");
  bench::Json entries = bench::Json::array();
  for (const Case &c : cases)
    if (options.only.empty() || options.only == c.name)
      entries.push_back(runCase(c, options));
  if (!options.json.empty()) {
    try {
      bench::writeJson("--json", options.json,
                       {{"benchmark", "cpu_paged_attention"},
                        {"threads", threads},
                        {"variant", cpu::kernelVariantName(variant)},
                        {"reps", options.reps},
                        {"cases", entries}});
    } catch (const Error &error) {
      fmt::print(stderr, "{}\n", error.what());
      return 1;
    }
  }
  return 0;
}
