//===- Settings.h - The emulator's PAGEDC_EMU_* settings -------*- C++ -*-===//
//
// Everything that changes what the emulator does is a field of
// emu::Settings. The emulated driver reads them from the PAGEDC_EMU_*
// variables (Settings.cpp holds the one table of them and the only
// getenv of the emulator); tests build a Settings, or parse a map of
// their own with parseSettings. An unknown checker name or a value that
// does not parse is an error that lists the valid values: nothing falls
// back to a default silently.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_EMU_SETTINGS_H
#define PAGEDC_EMU_SETTINGS_H

#include "pagedc-emu/Emulator.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pagedc::emu {

/// The emulator's settings; the defaults are what an unset variable means.
struct Settings {
  /// PAGEDC_EMU_CHECKS: the checkers that run (all by default).
  Checks checks;
  /// PAGEDC_EMU_THREADS: worker threads per launch; 0 = one per core.
  unsigned threads = 0;
  /// PAGEDC_EMU_MULTIPROCESSORS: the SM count the device reports; 0 = the
  /// H100's (DeviceLimits::multiprocessors).
  int multiprocessors = 0;
  /// PAGEDC_EMU_REGISTERS: registers per thread of the kernels named, for
  /// cuOccupancyMaxActiveBlocksPerMultiprocessor and as the launch count
  /// setmaxnreg starts from (LaunchConfig::launchRegisters).
  std::map<std::string, int> registers;
  /// PAGEDC_EMU_SAMPLE_BLOCKS: run only this many blocks of each grid (to
  /// count); 0 = whole grids.
  uint64_t sampleBlocks = 0;
  /// PAGEDC_EMU_SAMPLE_KERNELS: the kernels sampling applies to; empty =
  /// every kernel.
  std::vector<std::string> sampleKernels;
  /// PAGEDC_EMU_REPORT, PAGEDC_EMU_COUNTERS: files that get a JSON line per
  /// report / per launch; empty = none.
  std::string reportPath, countersPath;
  /// PAGEDC_EMU_QUIET: no checker reports on stderr.
  bool quiet = false;

  /// Registers per thread of kernel `name` (`fallback` when not named).
  int registersOf(const std::string &name, int fallback) const;
  /// Blocks of a grid of kernel `name` to run: sampleBlocks or 0 (all).
  uint64_t sampleBlocksOf(const std::string &name) const;
};

/// One PAGEDC_EMU_* variable: its name, the values it takes and what
/// leaving it unset means (the table in Settings.cpp's head).
struct SettingInfo {
  const char *variable;
  const char *values;
  const char *unset;
};
const std::vector<SettingInfo> &settingInfos();

/// Parses the variables `lookup` returns (null: unset). Returns nothing,
/// with `error` naming the variable, its value and the valid values, when
/// one does not parse.
std::optional<Settings> parseSettings(const std::function<const char *(const char *)> &lookup,
                                      std::string *error);

/// parseSettings over the process environment, read at each call (tools
/// such as `pagedc-gpu model` change the sampling between launches).
std::optional<Settings> settingsFromEnvironment(std::string *error);

} // namespace pagedc::emu

#endif // PAGEDC_EMU_SETTINGS_H
