//===- CpuAttentionBench.cpp - CPU paged attention throughput -------------===//
//
// bench/README.md targets §3: prefill (B=1, H=8, S=2048, D=64; causal with a
// 128x128 block mask, and ALiBi) and decode (B=16, Hq=32, Hkv=8, 4k context,
// D=128, page 16), f32. Each case runs the tiled kernel and, as the anchor,
// a naive single-pass loop with the same semantics (page lookup and mod call
// per element, online softmax, one thread). Reports medians over --reps runs.
//
// Decode also runs on dense K/V ([B, Hkv, S, D] read in place, as
// flexAttention(q, k, v) does; page size 0 in the table) and with Hq = Hkv.
// --read-bandwidth measures instead what reading the decode's 537 MB of K/V
// costs with no arithmetic: contiguous, and in shuffled 8 KiB / 64 KiB
// chunks (16-token pages of one head are 8 KiB), the last also with software
// prefetch.
//
// Usage: pagedc-bench-cpu-attention [--reps N] [--threads T]
//          [--variant auto|generic|avx2|avx512] [--naive-reps N] [--only CASE]
//          [--read-bandwidth] [--json FILE]
//
//===----------------------------------------------------------------------===//
#include "AttentionCase.h"
#include "OptionValues.h"
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
          auto rowOf = [&](const TensorView &cache) {
            return (h / group) * cache.stride(0) + page * cache.stride(1) +
                   (kv % args.pageSize) * cache.stride(2);
          };
          const float *kRow = k + rowOf(args.kCache), *vRow = v + rowOf(args.vCache);
          float score = 0.0f;
          for (int64_t d = 0; d < dim; ++d)
            score += q[d] * kRow[d];
          score *= args.scale;
          if (mods->scoreRow)
            mods->scoreRow(args.context, static_cast<int32_t>(b), static_cast<int32_t>(h),
                           position, kv, 1, &score);
          float newMax = std::max(maxScore, score);
          float correction = std::exp(maxScore - newMax);
          float weight = std::exp(score - newMax);
          sum = sum * correction + weight;
          for (int64_t d = 0; d < vDim; ++d)
            acc[d] = acc[d] * correction + weight * vRow[d];
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
  /// Measure the read bandwidth of the decode's K/V bytes instead.
  bool readBandwidth = false;
};

using bench::rounded;

bench::Json runCase(const Case &c, const Options &options) {
  auto [q, k, v] = bench::randomInputs(c);
  std::vector<int32_t> kvLength(c.batch, static_cast<int32_t>(c.kvLength));
  std::vector<int32_t> qOffset(c.batch, static_cast<int32_t>(c.kvLength - c.qLength));
  // Page size 0: dense K/V read in place, as flexAttention(q, k, v, ...)
  // does: k seen as [Hkv, B, S, D] is a cache of one S-token page per
  // sequence.
  const bool dense = c.pageSize == 0;
  cpu::PagedCache cache;
  std::vector<int32_t> identity(c.batch);
  if (!dense)
    cache = cpu::buildPagedCache(k.view(), v.view(), kvLength.data(), c.pageSize, DType::F32, 7,
                                 0);
  for (int64_t b = 0; b < c.batch; ++b)
    identity[b] = static_cast<int32_t>(b);
  auto pagedView = [&](HostTensor &t) {
    return TensorView(t.data(), DType::F32, {c.kvHeads, c.batch, c.kvLength, c.dim},
                      {c.kvLength * c.dim, c.kvHeads * c.kvLength * c.dim, c.dim, 1},
                      Device::cpu());
  };
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
  args.kCache = dense ? pagedView(k) : cache.kCache.view();
  args.vCache = dense ? pagedView(v) : cache.vCache.view();
  args.pageTable = dense ? identity.data() : cache.pageTable.data();
  args.pageTableStride = dense ? 1 : cache.pageTableStride;
  args.pageSize = dense ? static_cast<int32_t>(c.kvLength) : cache.pageSize;
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
  bench::Json row = bench::caseJson(c);
  row.update(bench::Json{{"kv_layout", dense ? "dense [B, Hkv, S, D]" : "pages"},
                         {"kv_bytes", 2 * c.batch * c.kvHeads * c.kvLength * c.dim * 4},
                         {"kv_gb_per_s", rounded(2.0 * static_cast<double>(
                                                         c.batch * c.kvHeads * c.kvLength *
                                                         c.dim * 4) /
                                                     tiled.medianSeconds * 1e-9,
                                                 2)}});
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

//===- Read bandwidth ------------------------------------------------------===//

/// Sums [begin, end) of `data` with independent vector accumulators, so the
/// loop is bound by the loads alone.
float sumRange(const float *data, int64_t begin, int64_t end) {
  using Vec = float __attribute__((vector_size(16)));
  Vec acc[8] = {};
  int64_t i = begin;
  for (; i + 32 <= end; i += 32)
    for (int j = 0; j < 8; ++j) {
      Vec x;
      std::memcpy(&x, data + i + 4 * j, sizeof(x));
      acc[j] += x;
    }
  float total = 0;
  for (; i < end; ++i)
    total += data[i];
  for (int j = 0; j < 8; ++j)
    for (int lane = 0; lane < 4; ++lane)
      total += acc[j][lane];
  return total;
}

/// The ceiling decode runs under: GB/s of `threads` threads reading `bytes`
/// once, either in one contiguous half each or in chunks of `chunkBytes`
/// taken in a shuffled order (what scattered pages cost the prefetcher),
/// with `prefetch`: each thread asks for the chunk four ahead of the one it
/// sums (prefetcht1 on every line, as the decode kernel does for its next
/// tile).
bench::Json readBandwidth(int64_t bytes, int64_t chunkBytes, bool prefetch, int threads,
                          int reps) {
  const int64_t floats = bytes / 4;
  std::vector<float> data(static_cast<size_t>(floats));
  for (int64_t i = 0; i < floats; ++i)
    data[i] = static_cast<float>(i & 1023);
  const int64_t chunk = chunkBytes > 0 ? chunkBytes / 4 : (floats + threads - 1) / threads;
  const int64_t chunks = (floats + chunk - 1) / chunk;
  std::vector<int64_t> order(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < chunks; ++i)
    order[i] = i;
  if (chunkBytes > 0)
    std::shuffle(order.begin(), order.end(), std::mt19937(5));
  volatile float sink = 0;
  auto run = [&] {
    std::vector<std::thread> workers;
    std::vector<float> sums(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        float total = 0;
        for (int64_t i = t; i < chunks; i += threads) {
          int64_t ahead = i + 4 * threads;
          if (prefetch && ahead < chunks) {
            const char *next = reinterpret_cast<const char *>(data.data() + order[ahead] * chunk);
            for (int64_t offset = 0; offset < chunk * 4; offset += 64)
              __builtin_prefetch(next + offset, 0, 2);
          }
          int64_t begin = order[i] * chunk;
          total += sumRange(data.data(), begin, std::min(floats, begin + chunk));
        }
        sums[t] = total;
      });
    for (std::thread &worker : workers)
      worker.join();
    for (float s : sums)
      sink = sink + s;
  };
  Measurement m = measure(reps, run);
  std::string name = chunkBytes > 0 ? fmt::format("read-chunks-{}k", chunkBytes / 1024)
                                    : std::string("read-contiguous");
  if (prefetch)
    name += "-prefetch";
  double gbps = static_cast<double>(bytes) / m.medianSeconds * 1e-9;
  double best = static_cast<double>(bytes) / m.minSeconds * 1e-9;
  fmt::print("{:<18} {:>9.2f} ms {:>8.1f} GB/s (best {:.1f}), cpu {:.2f} ms\n", name,
             m.medianSeconds * 1e3, gbps, best, m.medianCpuSeconds * 1e3);
  return {{"name", name},
          {"bytes", bytes},
          {"chunk_bytes", chunkBytes},
          {"software_prefetch", prefetch},
          {"threads", threads},
          {"median_ms", rounded(m.medianSeconds * 1e3, 4)},
          {"min_ms", rounded(m.minSeconds * 1e3, 4)},
          {"cpu_ms", rounded(m.medianCpuSeconds * 1e3, 4)},
          {"gb_per_s", rounded(gbps, 2)},
          {"best_gb_per_s", rounded(best, 2)}};
}

} // namespace

int main(int argc, char **argv) {
  const Case cases[] = {
      {"prefill-causal", 1, 8, 8, 2048, 2048, 64, 16, true, false},
      {"prefill-alibi", 1, 8, 8, 2048, 2048, 64, 16, false, true},
      {"decode", 16, 32, 8, 1, 4096, 128, 16, false, false},
      {"decode-causal", 16, 32, 8, 1, 4096, 128, 16, true, false},
      {"decode-dense", 16, 32, 8, 1, 4096, 128, 0, false, false},
      {"decode-mha", 16, 8, 8, 1, 4096, 128, 16, false, false},
      {"decode-mha-dense", 16, 8, 8, 1, 4096, 128, 0, false, false},
  };
  auto usage = [&](FILE *to) {
    fmt::print(to, "usage: {} [--reps N] [--naive-reps N] [--threads T] "
                   "[--variant auto|generic|avx2|avx512] [--only CASE] [--read-bandwidth] "
                   "[--json FILE] [--help]\n", argv[0]);
  };
  auto help = [&] {
    usage(stdout);
    fmt::print(
        "\nCPU paged attention, f32: each case runs pagedc's tiled kernel and, as the anchor,\n"
        "a naive one-thread loop with the same semantics; medians of the repetitions.\n"
        "\n"
        "  --reps N            repetitions of the tiled kernel (default 7)\n"
        "  --naive-reps N      repetitions of the naive loop (default 3)\n"
        "  --threads T         worker threads (default: one per core)\n"
        "  --variant NAME      kernel variant: auto (the widest supported), generic, avx2,\n"
        "                      avx512\n"
        "  --only CASE         run one case\n"
        "  --read-bandwidth    measure reading the decode's 537 MB of K/V instead: contiguous,\n"
        "                      in shuffled 8 KiB / 64 KiB chunks, and with software prefetch\n"
        "  --json FILE         also write the results to FILE\n"
        "  -h, --help          print this help and exit\n"
        "\ncases (page 0: dense K/V read in place):\n");
    for (const Case &c : cases)
      fmt::print("  {:<18} B {} x Hq {} x Hkv {} x q {} x kv {} x D {}, page {}{}{}\n", c.name,
                 c.batch, c.qHeads, c.kvHeads, c.qLength, c.kvLength, c.dim, c.pageSize,
                 c.causal ? ", causal" : "", c.alibi ? ", ALiBi" : "");
  };
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&] { return bench::optionValue(argc, argv, i); };
    auto count = [&](int least) { return bench::optionCount(argc, argv, i, least); };
    if (arg == "-h" || arg == "--help") {
      help();
      return 0;
    } else if (arg == "--reps") {
      options.reps = count(1);
    } else if (arg == "--naive-reps") {
      options.naiveReps = count(1);
    } else if (arg == "--threads") {
      options.threads = count(0);
    } else if (arg == "--read-bandwidth") {
      options.readBandwidth = true;
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
      fmt::print(stderr, "unknown option '{}'\n", arg);
      usage(stderr);
      return 2;
    }
  }
  if (!options.only.empty() &&
      std::none_of(std::begin(cases), std::end(cases),
                   [&](const Case &c) { return options.only == c.name; })) {
    fmt::print(stderr, "--only: no case '{}' (--help lists them)\n", options.only);
    return 2;
  }

  int threads = options.threads > 0 ? options.threads
                                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (options.readBandwidth) {
    // The bytes of K and V one decode step reads (B 16, Hkv 8, 4096 keys,
    // D 128, f32): 537 MB.
    const int64_t bytes = 2LL * 16 * 8 * 4096 * 128 * 4;
    fmt::print("read bandwidth, {} MB, {} threads, median of {}\n", bytes / 1000000, threads,
               options.reps);
    bench::Json rows = bench::Json::array();
    for (int64_t chunk : {int64_t(0), int64_t(8192), int64_t(65536)})
      rows.push_back(readBandwidth(bytes, chunk, false, threads, options.reps));
    rows.push_back(readBandwidth(bytes, 8192, true, threads, options.reps));
    if (!options.json.empty()) {
      try {
        bench::writeJson("--json", options.json,
                         {{"benchmark", "cpu_read_bandwidth"}, {"cases", rows}});
      } catch (const Error &error) {
        fmt::print(stderr, "{}\n", error.what());
        return 1;
      }
    }
    return 0;
  }
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
