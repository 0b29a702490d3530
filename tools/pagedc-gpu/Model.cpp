//===- Model.cpp - pagedc-gpu model: MODELLED GPU time from emulator counts ===//
//
// The formulas and assumptions are those of docs/emulator.md, "The
// performance model"; keep the two in step.
//
//===----------------------------------------------------------------------===//

#include "Model.h"

#include "GpuCheck.h"

#include "kernels/Json.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <unistd.h>

namespace pagedc::gpu {

using json::Value;

namespace {

const char *kLabel = "MODELLED, not measured: emulator counters + ptxas figures + roofline "
                     "(docs/emulator.md, 'The performance model'); no GPU ran these kernels";

/// A device's public figures and the model's assumptions about it.
struct DeviceModel {
  const char *name, *arch, *note;
  double peakFlops;       ///< dense bf16 tensor FLOP/s
  double mmaSyncFraction; ///< of the peak that mma.sync can reach (assumption)
  double wgmmaFraction;   ///< of the peak that wgmma can reach (0: no wgmma)
  double hbm;             ///< bytes/s
  double l2;              ///< bytes/s (assumption)
  double clock;           ///< Hz: the clock the peak is quoted at
  int sms, sharedPerSm, sharedPerBlock, registersPerSm, threadsPerSm, ctasPerSm;
};

const DeviceModel kDevices[] = {
    {"H100", "sm_90",
     "H100 SXM5 80GB: 989.4 TFLOP/s dense bf16 = 132 SMs x 4096 FLOP/clk x 1.83 GHz; HBM3 3.35 "
     "TB/s; 228 KiB shared/SM (227 KiB per block); mma.sync assumed to reach 0.66 of the peak, "
     "wgmma the peak",
     989.4e12, 0.66, 1.0, 3.35e12, 7.0e12, 1.83e9, 132, 228 * 1024, 227 * 1024, 65536, 2048, 32},
    {"A100", "sm_80",
     "A100 SXM4 80GB: 312 TFLOP/s dense bf16 = 108 SMs x 2048 FLOP/clk x 1.41 GHz; HBM2e 2.039 "
     "TB/s (the 40GB part has 1.555); 164 KiB shared/SM (163 KiB per block)",
     312.0e12, 1.0, 0.0, 2.039e12, 5.0e12, 1.41e9, 108, 164 * 1024, 163 * 1024, 65536, 2048, 32},
};

constexpr double kLaunchOverheadSeconds = 3e-6; ///< per launch, back to back
/// A programmatic dependent launch (the decode merge on sm_90) is scheduled
/// while the previous grid drains and waits in-kernel: its CTAs are
/// resident when that grid ends, so only the completion signal separates
/// the two (assumed 1 us; no GPU has measured it here).
constexpr double kDependentLaunchGapSeconds = 1e-6;
constexpr double kSharedBytesPerClock = 128;    ///< per SM: one wavefront
constexpr double kMufuPerClock = 16;            ///< per SM
constexpr double kSectorBytes = 32;
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16; ///< m16n8k16
constexpr int kReservedSharedPerCta = 1024;

/// One emulator launch (a line of PAGEDC_EMU_COUNTERS).
struct Launch {
  std::string kernel;
  int64_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  int64_t dynamicShared = 0;
  bool programmatic = false; ///< launched as a programmatic dependent
  Value counters;
  double count(const char *name) const { return counters.at(name).asDouble(name); }
  /// Grid blocks over blocks run.
  double scale() const {
    return count("grid_blocks") / std::max(1.0, count("blocks"));
  }
  int64_t threads() const { return block[0] * block[1] * block[2]; }
  bool attention() const { return kernel == "pagedc_prefill" || kernel == "pagedc_decode"; }
  /// The block-mask builder is built once before `pagedc-gpu bench` times
  /// the call, so it is reported apart.
  bool partOfCall() const { return kernel.find("block_mask") == std::string::npos; }
};

std::vector<Launch> readCounters(const std::string &path) {
  std::ifstream in(path);
  std::vector<Launch> launches;
  for (std::string line; std::getline(in, line);) {
    if (line.empty())
      continue;
    Value value = Value::parse(line);
    Launch launch;
    launch.kernel = value.at("kernel").asString("kernel");
    for (int i = 0; i < 3; ++i) {
      launch.grid[i] = value.at("grid").asArray("grid").at(i).asInt("grid");
      launch.block[i] = value.at("block").asArray("block").at(i).asInt("block");
    }
    launch.dynamicShared = value.at("dynamic_shared_bytes").asInt("dynamic_shared_bytes");
    if (const Value *flag = value.find("programmatic_dependent"))
      launch.programmatic = flag->asBool("programmatic_dependent");
    launch.counters = value.at("counters");
    launches.push_back(std::move(launch));
  }
  return launches;
}

struct Occupancy {
  int ctas = 0;
  std::string limit; ///< which resource bounds it
};

Occupancy occupancy(const DeviceModel &device, int registers, int64_t threads, int64_t shared) {
  Occupancy result{device.ctasPerSm, "ctas"};
  auto consider = [&](int64_t ctas, const char *what) {
    if (ctas < result.ctas) {
      result.ctas = static_cast<int>(std::max<int64_t>(ctas, 0));
      result.limit = what;
    }
  };
  const int64_t warps = (threads + 31) / 32;
  consider(device.threadsPerSm / std::max<int64_t>(threads, 1), "threads");
  if (registers > 0) {
    // Registers per thread in units of 8, a warp's allocation in units of
    // 256 registers.
    const int64_t perThread = (registers + 7) / 8 * 8;
    const int64_t perWarp = (perThread * 32 + 255) / 256 * 256;
    consider((device.registersPerSm / perWarp) / std::max<int64_t>(warps, 1), "registers");
  }
  if (shared > device.sharedPerBlock)
    consider(0, "shared memory (over the per-block limit)");
  else
    consider(device.sharedPerSm / (shared + kReservedSharedPerCta), "shared memory");
  return result;
}

struct PtxasFigures {
  int registers = 0, stack = 0, spillStore = 0, spillLoad = 0;
  bool known = false;
};

PtxasFigures ptxasFor(const BenchCase &b, const std::string &arch, const std::string &kernel) {
  PtxasFigures figures;
  for (const BenchPtxas &r : b.ptxas)
    if (r.arch == arch && r.kernel == kernel) {
      figures.registers = r.registers;
      figures.stack = r.stackBytes;
      figures.spillStore = r.spillStoreBytes;
      figures.spillLoad = r.spillLoadBytes;
      figures.known = true;
    }
  return figures;
}

double round3(double value) { return std::round(value * 1e3) / 1e3; }
double round4(double value) { return std::round(value * 1e4) / 1e4; }

struct LaunchModel {
  Value json;
  double seconds = 0;
  std::string bound;
  double uniqueBytesScaled = 0;
};

/// The roofline of one launch on one device.
LaunchModel modelLaunch(const DeviceModel &device, const BenchCase &b, const Launch &launch,
                        double mustMoveBytes) {
  const double scale = launch.scale();
  const PtxasFigures ptxas = ptxasFor(b, device.arch, launch.kernel);
  const Occupancy occ = occupancy(device, ptxas.registers, launch.threads(), launch.dynamicShared);
  if (occ.ctas == 0)
    throw Error(fmt::format("{} does not fit on an {} SM ({})", launch.kernel, device.name,
                            occ.limit));
  const double grid = launch.count("grid_blocks");
  const double slots = double(device.sms) * occ.ctas;
  const double waves = std::ceil(grid / slots);
  const double efficiency = grid / (waves * slots);

  const double uniqueBytes = launch.count("global_sectors_unique") * kSectorBytes;
  // Decode, merge and builder CTAs touch disjoint data: the sample's
  // distinct sectors scale. Prefill CTAs of one (batch, kv head) re-read
  // the same K/V, assumed caught by L2: DRAM moves what the call must move.
  double dramBytes = uniqueBytes * scale;
  if (launch.kernel == "pagedc_prefill")
    dramBytes = std::max(mustMoveBytes, uniqueBytes);
  const double wgmmaFlops = launch.count("wgmma_flop");
  if (wgmmaFlops > 0 && device.wgmmaFraction == 0)
    throw Error(fmt::format("{} uses wgmma (sm_90a), which an {} does not have", launch.kernel,
                            device.name));
  // Bulk (tensor-map) copies write shared memory and read through L2 as
  // cp.async does; the emulator counts their bytes apart from the
  // requested sectors.
  const double bulkBytes = launch.count("bulk_copy_bytes");
  const double wavefronts =
      launch.count("ldmatrix_wavefronts") + launch.count("shared_wavefronts") +
      (launch.count("cp_async_bytes") + launch.count("cp_async_zero_fill_bytes") +
       bulkBytes + launch.count("wgmma_shared_bytes")) /
          kSharedBytesPerClock;
  const std::pair<const char *, double> terms[] = {
      {"tensor", launch.count("mma") * scale * kFlopsPerMma /
                         (device.peakFlops * device.mmaSyncFraction) +
                     (wgmmaFlops > 0
                          ? wgmmaFlops * scale / (device.peakFlops * device.wgmmaFraction)
                          : 0.0)},
      {"shared", wavefronts * scale / (device.sms * device.clock)},
      {"dram", dramBytes / device.hbm},
      {"l2", (launch.count("global_sectors_requested") * kSectorBytes + bulkBytes) * scale /
                 device.l2},
      {"mufu", launch.count("transcendentals") * scale /
                   (device.sms * kMufuPerClock * device.clock)},
  };
  LaunchModel result;
  double longest = -1;
  Value termsJson = Value::object();
  for (const auto &[name, seconds] : terms) {
    termsJson.set(name, round3(seconds * 1e6));
    if (seconds > longest) {
      longest = seconds;
      result.bound = name;
    }
  }
  // Programmatic dependent launch is sm_90's: an A100 launches the grid
  // after the previous one ends, as a plain launch.
  const bool dependent = launch.programmatic && std::string(device.arch) == "sm_90";
  result.seconds = longest / efficiency +
                   (dependent ? kDependentLaunchGapSeconds : kLaunchOverheadSeconds);
  result.uniqueBytesScaled = uniqueBytes * scale;
  Value j = Value::object();
  j.set("kernel", launch.kernel);
  j.set("part_of_call", launch.partOfCall());
  j.set("grid_blocks", static_cast<int64_t>(grid));
  j.set("blocks_run", static_cast<int64_t>(launch.count("blocks")));
  j.set("registers", ptxas.registers);
  j.set("ctas_per_sm", occ.ctas);
  j.set("occupancy_limit", occ.limit);
  j.set("waves", static_cast<int64_t>(waves));
  j.set("wave_efficiency", round4(efficiency));
  j.set("bound", result.bound);
  j.set("terms_us", std::move(termsJson));
  j.set("dram_bytes", dramBytes);
  j.set("programmatic_dependent", dependent);
  j.set("modelled_us", round3(result.seconds * 1e6));
  result.json = std::move(j);
  return result;
}

void setSampling(int blocks) {
  if (blocks > 0)
    ::setenv("PAGEDC_EMU_SAMPLE_BLOCKS", std::to_string(blocks).c_str(), 1);
  else
    ::unsetenv("PAGEDC_EMU_SAMPLE_BLOCKS");
}

std::string tempPath() {
  const char *dir = std::getenv("TMPDIR");
  return fmt::format("{}/pagedc-model-{}-counters.jsonl", dir && *dir ? dir : "/tmp", getpid());
}

std::string figureText(const Value &entry) {
  if (const Value *f = entry.find("modelled_bandwidth_fraction"))
    return fmt::format("{:.3f} of HBM", f->asDouble("fraction"));
  if (const Value *f = entry.find("modelled_tflops"))
    return fmt::format("{:.0f} TFLOP/s", f->asDouble("tflops"));
  return "error";
}

} // namespace

void prepareModelEnvironment(const ModelOptions &options) {
  ::setenv("PAGEDC_CUDA_DRIVER", "emu", 1);
  ::setenv("PAGEDC_EMU_CHECKS", "none", 1);
  ::setenv("PAGEDC_EMU_QUIET", "1", 1);
  // The builder's output is read by the next launch: it runs whole; the
  // merge is small and runs whole too. PAGEDC_EMU_SAMPLE_BLOCKS is read at
  // each launch and set per configuration (setSampling).
  ::setenv("PAGEDC_EMU_SAMPLE_KERNELS", "pagedc_prefill,pagedc_decode", 1);
  ::unsetenv("PAGEDC_EMU_SAMPLE_BLOCKS");
  ::unsetenv("PAGEDC_EMU_COUNTERS");
  (void)options;
}

int runModel(const Pack &pack, const ModelOptions &options, std::ostream &out,
             std::ostream &log) {
  if (pack.arch != "emu")
    throw Error("the pack is for " + pack.arch +
                "; `pagedc-gpu model` runs a pack built with --arch emu");
  const auto started = std::chrono::steady_clock::now();
  const std::string countersPath = tempPath();
  Value configurations = Value::array();
  int failures = 0, modelled = 0;
  bool missingPtxas = false;

  out << "MODELLED, not measured (no GPU ran these kernels): emulator counts + ptxas + "
         "roofline, docs/emulator.md\n";
  out << fmt::format("{:<48} {:>10} {:<16} {:<7} {:>10} {:<16} {:<7}\n", "configuration",
                     "H100 us", "H100 figure", "bound", "A100 us", "A100 figure", "bound");
  for (const BenchCase &b : pack.bench) {
    if (!options.filter.empty() && b.name.find(options.filter) == std::string::npos)
      continue;
    Value row = Value::object();
    row.set("name", b.name);
    row.set("kind", kindName(b.kind));
    row.set("mask", b.mask);
    row.set("score", b.score);
    row.set("batch", b.batch);
    row.set("heads_q", b.headsQ);
    row.set("heads_kv", b.headsKv);
    row.set("head_dim", b.headDim);
    row.set("kv_len", b.kvLength);
    row.set("q_len", b.queryLength);
    row.set("page_size", b.pageSize);
    row.set("kept_fraction", b.keptFraction);
    const double elementBytes = 2; // bf16
    const double mustMove =
        elementBytes * (2.0 * b.batch * b.headsKv * b.kvLength * b.keptFraction * b.headDim +
                        2.0 * b.batch * b.headsQ * b.queryLength * b.headDim);
    const double flops = 4.0 * b.batch * b.headsQ * double(b.queryLength) * b.kvLength *
                         b.headDim * b.keptFraction;
    row.set("must_move_bytes", mustMove);
    row.set("unmasked_flops", flops);

    RunOptions run;
    // One CTA per query tile: sampled blocks stand for their share of the
    // grid only then (a persistent CTA's tiles depend on the others'). What
    // persistent CTAs save, a CTA's start and end, is the calibration's
    // per-tile cost (bench/gpu/issue_model.py calibrate).
    run.kernel = options.kernel;
    run.kernel.prefillPersistent = false;
    run.kernel.prefillPersistentCtas.reset();
    run.kernel.prefillTileCounter.reset();
    run.iterations = 1;
    run.warmup = 0;
    run.queued = false;
    const double pagesBytes = 2.0 * b.headsKv * b.headDim * elementBytes * b.pageSize *
                              ((b.kvLength + b.pageSize - 1) / b.pageSize + 1);
    if (pagesBytes * b.batch > options.maxKvBytes)
      run.kvSequences = std::max(1, static_cast<int>(options.maxKvBytes / pagesBytes));
    row.set("kv_sequences_stored", run.kvSequences ? run.kvSequences : b.batch);

    Pack single = pack;
    single.cases.clear();
    single.bench = {b};
    const int sample =
        b.kind == KernelKind::Prefill ? options.prefillSampleBlocks : options.sampleBlocks;
    row.set("sample_blocks", sample);
    setSampling(sample);
    // The runtime plans decode splits for the occupancy the (emulated)
    // driver reports: give it the H100 registers of this configuration's
    // kernels, so that the plan is the one an H100 would get.
    std::string registers;
    for (const BenchPtxas &r : b.ptxas)
      if (r.arch == kDevices[0].arch && r.registers > 0)
        registers += fmt::format("{}{}={}", registers.empty() ? "" : ",", r.kernel, r.registers);
    if (registers.empty())
      ::unsetenv("PAGEDC_EMU_REGISTERS");
    else
      ::setenv("PAGEDC_EMU_REGISTERS", registers.c_str(), 1);
    row.set("emulated_registers", registers);
    std::remove(countersPath.c_str());
    ::setenv("PAGEDC_EMU_COUNTERS", countersPath.c_str(), 1);
    const auto t0 = std::chrono::steady_clock::now();
    std::ostringstream benchLog;
    std::vector<BenchResult> results = benchPack(single, run, benchLog);
    ::unsetenv("PAGEDC_EMU_COUNTERS");
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    row.set("emulator_seconds", round3(wall));
    std::vector<Launch> launches;
    std::string error;
    if (results.size() != 1 || results[0].status != "ok")
      error = results.empty() ? "not run" : results[0].message;
    else
      launches = readCounters(countersPath);
    std::remove(countersPath.c_str());
    if (error.empty() && launches.empty())
      error = "the emulator wrote no counters";
    if (!error.empty()) {
      ++failures;
      row.set("status", "error");
      row.set("message", error);
      out << fmt::format("{:<48} error: {}\n", b.name, error);
      configurations.push(std::move(row));
      continue;
    }

    Value launchesJson = Value::array();
    for (const Launch &l : launches) {
      Value j = Value::object();
      j.set("kernel", l.kernel);
      Value grid = Value::array(), block = Value::array();
      for (int i = 0; i < 3; ++i) {
        grid.push(l.grid[i]);
        block.push(l.block[i]);
      }
      j.set("grid", std::move(grid));
      j.set("block", std::move(block));
      j.set("dynamic_shared_bytes", l.dynamicShared);
      j.set("counters", l.counters);
      launchesJson.push(std::move(j));
    }
    row.set("launches", std::move(launchesJson));

    Value devices = Value::object();
    std::string line = fmt::format("{:<48}", b.name);
    bool rowFailed = false;
    for (const DeviceModel &device : kDevices) {
      Value entry = Value::object();
      // A kernel built on wgmma (sm_90a) does not run on a device without
      // it: no figure, and not a failure.
      const bool runs = device.wgmmaFraction > 0 ||
                        std::none_of(launches.begin(), launches.end(), [](const Launch &l) {
                          return l.count("wgmma_flop") > 0;
                        });
      if (!runs) {
        entry.set("not_applicable", "the kernel uses wgmma (sm_90a)");
        line += fmt::format(" {:>10} {:<16} {:<7}", "-", "n/a (sm_90a)", "-");
        devices.set(device.name, std::move(entry));
        continue;
      }
      Value ptxas = Value::object();
      for (const Launch &l : launches) {
        const PtxasFigures f = ptxasFor(b, device.arch, l.kernel);
        missingPtxas |= !f.known;
        Value figures = Value::object();
        figures.set("registers", f.registers);
        figures.set("stack_bytes", f.stack);
        figures.set("spill_store_bytes", f.spillStore);
        figures.set("spill_load_bytes", f.spillLoad);
        figures.set("spill_bytes", f.spillStore + f.spillLoad);
        figures.set("known", f.known);
        ptxas.set(l.kernel, std::move(figures));
      }
      entry.set("ptxas", std::move(ptxas));
      try {
        Value modelledLaunches = Value::array();
        double callSeconds = 0, builderSeconds = 0, callUnique = 0, longest = -1;
        std::string bound;
        for (const Launch &l : launches) {
          LaunchModel m = modelLaunch(device, b, l, mustMove);
          if (l.partOfCall()) {
            callSeconds += m.seconds;
            callUnique += m.uniqueBytesScaled;
            if (l.attention() && m.seconds > longest) {
              longest = m.seconds;
              bound = m.bound;
            }
          } else {
            builderSeconds += m.seconds;
          }
          modelledLaunches.push(std::move(m.json));
        }
        entry.set("launches", std::move(modelledLaunches));
        entry.set("modelled_us", round3(callSeconds * 1e6));
        entry.set("builder_modelled_us", round3(builderSeconds * 1e6));
        entry.set("bound", bound);
        if (b.kind == KernelKind::Decode) {
          entry.set("modelled_bandwidth_fraction", round4(mustMove / callSeconds / device.hbm));
          entry.set("global_bytes_over_must_move", round4(callUnique / mustMove));
        } else {
          entry.set("modelled_tflops", std::round(flops / callSeconds * 1e-11) / 10);
          entry.set("modelled_fraction_of_peak",
                    round4(flops / callSeconds / device.peakFlops));
        }
        line += fmt::format(" {:>10.1f} {:<16} {:<7}", callSeconds * 1e6, figureText(entry),
                            bound);
      } catch (const std::exception &e) {
        rowFailed = true;
        entry.set("error", e.what());
        line += fmt::format(" {:>10} {:<16} {:<7}", "-", "error", "-");
      }
      devices.set(device.name, std::move(entry));
    }
    if (run.kvSequences)
      line += fmt::format("  (K/V of {} sequences stored)", run.kvSequences);
    out << line << "\n" << std::flush;
    row.set("status", rowFailed ? "error" : "modelled");
    row.set("devices", std::move(devices));
    failures += rowFailed;
    modelled += !rowFailed;
    configurations.push(std::move(row));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  Value root = Value::object();
  root.set("label", kLabel);
  root.set("modelled", true);
  root.set("measured", false);
  root.set("tool", "pagedc-gpu model");
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  root.set("date", date);
  root.set("pack", pack.directory);
  root.set("pack_created", pack.created);
  root.set("sample_blocks", options.sampleBlocks);
  root.set("prefill_sample_blocks", options.prefillSampleBlocks);
  root.set("max_kv_bytes", options.maxKvBytes);
  root.set("wall_seconds", round3(seconds));
  Value devices = Value::object();
  for (const DeviceModel &d : kDevices) {
    Value j = Value::object();
    j.set("arch", d.arch);
    j.set("note", d.note);
    j.set("peak_tflops", d.peakFlops * 1e-12);
    j.set("mma_sync_fraction", d.mmaSyncFraction);
    j.set("hbm_bytes_per_s", d.hbm);
    j.set("l2_bytes_per_s", d.l2);
    j.set("clock_hz", d.clock);
    j.set("sms", d.sms);
    j.set("shared_per_sm", d.sharedPerSm);
    j.set("shared_per_block", d.sharedPerBlock);
    j.set("registers_per_sm", d.registersPerSm);
    j.set("threads_per_sm", d.threadsPerSm);
    j.set("ctas_per_sm", d.ctasPerSm);
    devices.set(d.name, std::move(j));
  }
  root.set("devices", std::move(devices));
  Value constants = Value::object();
  constants.set("launch_overhead_us", kLaunchOverheadSeconds * 1e6);
  constants.set("dependent_launch_gap_us", kDependentLaunchGapSeconds * 1e6);
  constants.set("shared_bytes_per_clock_per_sm", kSharedBytesPerClock);
  constants.set("mufu_per_clock_per_sm", kMufuPerClock);
  constants.set("flops_per_mma", kFlopsPerMma);
  constants.set("reserved_shared_per_cta", kReservedSharedPerCta);
  root.set("constants", std::move(constants));
  root.set("configurations", std::move(configurations));
  if (!options.jsonPath.empty()) {
    std::ofstream file(options.jsonPath);
    file << root.dump(1) << "\n";
    if (!file)
      throw Error("cannot write " + options.jsonPath);
    out << "wrote " << options.jsonPath << " (MODELLED)\n";
  }
  if (missingPtxas)
    log << "pagedc-gpu model: warning: the pack has no ptxas figures for some kernels "
           "(prepare it with --ptxas-arch sm_90,sm_80); occupancy ignores registers there\n";
  out << fmt::format("pagedc-gpu model: {} configurations MODELLED, {} failed, in {:.1f} s\n",
                     modelled, failures, seconds);
  if (modelled + failures == 0) {
    out << "pagedc-gpu model: no configuration matched\n";
    return 1;
  }
  return failures ? 1 : 0;
}

} // namespace pagedc::gpu
