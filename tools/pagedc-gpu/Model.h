//===- Model.h - pagedc-gpu model: MODELLED GPU time from emulator counts -===//
//
// `pagedc-gpu model PACK` runs every benchmark configuration of an emulator
// pack once through the same runtime CUDA path as `pagedc-gpu bench`, on the
// SIMT emulator (sampled grids, checkers off), reads the emulator's counters
// per launch, and combines them with the ptxas figures the pack carries
// (`pagedc-gpu-prepare --ptxas-arch sm_90,sm_80`) into a roofline estimate
// of the call's time on an H100 SXM and an A100 SXM. `pagedc-gpu model
// --launches FILE` models launches whose counters a script gathered, with
// the same formulas; `--explain` prints them. Every figure is MODELLED,
// never measured; docs/emulator.md ("The performance model") says why each
// formula is as it is.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TOOLS_PAGEDC_GPU_MODEL_H
#define PAGEDC_TOOLS_PAGEDC_GPU_MODEL_H

#include "Pack.h"

#include "pagedc/KernelOptions.h"

#include <iosfwd>
#include <string>

namespace pagedc::gpu {

struct ModelOptions {
  /// Only configurations whose name contains one of these comma-separated
  /// texts (nameMatches).
  std::string filter;
  /// The JSON result (empty: none).
  std::string jsonPath;
  /// Blocks of each decode / prefill grid the emulator runs (counts are
  /// scaled by grid blocks / blocks run); 0 runs every block. Decode CTAs
  /// do near-equal work; causal prefill CTAs' work grows with the query
  /// block, and 32 blocks over-estimate S 4k by 18% (128: within 1% of 512).
  int sampleBlocks = 32, prefillSampleBlocks = 128;
  /// K/V bytes above which the cache stores fewer sequences and the others
  /// read theirs (RunOptions::kvSequences): the launches stay those of the
  /// real batch, only resident memory shrinks.
  double maxKvBytes = 2.5e9;
  /// The kernel options of the modelled calls, but for the prefill's grid:
  /// a CTA per query tile whatever they say (runModel).
  KernelOptions kernel;
};

/// `pagedc-gpu model --launches FILE`: the launches of a JSON-lines file,
/// each an emulator counter line (PAGEDC_EMU_COUNTERS) or a launch a model
/// JSON already holds (its "terms_us" and "wave_efficiency"), modelled on
/// one device. A counter line may add "registers" (per thread, from ptxas)
/// and "must_move_bytes" (a prefill's); any line may add
/// "warp_instructions" (a count or a range of them), which adds the issue
/// rule's figures.
struct LaunchesOptions {
  std::string path;
  /// The JSON result (empty: none).
  std::string jsonPath;
  /// H100 or A100.
  std::string device = "H100";
  /// Registers per thread of a line that gives none; 0 leaves the register
  /// limit out of the occupancy.
  int registers = 0;
  /// How a launch's DRAM bytes are counted: "distinct" (as for a pack) or
  /// "requested" (a decode or merge launch moves what it requests).
  std::string dram = "distinct";
};

/// Models the launches of `options.path`; prints a table to `out`. Throws
/// pagedc::Error naming the line of a malformed launch.
int runLaunches(const LaunchesOptions &options, std::ostream &out);

/// Prints the model's formulas with its constants and devices to `out`;
/// with a `jsonPath`, writes the constants and devices there.
int explainModel(const std::string &jsonPath, std::ostream &out);

/// Sets the emulator's environment (driver, checks, sampling); must run
/// before the CUDA driver is first used.
void prepareModelEnvironment(const ModelOptions &options);

/// Models every selected configuration; prints a table to `out`, progress
/// to `log`. Returns the exit status (0: all modelled, 1: one failed).
int runModel(const Pack &pack, const ModelOptions &options, std::ostream &out,
             std::ostream &log);

} // namespace pagedc::gpu

#endif // PAGEDC_TOOLS_PAGEDC_GPU_MODEL_H
