//===- GpuCheck.h - Running a pack on a GPU (or planning it) ---*- C++ -*-===//
//
// The work of `pagedc-gpu check` and `pagedc-gpu bench`, as a library so the
// unit tests run the same code. Runtime only: no LLVM, no CUDA headers.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TOOLS_PAGEDC_GPU_GPUCHECK_H
#define PAGEDC_TOOLS_PAGEDC_GPU_GPUCHECK_H

#include "Pack.h"

#include "pagedc/KernelOptions.h"

#include <iosfwd>
#include <string>
#include <vector>

namespace pagedc::gpu {

/// Checks that `image` is a cubin for `arch`: a 64-bit little-endian ELF of
/// machine EM_CUDA (190) whose flags name the architecture, with a symbol
/// for each of `kernels`. Returns "" or what is wrong.
std::string validateCubin(const std::string &image, const std::string &arch,
                          const std::vector<std::string> &kernels);

struct RunOptions {
  /// Do everything up to the first launch (no driver needed): read and
  /// verify bundles, validate cubins, regenerate inputs against their
  /// checksums, read references, choose kernels, plan launches and pack
  /// arguments against simulated device addresses.
  bool dryRun = false;
  int device = 0;
  /// Multiprocessors assumed by a dry run's decode split choice (H100: 132).
  int multiprocessors = 132;
  /// Only cases whose name contains one of these comma-separated texts
  /// (nameMatches).
  std::string filter;
  /// Benchmark: timed launches per configuration (median reported) and
  /// warm-up launches.
  int iterations = 20, warmup = 5;
  /// Benchmark: also time `iterations` calls queued back to back, each
  /// after an L2 flush (BenchResult::queuedMedianMs); the model turns it off.
  bool queued = true;
  /// Bytes written by each queued call's L2 flush (larger than any L2).
  size_t flushBytes = size_t(256) << 20;
  /// Benchmark: also time each launch of a call of several apart, queued
  /// after the flush with an event between launches
  /// (BenchResult::launchQueuedMedianMs).
  bool launchTimes = false;
  /// Benchmark, for the model only: when > 0 and below the batch, the
  /// cache holds this many sequences' pages and sequence s reads those of
  /// s mod kvSequences (same launches and page-table walk, less memory).
  int kvSequences = 0;
  /// The kernel options of every call, dry run included (the tool maps the
  /// $PAGEDC_* variables and its --kernel-option flags onto them).
  KernelOptions kernel;
};

/// The outcome of one case in one variant (block mask built on the device,
/// or dense).
struct CaseResult {
  std::string name, variant, kernel;
  /// "pass", "fail", "planned" (dry run) or "error".
  std::string status;
  double relativeError = 0, lseMaxError = 0;
  int64_t nonFinite = 0, elements = 0;
  std::string message;
  /// The launches (kernel, grid, block, shared memory, argument bytes).
  std::vector<std::string> launches;
};

/// Runs (or plans) every case of `pack`; prints progress to `log`.
std::vector<CaseResult> checkPack(const Pack &pack, const RunOptions &options,
                                  std::ostream &log);

/// The outcome of one benchmark configuration.
struct BenchResult {
  std::string name, kind, status, message;
  int batch = 0, kvLength = 0, queryLength = 0, pageSize = 0;
  /// Each call timed alone: events around one enqueue, the host waits for
  /// the call before the next (the GPU idles while the launch is submitted,
  /// and the call finds in L2 what the previous one left).
  double medianMs = 0, minMs = 0, maxMs = 0;
  /// Calls queued back to back, each after a write of flushBytes that
  /// evicts L2, events around the call alone: the launch latency is hidden
  /// behind the flush and K/V come from DRAM (0 when not timed).
  double queuedMedianMs = 0, queuedMinMs = 0, queuedMaxMs = 0;
  /// With RunOptions::launchTimes: each launch's median time, in the
  /// order of `launches`, from calls queued as above with an event between
  /// consecutive launches. The event ends a programmatic dependent launch's
  /// overlap with the launch before it, so the sum may exceed the queued
  /// median; the split says which launch holds the time.
  std::vector<double> launchQueuedMedianMs;
  /// Decode: bytes of K, V (kept pages of every sequence), Q and O.
  double bytes = 0;
  /// Prefill: FLOPs of unmasked work (4 * B * Hq * Lq * Lkv * D * kept).
  double flops = 0;
  std::vector<std::string> launches;
};

/// Whether `name` contains one of `filter`'s comma-separated texts (an
/// empty filter, or an empty text in it, matches every name).
bool nameMatches(const std::string &name, const std::string &filter);

/// Device-to-device copy bandwidth (bytes read + written per second) of a
/// `bytes` buffer, median of `iterations` copies.
double copyBandwidth(int device, size_t bytes, int iterations);

/// Runs (or plans) the benchmark configurations of `pack`.
std::vector<BenchResult> benchPack(const Pack &pack, const RunOptions &options,
                                   std::ostream &log);

} // namespace pagedc::gpu

#endif // PAGEDC_TOOLS_PAGEDC_GPU_GPUCHECK_H
