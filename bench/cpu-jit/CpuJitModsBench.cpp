//===- CpuJitModsBench.cpp - JIT'd mods cost what hand-written ones do ----===//
//
// bench/README.md targets §3 with mods from the compiler: the same CPU paged
// attention shapes run once with hand-written C++ mods (the anchor, as in
// bench/cpu) and once with the same mods compiled from examples/mods.attn by
// the CPU JIT (causal; alibi = s + slopes[h] * (kv - q)). Measurements of the
// two alternate, so machine noise hits both alike; the table shows medians
// and the JIT/hand ratio. A second table times the row functions alone
// (ns per element over 4096-wide rows). Writes JSON with --json FILE.
//
//===----------------------------------------------------------------------===//

#include "AttentionCase.h"
#include "OptionValues.h"
#include "JIT/CompileSource.h"

#include "cpu/CpuAttention.h"
#include "cpu/Reference.h"
#include "pagedc/BlockMask.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace pagedc;

namespace {

//===- Hand-written mods (the anchor) -------------------------------------===//

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q,
               int32_t kv, int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kv + i;
}
int32_t causalClass(const PagedcModContext *, int32_t, int32_t, int32_t qLow,
                    int32_t qHigh, int32_t kvLow, int32_t kvHigh) {
  return qHigh < kvLow ? 0 : (qLow >= kvHigh ? 2 : 1);
}
void alibiRow(const PagedcModContext *ctx, int32_t, int32_t h, int32_t q,
              int32_t kv, int32_t count, float *scores) {
  float slope = static_cast<const float *>(ctx->buffers[0].data)[h];
  for (int32_t i = 0; i < count; ++i)
    scores[i] += slope * static_cast<float>(kv + i - q);
}

CompiledMods handWritten(bool causal, bool alibi) {
  CompiledMods mods;
  if (causal) {
    mods.maskName = "causal";
    mods.maskRow = causalRow;
    mods.maskBlockClass = causalClass;
    mods.maskDependence.b = mods.maskDependence.h = false;
    mods.maskDependence.diagonal = true;
  }
  if (alibi) {
    mods.scoreName = "alibi";
    mods.scoreRow = alibiRow;
    mods.buffers.push_back({"slopes", DType::F32, {}});
  }
  return mods;
}

CompiledMods compiled(bool causal, bool alibi) {
  auto mods = jit::compileModsFromFile(
      std::string(PAGEDC_BENCH_EXAMPLES_DIR) + "/mods.attn",
      causal ? "causal" : "", alibi ? "alibi" : "", {}, llvm::errs());
  if (!mods) {
    fmt::print(stderr, "compile failed: {}\n", llvm::toString(mods.takeError()));
    std::exit(1);
  }
  return *mods;
}

//===- Timing -------------------------------------------------------------===//

double seconds(const std::function<void()> &run) {
  auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// Alternates the two runs `reps` times after one warm-up each; returns the
/// medians (hand, jit).
std::pair<double, double> alternate(int reps, const std::function<void()> &hand,
                                    const std::function<void()> &jit) {
  hand();
  jit();
  std::vector<double> handTimes, jitTimes;
  for (int r = 0; r < reps; ++r) {
    handTimes.push_back(seconds(hand));
    jitTimes.push_back(seconds(jit));
  }
  return {median(handTimes), median(jitTimes)};
}

using Case = bench::AttentionCase;

struct Options {
  int reps = 5;
  int threads = 0;
  bool quick = false; ///< shorter sequences (S = 512, context 1024)
  std::string json;
};

bench::Json runCase(const Case &c, const Options &options) {
  auto [q, k, v] = bench::randomInputs(c);
  std::vector<int32_t> kvLength(c.batch, static_cast<int32_t>(c.kvLength));
  std::vector<int32_t> qOffset(c.batch,
                               static_cast<int32_t>(c.kvLength - c.qLength));
  cpu::PagedCache cache = cpu::buildPagedCache(
      k.view(), v.view(), kvLength.data(), c.pageSize, DType::F32, 7, 0);
  std::vector<float> slopes(c.qHeads);
  for (int64_t h = 0; h < c.qHeads; ++h)
    slopes[h] = std::exp2(-8.0f * float(h + 1) / float(c.qHeads));
  PagedcBufferRef slopesRef{slopes.data(), {c.qHeads, 0, 0, 0}, {1, 0, 0, 0}};
  PagedcModContext context{&slopesRef, nullptr};

  CompiledMods hand = handWritten(c.causal, c.alibi);
  CompiledMods jitMods = compiled(c.causal, c.alibi);
  // One block mask for both (built with the JIT's classifier).
  BlockMask blockMask;
  if (c.causal)
    blockMask = createBlockMask(jitMods, context, 1, 1, c.kvLength, c.kvLength);

  HostTensor outHand(DType::F32, {c.batch, c.qHeads, c.qLength, c.dim});
  HostTensor outJit(DType::F32, {c.batch, c.qHeads, c.qLength, c.dim});
  auto args = [&](const CompiledMods &mods, HostTensor &out) {
    cpu::PagedAttentionArgs a;
    a.q = q.view();
    a.kCache = cache.kCache.view();
    a.vCache = cache.vCache.view();
    a.pageTable = cache.pageTable.data();
    a.pageTableStride = cache.pageTableStride;
    a.pageSize = cache.pageSize;
    a.kvLength = kvLength.data();
    a.qOffset = qOffset.data();
    a.blockMask = c.causal ? &blockMask : nullptr;
    a.mods = &mods;
    a.context = &context;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
    a.out = out.view();
    a.threads = options.threads;
    return a;
  };
  cpu::PagedAttentionArgs handArgs = args(hand, outHand);
  cpu::PagedAttentionArgs jitArgs = args(jitMods, outJit);
  auto [handSeconds, jitSeconds] =
      alternate(options.reps, [&] { cpu::pagedAttention(handArgs); },
                [&] { cpu::pagedAttention(jitArgs); });
  double maxDifference = 0;
  for (int64_t i = 0; i < outHand.numel(); ++i)
    maxDifference = std::max<double>(
        maxDifference, std::abs(outHand.dataAs<float>()[i] - outJit.dataAs<float>()[i]));
  double tokens = static_cast<double>(c.batch * c.qLength);
  fmt::print("{:<16} {:>10.2f} {:>10.2f} {:>7.3f} {:>12.0f} {:>12.0f}  {:.1e}\n",
             c.name, handSeconds * 1e3, jitSeconds * 1e3,
             jitSeconds / handSeconds, tokens / handSeconds,
             tokens / jitSeconds, maxDifference);
  using bench::rounded;
  bench::Json row = bench::caseJson(c);
  row.update(bench::Json{{"hand_median_ms", rounded(handSeconds * 1e3, 4)},
                          {"jit_median_ms", rounded(jitSeconds * 1e3, 4)},
                          {"jit_over_hand", rounded(jitSeconds / handSeconds, 4)},
                          {"max_abs_diff", bench::significant(maxDifference, 3)}});
  return row;
}

/// ns per element of the row functions alone.
bench::Json runRowFunctions(const Options &options) {
  constexpr int32_t kWidth = 4096, kRows = 2048;
  std::vector<float> slopes(32, 0.25f);
  PagedcBufferRef slopesRef{slopes.data(), {32, 0, 0, 0}, {1, 0, 0, 0}};
  PagedcModContext context{&slopesRef, nullptr};
  CompiledMods hand = handWritten(true, true);
  CompiledMods jitMods = compiled(true, true);
  std::vector<uint8_t> mask(kWidth);
  std::vector<float> scores(kWidth, 0.5f);
  auto maskRows = [&](PagedcMaskRowFn fn) {
    return [&, fn] {
      for (int32_t r = 0; r < kRows; ++r)
        fn(&context, 0, r % 32, r, 0, kWidth, mask.data());
    };
  };
  auto scoreRows = [&](PagedcScoreRowFn fn) {
    return [&, fn] {
      for (int32_t r = 0; r < kRows; ++r)
        fn(&context, 0, r % 32, r, 0, kWidth, scores.data());
    };
  };
  double elements = double(kWidth) * kRows;
  auto [maskHand, maskJit] = alternate(options.reps * 3, maskRows(hand.maskRow),
                                       maskRows(jitMods.maskRow));
  auto [scoreHand, scoreJit] = alternate(
      options.reps * 3, scoreRows(hand.scoreRow), scoreRows(jitMods.scoreRow));
  fmt::print("\nrow functions alone ({} rows x {} kv), ns per element\n", kRows,
             kWidth);
  fmt::print("{:<16} {:>10} {:>10} {:>7}\n", "mod", "hand", "jit", "ratio");
  fmt::print("{:<16} {:>10.3f} {:>10.3f} {:>7.3f}\n", "causal mask",
             maskHand / elements * 1e9, maskJit / elements * 1e9,
             maskJit / maskHand);
  fmt::print("{:<16} {:>10.3f} {:>10.3f} {:>7.3f}\n", "alibi score",
             scoreHand / elements * 1e9, scoreJit / elements * 1e9,
             scoreJit / scoreHand);
  using bench::rounded;
  return {{"causal_hand", rounded(maskHand / elements * 1e9, 4)},
          {"causal_jit", rounded(maskJit / elements * 1e9, 4)},
          {"alibi_hand", rounded(scoreHand / elements * 1e9, 4)},
          {"alibi_jit", rounded(scoreJit / elements * 1e9, 4)}};
}

} // namespace

int main(int argc, char **argv) {
  auto usage = [&](FILE *to) {
    fmt::print(to, "usage: {} [--reps N] [--threads T] [--quick] [--json FILE] [--help]\n",
               argv[0]);
  };
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&] { return bench::optionValue(argc, argv, i); };
    auto count = [&](int least) { return bench::optionCount(argc, argv, i, least); };
    if (arg == "-h" || arg == "--help") {
      usage(stdout);
      fmt::print(
          "\nCPU paged attention, f32, with hand-written mods (the anchor) and the same mods\n"
          "compiled from examples/mods.attn by the CPU JIT, alternating; medians and the\n"
          "JIT/hand ratio, then the row functions alone (ns per element).\n"
          "Cases: prefill-causal and prefill-alibi (B 1 x H 8 x S 2048 x D 64), decode-causal\n"
          "and decode-alibi (B 16 x Hq 32 x Hkv 8 x kv 4096 x D 128, pages of 16).\n"
          "\n"
          "  --reps N       repetitions of each (default {})\n"
          "  --threads T    worker threads (default: one per core)\n"
          "  --quick        S 512 and kv 1024 instead\n"
          "  --json FILE    also write the results to FILE\n"
          "  -h, --help     print this help and exit\n",
          Options{}.reps);
      return 0;
    } else if (arg == "--reps")
      options.reps = count(1);
    else if (arg == "--threads")
      options.threads = count(0);
    else if (arg == "--quick")
      options.quick = true;
    else if (arg == "--json")
      options.json = value();
    else {
      fmt::print(stderr, "unknown option '{}'\n", arg);
      usage(stderr);
      return 2;
    }
  }
  int64_t prefill = options.quick ? 512 : 2048;
  int64_t context = options.quick ? 1024 : 4096;
  const Case cases[] = {
      {"prefill-causal", 1, 8, 8, prefill, prefill, 64, 16, true, false},
      {"prefill-alibi", 1, 8, 8, prefill, prefill, 64, 16, false, true},
      {"decode-causal", 16, 32, 8, 1, context, 128, 16, true, false},
      {"decode-alibi", 16, 32, 8, 1, context, 128, 16, false, true},
  };
  int threads = options.threads > 0
                    ? options.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  fmt::print("CPU paged attention, f32, {} threads: hand-written mods vs the "
             "same mods JIT-compiled from examples/mods.attn (median of {}, "
             "alternating)\n",
             threads, options.reps);
  fmt::print("{:<16} {:>10} {:>10} {:>7} {:>12} {:>12}  {}\n", "case",
             "hand ms", "jit ms", "ratio", "hand tok/s", "jit tok/s",
             "max|diff|");
  bench::Json entries = bench::Json::array();
  for (const Case &c : cases)
    entries.push_back(runCase(c, options));
  bench::Json rows = runRowFunctions(options);
  if (!options.json.empty()) {
    try {
      bench::writeJson("--json", options.json,
                       {{"benchmark", "cpu_jit_mods_vs_hand_written"},
                        {"threads", threads},
                        {"reps", options.reps},
                        {"quick", options.quick},
                        {"cases", entries},
                        {"row_functions_ns_per_element", rows}});
    } catch (const Error &error) {
      fmt::print(stderr, "{}\n", error.what());
      return 1;
    }
  }
  return 0;
}
