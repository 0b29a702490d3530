//===- Model.cpp - pagedc-gpu model: MODELLED GPU time from emulator counts ===//
//
// The performance model, its only copy: the devices' figures, the constants,
// the roofline of a launch, the issue rule. `pagedc-gpu model --explain`
// prints the formulas with the constants below; docs/emulator.md ("The
// performance model") says why each is as it is and points here. Scripts
// that need modelled times (bench/python/cascade_cuda_model.py,
// bench/gpu/issue_model.py) gather counters and call `pagedc-gpu model
// --launches`.
//
//===----------------------------------------------------------------------===//

#include "Model.h"

#include "GpuCheck.h"

#include "kernels/Json.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
constexpr double kSharedBytesPerClock = 128; ///< per SM: one wavefront
constexpr double kMufuPerClock = 16;         ///< per SM
constexpr double kSectorBytes = 32;
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16; ///< m16n8k16
constexpr int kReservedSharedPerCta = 1024;
/// Warp schedulers per SM, each issuing one warp instruction a clock (the
/// issue rule).
constexpr double kSchedulersPerSm = 4;

const DeviceModel &deviceNamed(const std::string &name) {
  for (const DeviceModel &device : kDevices)
    if (name == device.name)
      return device;
  throw Error("--device: '" + name + "' is not H100 or A100");
}

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
  /// What the launch asks of global memory: its cp.async copies and plain
  /// loads, scaled to the grid.
  double requestedBytes() const {
    return (count("cp_async_bytes") + count("global_load_bytes")) * scale();
  }
};

Launch parseLaunch(const Value &value) {
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
  return launch;
}

/// The JSON values of a file of JSON lines (blank lines skipped); a line
/// that does not parse is named.
std::vector<Value> readJsonLines(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    throw Error("cannot read " + path);
  std::vector<Value> values;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    try {
      values.push_back(Value::parse(line));
    } catch (const std::exception &e) {
      throw Error(fmt::format("{}:{}: {}", path, number, e.what()));
    }
  }
  return values;
}

std::vector<Launch> readCounters(const std::string &path) {
  std::vector<Launch> launches;
  for (const Value &value : readJsonLines(path))
    launches.push_back(parseLaunch(value));
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

/// The roofline's terms of a launch, in seconds, in the order the JSON and
/// a tie (the first largest is the bound) take them.
constexpr const char *kTermNames[] = {"tensor", "shared", "dram", "l2", "mufu"};
using Terms = std::array<double, 5>;
enum Term { Tensor, Shared, Dram, L2, Mufu };

/// Programmatic dependent launch is sm_90's: an A100 launches the grid
/// after the previous one ends, as a plain launch.
bool dependentLaunch(const DeviceModel &device, bool programmatic) {
  return programmatic && std::string(device.arch) == "sm_90";
}

/// The overhead charged to a launch on top of its terms.
double launchOverheadSeconds(const DeviceModel &device, bool programmatic) {
  return dependentLaunch(device, programmatic) ? kDependentLaunchGapSeconds
                                               : kLaunchOverheadSeconds;
}

/// The seconds the SMs' schedulers take to issue `warpInstructions` (the
/// instructions besides the MMAs, which the emulator does not count), slowed
/// by a partly filled wave as the roofline's terms are.
double issueSeconds(const DeviceModel &device, double warpInstructions, double efficiency) {
  return warpInstructions / (device.sms * kSchedulersPerSm * device.clock) / efficiency;
}

/// The issue rule: the non-MMA instructions are taken not to run under the
/// tensor or shared-memory time (what Nsight Compute's counts showed on the
/// prefill kernels, bench/gpu/issue_model.py fit), so they add to the larger
/// of the two. The terms are taken as they are, only the issue is divided by
/// the wave efficiency (the rule as it was fitted). Excludes the launch
/// overhead.
double issueRuleSeconds(const Terms &terms, double issue) {
  return std::max(
      {std::max(terms[Tensor], terms[Shared]) + issue, terms[Dram], terms[L2], terms[Mufu]});
}

/// How a launch's DRAM bytes are counted.
enum class DramRule {
  /// Decode, merge and builder CTAs touch disjoint data: the sample's
  /// distinct sectors scale. Prefill CTAs of one (batch, kv head) re-read
  /// the same K/V, assumed caught by L2: DRAM moves what the call must move
  /// (at least the sample's distinct sectors).
  Distinct,
  /// As Distinct for the prefill; a decode or merge launch moves what it
  /// requests (copies and loads, plus its stores): no reuse of one
  /// sequence's pages by another's CTAs through L2, what a step reads when
  /// each sequence has its own copy of a shared prefix.
  Requested,
};

DramRule parseDramRule(const std::string &text) {
  if (text == "distinct")
    return DramRule::Distinct;
  if (text == "requested")
    return DramRule::Requested;
  throw Error("--dram: '" + text + "' is not distinct or requested");
}

struct LaunchModel {
  Value json;
  double seconds = 0;
  std::string bound;
  double uniqueBytesScaled = 0;
  Terms terms{};
  double efficiency = 1;
};

/// The roofline of one launch on one device; `registers` 0 leaves the
/// register limit out of the occupancy.
LaunchModel modelLaunch(const DeviceModel &device, const Launch &launch, int registers,
                        double mustMoveBytes, DramRule dramRule = DramRule::Distinct) {
  const double scale = launch.scale();
  const Occupancy occ = occupancy(device, registers, launch.threads(), launch.dynamicShared);
  if (occ.ctas == 0)
    throw Error(fmt::format("{} does not fit on an {} SM ({})", launch.kernel, device.name,
                            occ.limit));
  const double grid = launch.count("grid_blocks");
  const double slots = double(device.sms) * occ.ctas;
  const double waves = std::ceil(grid / slots);
  const double efficiency = grid / (waves * slots);

  const double uniqueBytes = launch.count("global_sectors_unique") * kSectorBytes;
  double dramBytes = uniqueBytes * scale;
  if (launch.kernel == "pagedc_prefill")
    dramBytes = std::max(mustMoveBytes, uniqueBytes);
  else if (dramRule == DramRule::Requested)
    dramBytes = launch.requestedBytes() + launch.count("global_store_bytes") * scale;
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
      (launch.count("cp_async_bytes") + launch.count("cp_async_zero_fill_bytes") + bulkBytes +
       launch.count("wgmma_shared_bytes")) /
          kSharedBytesPerClock;
  LaunchModel result;
  result.terms[Tensor] =
      launch.count("mma") * scale * kFlopsPerMma / (device.peakFlops * device.mmaSyncFraction) +
      (wgmmaFlops > 0 ? wgmmaFlops * scale / (device.peakFlops * device.wgmmaFraction) : 0.0);
  result.terms[Shared] = wavefronts * scale / (device.sms * device.clock);
  result.terms[Dram] = dramBytes / device.hbm;
  result.terms[L2] =
      (launch.count("global_sectors_requested") * kSectorBytes + bulkBytes) * scale / device.l2;
  result.terms[Mufu] =
      launch.count("transcendentals") * scale / (device.sms * kMufuPerClock * device.clock);
  result.efficiency = efficiency;
  double longest = -1;
  Value termsJson = Value::object();
  for (size_t i = 0; i < result.terms.size(); ++i) {
    termsJson.set(kTermNames[i], round3(result.terms[i] * 1e6));
    if (result.terms[i] > longest) {
      longest = result.terms[i];
      result.bound = kTermNames[i];
    }
  }
  const bool dependent = dependentLaunch(device, launch.programmatic);
  result.seconds = longest / efficiency + launchOverheadSeconds(device, launch.programmatic);
  result.uniqueBytesScaled = uniqueBytes * scale;
  Value j = Value::object();
  j.set("kernel", launch.kernel);
  j.set("part_of_call", launch.partOfCall());
  j.set("grid_blocks", static_cast<int64_t>(grid));
  j.set("blocks_run", static_cast<int64_t>(launch.count("blocks")));
  j.set("registers", registers);
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

/// The devices' figures as the JSON results carry them.
Value devicesJson() {
  Value devices = Value::object();
  for (const DeviceModel &d : kDevices) {
    Value j = Value::object();
    j.set("arch", d.arch);
    j.set("note", d.note);
    j.set("peak_tflops", d.peakFlops * 1e-12);
    j.set("mma_sync_fraction", d.mmaSyncFraction);
    j.set("wgmma_fraction", d.wgmmaFraction);
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
  return devices;
}

Value constantsJson() {
  Value constants = Value::object();
  constants.set("launch_overhead_us", kLaunchOverheadSeconds * 1e6);
  constants.set("dependent_launch_gap_us", kDependentLaunchGapSeconds * 1e6);
  constants.set("shared_bytes_per_clock_per_sm", kSharedBytesPerClock);
  constants.set("mufu_per_clock_per_sm", kMufuPerClock);
  constants.set("flops_per_mma", kFlopsPerMma);
  constants.set("reserved_shared_per_cta", kReservedSharedPerCta);
  constants.set("schedulers_per_sm", kSchedulersPerSm);
  return constants;
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
    if (!nameMatches(b.name, options.filter))
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
      if (l.programmatic)
        j.set("programmatic_dependent", true);
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
          LaunchModel m =
              modelLaunch(device, l, ptxasFor(b, device.arch, l.kernel).registers, mustMove);
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
  root.set("date", utcNow());
  root.set("pack", pack.directory);
  root.set("pack_created", pack.created);
  root.set("sample_blocks", options.sampleBlocks);
  root.set("prefill_sample_blocks", options.prefillSampleBlocks);
  root.set("max_kv_bytes", options.maxKvBytes);
  root.set("wall_seconds", round3(seconds));
  root.set("devices", devicesJson());
  root.set("constants", constantsJson());
  root.set("configurations", std::move(configurations));
  if (!options.jsonPath.empty()) {
    writeJsonFile(options.jsonPath, root, 1);
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

namespace {

/// A line's "warp_instructions": a number or an array of them (a range).
std::vector<double> warpInstructions(const Value &line) {
  std::vector<double> counts;
  const Value *value = line.find("warp_instructions");
  if (!value)
    return counts;
  if (value->kind() == Value::Kind::Array) {
    for (const Value &item : value->asArray("warp_instructions"))
      counts.push_back(item.asDouble("warp_instructions"));
    if (counts.empty())
      throw Error("warp_instructions is an empty array");
  } else {
    counts.push_back(value->asDouble("warp_instructions"));
  }
  return counts;
}

/// The issue rule's figures of a launch with terms `terms` for each count of
/// warp instructions.
void addIssue(Value &json, const DeviceModel &device, const Terms &terms, double efficiency,
              bool programmatic, const std::vector<double> &counts) {
  Value instructions = Value::array(), issue = Value::array(), total = Value::array();
  for (double count : counts) {
    const double seconds = issueSeconds(device, count, efficiency);
    instructions.push(count);
    issue.push(seconds * 1e6);
    total.push((issueRuleSeconds(terms, seconds) + launchOverheadSeconds(device, programmatic)) *
               1e6);
  }
  json.set("warp_instructions", std::move(instructions));
  json.set("issue_us", std::move(issue));
  json.set("modelled_us_with_issue", std::move(total));
}

} // namespace

int runLaunches(const LaunchesOptions &options, std::ostream &out) {
  const DeviceModel &device = deviceNamed(options.device);
  const DramRule dramRule = parseDramRule(options.dram);
  const std::vector<Value> lines = readJsonLines(options.path);
  if (lines.empty())
    throw Error(options.path + " holds no launch");
  Value launches = Value::array();
  double callSeconds = 0, requested = 0;
  out << "MODELLED, not measured (no GPU ran these kernels): " << device.name << "\n";
  out << fmt::format("{:<28} {:>8} {:>8} {:<7} {:>11} {:>16}\n", "kernel", "grid", "run", "bound",
                     "modelled us", "with issue us");
  for (size_t i = 0; i < lines.size(); ++i) {
    const Value &line = lines[i];
    Value json;
    std::string text;
    try {
      const std::vector<double> counts = warpInstructions(line);
      if (const Value *given = line.find("terms_us")) {
        // A launch the model has already turned into terms (a model JSON's):
        // only the issue rule is applied.
        if (counts.empty())
          throw Error("a line with terms_us needs warp_instructions");
        Terms terms{};
        for (size_t t = 0; t < terms.size(); ++t)
          terms[t] = given->at(kTermNames[t]).asDouble(kTermNames[t]) * 1e-6;
        const double efficiency = line.at("wave_efficiency").asDouble("wave_efficiency");
        if (!(efficiency > 0 && efficiency <= 1))
          throw Error(fmt::format("wave_efficiency must be in (0, 1], got {}", efficiency));
        const Value *flag = line.find("programmatic_dependent");
        const bool programmatic = flag && flag->asBool("programmatic_dependent");
        json = Value::object();
        if (const Value *kernel = line.find("kernel"))
          json.set("kernel", kernel->asString("kernel"));
        json.set("wave_efficiency", efficiency);
        json.set("terms_us", *given);
        addIssue(json, device, terms, efficiency, programmatic, counts);
      } else {
        const Launch launch = parseLaunch(line);
        int registers = options.registers;
        if (const Value *r = line.find("registers"))
          registers = static_cast<int>(r->asInt("registers"));
        double mustMove = 0;
        if (const Value *m = line.find("must_move_bytes"))
          mustMove = m->asDouble("must_move_bytes");
        LaunchModel m = modelLaunch(device, launch, registers, mustMove, dramRule);
        json = std::move(m.json);
        json.set("requested_global_bytes", launch.requestedBytes());
        if (!counts.empty())
          addIssue(json, device, m.terms, m.efficiency, launch.programmatic, counts);
        if (launch.partOfCall()) {
          callSeconds += m.seconds;
          requested += launch.requestedBytes();
        }
        text = fmt::format("{:>8} {:>8} {:<7} {:>11.3f}",
                           static_cast<int64_t>(launch.count("grid_blocks")),
                           static_cast<int64_t>(launch.count("blocks")), m.bound, m.seconds * 1e6);
      }
    } catch (const std::exception &e) {
      throw Error(fmt::format("{}:{}: {}", options.path, i + 1, e.what()));
    }
    if (text.empty())
      text = fmt::format("{:>8} {:>8} {:<7} {:>11}", "-", "-", "-", "-");
    std::string issue;
    if (const Value *with = json.find("modelled_us_with_issue")) {
      const auto &range = with->asArray("modelled_us_with_issue");
      issue = fmt::format("{:.1f}", range.front().asDouble("us"));
      if (range.size() > 1)
        issue += fmt::format("-{:.1f}", range.back().asDouble("us"));
    }
    const Value *kernel = json.find("kernel");
    out << fmt::format("{:<28} {} {:>16}\n", kernel ? kernel->asString("kernel") : "-", text,
                       issue);
    launches.push(std::move(json));
  }
  Value root = Value::object();
  root.set("label", kLabel);
  root.set("modelled", true);
  root.set("measured", false);
  root.set("tool", "pagedc-gpu model --launches");
  root.set("device", device.name);
  root.set("dram", options.dram);
  root.set("default_registers", options.registers);
  root.set("launches", std::move(launches));
  root.set("modelled_us", round3(callSeconds * 1e6));
  root.set("requested_global_bytes", requested);
  out << fmt::format("call (every launch but the block-mask builder's): {:.3f} us MODELLED\n",
                     callSeconds * 1e6);
  if (!options.jsonPath.empty())
    writeJsonFile(options.jsonPath, root, 1);
  return 0;
}

int explainModel(const std::string &jsonPath, std::ostream &out) {
  out << "The performance model (MODELLED; tools/pagedc-gpu/Model.cpp; why: docs/emulator.md)\n";
  for (const DeviceModel &d : kDevices)
    out << fmt::format(
        "{} ({}): {:g} TFLOP/s dense bf16, mma.sync {} of it, wgmma {}; HBM {:g} TB/s, L2 {:g} "
        "TB/s; {} SMs at {:g} GHz; per SM {} KiB shared ({} per block), {} registers, {} "
        "threads, {} CTAs\n  {}\n",
        d.name, d.arch, d.peakFlops * 1e-12, d.mmaSyncFraction,
        d.wgmmaFraction > 0 ? fmt::format("{}", d.wgmmaFraction) : std::string("none"),
        d.hbm * 1e-12, d.l2 * 1e-12, d.sms, d.clock * 1e-9, d.sharedPerSm / 1024,
        d.sharedPerBlock / 1024, d.registersPerSm, d.threadsPerSm, d.ctasPerSm, d.note);
  out << fmt::format(
      "Per launch (counters of PAGEDC_EMU_COUNTERS; s = grid_blocks / blocks):\n"
      "  CTAs per SM = min(CTAs, threads per SM / threads, register limit, shared limit)\n"
      "    register limit = (registers per SM / (ceil(r / 8) * 8 * 32 rounded up to 256)) / "
      "warps\n"
      "    shared limit = shared per SM / (dynamic shared + {}); 0 over the per-block limit\n"
      "  waves W = ceil(grid / (SMs * CTAs per SM)), efficiency e = grid / (W * SMs * CTAs per "
      "SM)\n"
      "  tensor = mma * {} FLOP * s / (peak * mma.sync fraction) + wgmma_flop * s / (peak * "
      "wgmma fraction)\n"
      "  shared = (ldmatrix_wavefronts + shared_wavefronts + (cp_async_bytes + "
      "cp_async_zero_fill_bytes + bulk_copy_bytes + wgmma_shared_bytes) / {}) * s / (SMs * "
      "clock)\n"
      "  dram = bytes / HBM; pagedc_prefill: bytes = max(must-move bytes, "
      "global_sectors_unique * {});\n"
      "    other kernels: bytes = global_sectors_unique * {} * s (--dram distinct), or\n"
      "    (cp_async_bytes + global_load_bytes + global_store_bytes) * s (--dram requested)\n"
      "  l2 = (global_sectors_requested * {} + bulk_copy_bytes) * s / L2\n"
      "  mufu = transcendentals * s / (SMs * {} * clock)\n"
      "  t = max(terms) / e + {} us ({} us for a programmatic dependent launch on sm_90); the "
      "largest term is the bound\n"
      "A call: its launches' t added, the block-mask builder's apart.\n"
      "Issue rule (launches with warp_instructions):\n"
      "  issue = warp_instructions / (SMs * {} schedulers * clock) / e\n"
      "  t = max(max(tensor, shared) + issue, dram, l2, mufu) + the launch's overhead\n",
      kReservedSharedPerCta, kFlopsPerMma, kSharedBytesPerClock, kSectorBytes, kSectorBytes,
      kSectorBytes, kMufuPerClock, kLaunchOverheadSeconds * 1e6, kDependentLaunchGapSeconds * 1e6,
      kSchedulersPerSm);
  if (!jsonPath.empty()) {
    Value root = Value::object();
    root.set("label", kLabel);
    root.set("devices", devicesJson());
    root.set("constants", constantsJson());
    writeJsonFile(jsonPath, root, 1);
  }
  return 0;
}

} // namespace pagedc::gpu
