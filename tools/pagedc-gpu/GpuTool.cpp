//===- GpuTool.cpp - pagedc-gpu: run a prepared pack on a GPU -------------===//
//
//   pagedc-gpu check PACK [--dry-run] [--json FILE] [--filter TEXT[,TEXT...]]
//                         [--device N] [--sms N]
//   pagedc-gpu bench PACK [--dry-run] [--json FILE] [--filter TEXT[,TEXT...]]
//                         [--device N] [--iters N] [--warmup N] [--copy-mib N]
//                         [--flush-mib N] [--no-queued] [--launch-times]
//   pagedc-gpu model PACK [--json FILE] [--filter TEXT[,TEXT...]]
//                         [--sample-blocks N] [--decode-sample-blocks N]
//                         [--prefill-sample-blocks N] [--max-kv-bytes N]
//   pagedc-gpu model --launches FILE [--device H100|A100] [--registers N]
//                         [--dram distinct|requested] [--json FILE]
//   pagedc-gpu model --explain [--json FILE]
//
// check runs every correctness case of the pack (inputs regenerated and
// verified against their checksum, K/V written through the paged cache's
// assign, outputs poisoned with NaN, the device-built block mask and the
// dense variant) and compares with the float64 references: ||out - ref|| /
// ||ref|| <= the case's tolerance (1e-2), no NaN, every element written, lse
// within 2x the tolerance and -inf exactly where the reference has it.
// bench times the performance.md section 4 configurations with CUDA events
// (warm-up, median) and measures the device-to-device copy bandwidth. Each
// configuration is timed twice: call by call, the host waiting for each
// (`median_ms`), and queued back to back, each call after a write of
// --flush-mib MiB that evicts L2 (`queued_median_ms`; --no-queued skips it).
// --launch-times also times each launch of a call of several apart (a
// decode's split kernel and its merge), queued the same way with an event
// between them (`launch_queued_median_ms`, in the order of `launches`).
// model runs the bench configurations of a pack built with --arch emu once on
// the SIMT emulator and turns its counters and the pack's ptxas figures into
// MODELLED H100 / A100 times (Model.h, docs/emulator.md); no GPU needed.
// model --launches models launches a script gathered (emulator counter
// lines, or a model JSON's launches with warp instruction counts) with the
// same formulas; model --explain prints them.
// --filter keeps the cases (configurations) whose name contains one of its
// comma-separated texts.
// --dry-run does everything up to the first launch without a driver.
// Exit status: 0 all passed (or planned), 1 a case failed, 2 usage or pack
// errors.
//
//===----------------------------------------------------------------------===//

#include "GpuCheck.h"
#include "Model.h"

#include "kernels/Json.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <iostream>

using namespace pagedc;
using namespace pagedc::gpu;
using json::Value;

namespace {

const char *kUsage =
    "usage: pagedc-gpu check PACK [--dry-run] [--json FILE] [--filter TEXT[,TEXT...]] "
    "[--device N] [--sms N]\n"
    "       pagedc-gpu bench PACK [--dry-run] [--json FILE] [--filter TEXT[,TEXT...]] "
    "[--device N] [--iters N] [--warmup N] [--copy-mib N] [--flush-mib 256] [--no-queued] "
    "[--launch-times]\n"
    "       pagedc-gpu model PACK [--json FILE] [--filter TEXT[,TEXT...]] [--sample-blocks N] "
    "[--decode-sample-blocks 32] [--prefill-sample-blocks 128] [--max-kv-bytes N]   (MODELLED "
    "on the emulator)\n"
    "       pagedc-gpu model --launches FILE [--device H100] [--registers 0] "
    "[--dram distinct|requested] [--json FILE]\n"
    "       pagedc-gpu model --explain [--json FILE]   (the model's formulas and constants)\n"
    "  --filter TEXT[,TEXT...]  only the cases whose name contains one of the texts\n"
    "  --launch-times  bench: also time each launch of a call of several (a decode's split\n"
    "      kernel and its merge) apart, queued with an event between them\n"
    "  --kernel-option NAME=VALUE  a kernel option of every call (repeatable, the last of a\n"
    "      name wins; check, bench, model; model keeps a CTA per prefill tile whatever\n"
    "      prefill_persistent says). Unset, each takes its $PAGEDC_* variable (NAME in\n"
    "      capitals after PAGEDC_), if set. NAME: prefill_shape, prefill_persistent,\n"
    "      prefill_persistent_ctas, prefill_tile_counter, prefill_tma, prefill_tma_runs,\n"
    "      prefill_pingpong, decode_split_factor, decode_splits, decode_merge_chunks,\n"
    "      decode_tma, decode_tma_runs, link_mods\n"
    "      (docs/kernels.md, \"Kernel options\").\n";

struct ToolOptions {
  std::string command, pack, jsonPath;
  RunOptions run;
  int copyMiB = 1024;
  ModelOptions model;
  LaunchesOptions launches;
  bool explain = false;
  /// Options only `model --launches` takes, for the error when they come
  /// without it.
  std::string launchesOnly;
  /// --kernel-option NAME=VALUE settings in command-line order.
  std::vector<std::string> kernelOptions;
};

/// The run's header: date, device, driver (or why there is none).
Value environment(const ToolOptions &options, const Pack &pack) {
  Value env = Value::object();
  env.set("date", utcNow());
  env.set("pack", options.pack);
  env.set("pack_created", pack.created);
  env.set("pack_arch", pack.arch);
  env.set("dry_run", options.run.dryRun);
  std::string reason;
  if (!options.run.dryRun && CudaDriver::available(&reason)) {
    const CudaDriver &driver = CudaDriver::get();
    const CudaDeviceInfo &info = cudaDeviceInfo(options.run.device);
    env.set("gpu", info.name);
    env.set("arch", info.arch());
    env.set("multiprocessors", info.multiprocessors);
    env.set("memory_bytes", Value(static_cast<int64_t>(info.totalMemoryBytes)));
    env.set("driver_version", driver.version());
  } else {
    env.set("gpu", "none");
    env.set("driver", options.run.dryRun ? "not used (dry run)" : reason);
    env.set("assumed_multiprocessors", options.run.multiprocessors);
  }
  return env;
}

void writeJson(const std::string &path, const Value &value) {
  if (path.empty())
    return;
  writeJsonFile(path, value, 2);
  std::cout << "wrote " << path << "\n";
}

Value launchesJson(const std::vector<std::string> &launches) {
  Value array = Value::array();
  for (const std::string &launch : launches)
    array.push(launch);
  return array;
}

int runCheck(const ToolOptions &options, const Pack &pack) {
  std::vector<CaseResult> results = checkPack(pack, options.run, std::cerr);
  Value root = environment(options, pack);
  Value cases = Value::array();
  int passed = 0, failed = 0, planned = 0;
  std::cout << fmt::format("{:<8} {:<11} {:>10} {:>9} {:>6}  {}\n", "status", "variant",
                           "rel.err", "lse.err", "nan", "case");
  for (const CaseResult &r : results) {
    passed += r.status == "pass";
    planned += r.status == "planned";
    failed += r.status == "fail" || r.status == "error";
    std::cout << fmt::format("{:<8} {:<11} {:>10.3g} {:>9.3g} {:>6}  {}{}\n", r.status, r.variant,
                             r.relativeError, r.lseMaxError, r.nonFinite, r.name,
                             r.message.empty() ? "" : "  -- " + r.message);
    if (options.run.dryRun)
      for (const std::string &launch : r.launches)
        std::cout << "           would launch " << launch << "\n";
    Value item = Value::object();
    item.set("name", r.name);
    item.set("variant", r.variant);
    item.set("kernel", r.kernel);
    item.set("status", r.status);
    item.set("relative_error", r.relativeError);
    item.set("lse_max_error", r.lseMaxError);
    item.set("non_finite", Value(r.nonFinite));
    item.set("elements", Value(r.elements));
    item.set("message", r.message);
    item.set("launches", launchesJson(r.launches));
    cases.push(std::move(item));
  }
  root.set("cases", std::move(cases));
  root.set("passed", passed);
  root.set("failed", failed);
  root.set("planned", planned);
  writeJson(options.jsonPath, root);
  std::cout << fmt::format("pagedc-gpu check: {} passed, {} failed, {} planned (dry run) of {}\n",
                           passed, failed, planned, results.size());
  if (results.empty()) {
    std::cout << "pagedc-gpu check: no case matched\n";
    return 1;
  }
  return failed ? 1 : 0;
}

int runBench(const ToolOptions &options, const Pack &pack) {
  Value root = environment(options, pack);
  double copy = 0;
  if (!options.run.dryRun) {
    copy = copyBandwidth(options.run.device, size_t(options.copyMiB) << 20, 20);
    root.set("copy_bandwidth_bytes_per_s", copy);
    std::cout << fmt::format("device-to-device copy ({} MiB): {:.1f} GB/s (read + write)\n",
                             options.copyMiB, copy * 1e-9);
  }
  std::vector<BenchResult> results = benchPack(pack, options.run, std::cerr);
  Value configs = Value::array();
  int errors = 0;
  std::cout << fmt::format("{:<44} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9}\n", "configuration",
                           "median ms", "GB/s", "of copy", "TFLOP/s", "queued ms", "of copy");
  for (const BenchResult &r : results) {
    errors += r.status == "error";
    const double seconds = r.medianMs * 1e-3;
    const double bandwidth = seconds > 0 ? r.bytes / seconds : 0;
    const double tflops = seconds > 0 ? r.flops / seconds * 1e-12 : 0;
    const double queuedBandwidth = r.queuedMedianMs > 0 ? r.bytes / (r.queuedMedianMs * 1e-3) : 0;
    std::cout << fmt::format("{:<44} {:>10.4f} {:>10.1f} {:>9.3f} {:>9.1f} {:>10.4f} {:>9.3f}{}\n",
                             r.name, r.medianMs, bandwidth * 1e-9,
                             copy > 0 ? bandwidth / copy : 0.0, tflops, r.queuedMedianMs,
                             copy > 0 ? queuedBandwidth / copy : 0.0,
                             r.status == "error" ? "  -- " + r.message : "");
    if (options.run.dryRun)
      for (const std::string &launch : r.launches)
        std::cout << "           would launch " << launch << "\n";
    Value item = Value::object();
    item.set("name", r.name);
    item.set("kind", r.kind);
    item.set("status", r.status);
    item.set("message", r.message);
    item.set("batch", r.batch);
    item.set("kv_len", r.kvLength);
    item.set("q_len", r.queryLength);
    item.set("page_size", r.pageSize);
    item.set("median_ms", r.medianMs);
    item.set("min_ms", r.minMs);
    item.set("max_ms", r.maxMs);
    // Queued back to back after an L2 flush (absent when not timed).
    if (r.queuedMedianMs > 0) {
      item.set("queued_median_ms", r.queuedMedianMs);
      item.set("queued_min_ms", r.queuedMinMs);
      item.set("queued_max_ms", r.queuedMaxMs);
    }
    if (!r.launchQueuedMedianMs.empty()) {
      Value times = Value::array();
      for (double ms : r.launchQueuedMedianMs)
        times.push(ms);
      item.set("launch_queued_median_ms", std::move(times));
    }
    item.set("bytes", r.bytes);
    item.set("flops", r.flops);
    item.set("bandwidth_bytes_per_s", bandwidth);
    item.set("fraction_of_copy", copy > 0 ? bandwidth / copy : 0.0);
    item.set("tflops", tflops);
    item.set("launches", launchesJson(r.launches));
    configs.push(std::move(item));
  }
  root.set("configurations", std::move(configs));
  writeJson(options.jsonPath, root);
  return errors ? 1 : 0;
}

int parseInt(const std::string &option, const std::string &text) {
  try {
    size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0)
      return value;
  } catch (const std::exception &) {
  }
  throw Error(option + " expects a non-negative integer, got '" + text + "'");
}

} // namespace

int main(int argc, char **argv) {
  ToolOptions options;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc)
          throw Error(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "-h" || arg == "--help") {
        std::cout << kUsage;
        return 0;
      } else if (arg == "--dry-run") {
        options.run.dryRun = true;
      } else if (arg == "--kernel-option") {
        options.kernelOptions.push_back(value());
      } else if (arg == "--json") {
        options.jsonPath = value();
      } else if (arg == "--filter") {
        options.run.filter = value();
      } else if (arg == "--device" && options.command == "model") {
        options.launches.device = value();
        options.launchesOnly = arg;
      } else if (arg == "--device") {
        options.run.device = parseInt(arg, value());
      } else if (arg == "--sms") {
        options.run.multiprocessors = parseInt(arg, value());
      } else if (arg == "--iters") {
        options.run.iterations = std::max(1, parseInt(arg, value()));
      } else if (arg == "--warmup") {
        options.run.warmup = parseInt(arg, value());
      } else if (arg == "--no-queued") {
        options.run.queued = false;
      } else if (arg == "--launch-times") {
        options.run.launchTimes = true;
      } else if (arg == "--flush-mib") {
        options.run.flushBytes = size_t(std::max(1, parseInt(arg, value()))) << 20;
      } else if (arg == "--copy-mib") {
        options.copyMiB = std::max(1, parseInt(arg, value()));
      } else if (arg == "--sample-blocks") {
        options.model.sampleBlocks = options.model.prefillSampleBlocks =
            parseInt(arg, value());
      } else if (arg == "--decode-sample-blocks") {
        options.model.sampleBlocks = parseInt(arg, value());
      } else if (arg == "--prefill-sample-blocks") {
        options.model.prefillSampleBlocks = parseInt(arg, value());
      } else if (arg == "--launches") {
        options.launches.path = value();
      } else if (arg == "--explain") {
        options.explain = true;
      } else if (arg == "--registers") {
        options.launches.registers = parseInt(arg, value());
        options.launchesOnly = arg;
      } else if (arg == "--dram") {
        options.launches.dram = value();
        options.launchesOnly = arg;
      } else if (arg == "--max-kv-bytes") {
        const std::string text = value();
        try {
          options.model.maxKvBytes = std::stod(text);
        } catch (const std::exception &) {
          throw Error("--max-kv-bytes expects a number, got '" + text + "'");
        }
      } else if (!arg.empty() && arg[0] == '-') {
        throw Error("unknown option '" + arg + "'");
      } else if (options.command.empty()) {
        options.command = arg;
      } else if (options.pack.empty()) {
        options.pack = arg;
      } else {
        throw Error("unexpected argument '" + arg + "'");
      }
    }
    if (options.command == "model" && (!options.launches.path.empty() || options.explain)) {
      if (!options.pack.empty() || (!options.launches.path.empty() && options.explain))
        throw Error("model takes one of PACK, --launches FILE and --explain");
      if (options.explain && !options.launchesOnly.empty())
        throw Error(options.launchesOnly + " is an option of model --launches");
      options.launches.jsonPath = options.jsonPath;
    } else if (!options.launchesOnly.empty() || options.explain || !options.launches.path.empty()) {
      throw Error("--launches, --explain, --registers, --dram and model's --device go with "
                  "`model --launches FILE` (or --explain)");
    } else if ((options.command != "check" && options.command != "bench" &&
                options.command != "model") ||
               options.pack.empty()) {
      throw Error("expected `check PACK`, `bench PACK` or `model PACK`");
    }
    if (options.command == "model" && options.run.dryRun)
      throw Error("model runs on the emulator; it has no --dry-run");
    // The $PAGEDC_* variables at the tool's edge (the runtime reads none),
    // then the flags over them.
    options.run.kernel = kernelOptionsFromEnvironment();
    for (const std::string &setting : options.kernelOptions) {
      try {
        setKernelOption(options.run.kernel, setting);
      } catch (const Error &error) {
        throw Error("--kernel-option: " + std::string(error.what()));
      }
    }
    checkKernelOptions(options.run.kernel);
    // A pack's kernels are bundles compiled when it was prepared: the
    // option would change nothing, so it is refused rather than run under
    // a label that says linked.
    if (options.run.kernel.linksMods())
      throw Error("kernel option link_mods: a pack's kernels are bundles, compiled when it was "
                  "prepared; prepare it with PAGEDC_LINK_MODS=1 for kernels that link their "
                  "mods");
    options.model.kernel = options.run.kernel;
  } catch (const Error &error) {
    std::cerr << "pagedc-gpu: error: " << error.what() << "\n" << kUsage;
    return 2;
  }
  try {
    if (options.explain)
      return explainModel(options.jsonPath, std::cout);
    if (!options.launches.path.empty())
      return runLaunches(options.launches, std::cout);
    const Pack pack = Pack::read(options.pack);
    if (options.command == "model") {
      options.model.filter = options.run.filter;
      options.model.jsonPath = options.jsonPath;
      prepareModelEnvironment(options.model);
    }
    if (!options.run.dryRun) {
      std::string reason;
      if (!CudaDriver::available(&reason)) {
        std::cerr << "pagedc-gpu: error: CUDA is not available: " << reason
                  << "\n(--dry-run does everything up to the first launch without a driver)\n";
        return 2;
      }
    }
    if (options.command == "model")
      return runModel(pack, options.model, std::cout, std::cerr);
    return options.command == "check" ? runCheck(options, pack) : runBench(options, pack);
  } catch (const std::exception &error) {
    std::cerr << "pagedc-gpu: error: " << error.what() << "\n";
    return 2;
  }
}
