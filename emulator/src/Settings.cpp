//===- Settings.cpp - The emulator's PAGEDC_EMU_* settings ----------------===//
//
// The one place the emulator reads its environment. Each variable is a
// field of emu::Settings (pagedc-emu/Settings.h):
//
//   variable                    values                                unset
//   PAGEDC_EMU_CHECKS           all | none | comma list of memcheck,   all
//                               racecheck, initcheck, synccheck
//   PAGEDC_EMU_THREADS          integer 1-256                         one per core
//   PAGEDC_EMU_MULTIPROCESSORS  integer 1-1024                        132 (H100)
//   PAGEDC_EMU_REGISTERS        comma list of kernel=N, N 1-255       128 per kernel
//   PAGEDC_EMU_SAMPLE_BLOCKS    integer >= 0 (0: whole grids)         whole grids
//   PAGEDC_EMU_SAMPLE_KERNELS   comma list of kernel names            every kernel
//   PAGEDC_EMU_REPORT           file: a JSON line per report          none
//   PAGEDC_EMU_COUNTERS         file: a JSON line per launch          none
//                               (in a directory that exists and is writable)
//   PAGEDC_EMU_QUIET            0 | 1 (1: no reports on stderr)       0
//
// An empty value is the same as unset. Anything else that does not parse
// is refused with the valid values (settingInfos holds this table), so a
// misspelt checker never turns checking off; the emulated driver's cuInit
// fails with that message (Driver.cpp).
//
//===----------------------------------------------------------------------===//

#include "pagedc-emu/Settings.h"

#include <cerrno>
#include <cstdlib>

#include <sys/stat.h>
#include <unistd.h>

namespace pagedc::emu {

namespace {

const char *const kCheckers[] = {"memcheck", "racecheck", "initcheck", "synccheck"};

std::vector<std::string> splitCommas(const std::string &text) {
  std::vector<std::string> items;
  size_t at = 0;
  while (true) {
    const size_t end = text.find(',', at);
    items.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos)
      return items;
    at = end + 1;
  }
}

/// A decimal integer in [low, high], and nothing else (no sign, no spaces).
std::optional<long long> integerIn(const std::string &text, long long low, long long high) {
  if (text.empty() || text.size() > 18)
    return std::nullopt;
  for (char c : text)
    if (c < '0' || c > '9')
      return std::nullopt;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), nullptr, 10);
  if (errno != 0 || value < low || value > high)
    return std::nullopt;
  return value;
}

bool isKernelName(const std::string &name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9'))
    return false;
  for (char c : name)
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      return false;
  return true;
}

/// Whether a file at `path` can be created or appended to: the lines would
/// otherwise be lost without a word.
bool isWritableFile(const std::string &path) {
  // A directory passes access(W_OK) but cannot be opened for appending.
  struct stat info;
  if (::stat(path.c_str(), &info) == 0)
    return !S_ISDIR(info.st_mode) && ::access(path.c_str(), W_OK) == 0;
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "."
                                : slash == 0               ? "/"
                                                           : path.substr(0, slash);
  return ::access(directory.c_str(), W_OK | X_OK) == 0;
}

const SettingInfo &infoOf(const char *variable) {
  for (const SettingInfo &info : settingInfos())
    if (std::string(info.variable) == variable)
      return info;
  return settingInfos().front();
}

} // namespace

const std::vector<SettingInfo> &settingInfos() {
  static const std::vector<SettingInfo> infos = {
      {"PAGEDC_EMU_CHECKS",
       "all, none or a comma list of memcheck, racecheck, initcheck, synccheck", "all"},
      {"PAGEDC_EMU_THREADS", "an integer from 1 to 256", "one per core"},
      {"PAGEDC_EMU_MULTIPROCESSORS", "an integer from 1 to 1024", "132 (an H100's)"},
      {"PAGEDC_EMU_REGISTERS", "a comma list of kernel=N with N from 1 to 255",
       "128 registers per thread"},
      {"PAGEDC_EMU_SAMPLE_BLOCKS", "an integer >= 0 (0: whole grids)", "whole grids"},
      {"PAGEDC_EMU_SAMPLE_KERNELS", "a comma list of kernel names", "every kernel"},
      {"PAGEDC_EMU_REPORT",
       "a file that gets a JSON line per report, in a directory that exists and is writable",
       "none"},
      {"PAGEDC_EMU_COUNTERS",
       "a file that gets a JSON line per launch, in a directory that exists and is writable",
       "none"},
      {"PAGEDC_EMU_QUIET", "0 or 1 (1: no reports on stderr)", "0"},
  };
  return infos;
}

int Settings::registersOf(const std::string &name, int fallback) const {
  auto found = registers.find(name);
  return found == registers.end() ? fallback : found->second;
}

uint64_t Settings::sampleBlocksOf(const std::string &name) const {
  if (sampleKernels.empty())
    return sampleBlocks;
  for (const std::string &kernel : sampleKernels)
    if (kernel == name)
      return sampleBlocks;
  return 0;
}

std::optional<Settings> parseSettings(const std::function<const char *(const char *)> &lookup,
                                      std::string *error) {
  Settings settings;
  std::string problem;
  // The value of `variable`, or nothing when it is unset or empty.
  auto valueOf = [&](const char *variable) -> std::optional<std::string> {
    const char *text = lookup(variable);
    if (!text || !*text)
      return std::nullopt;
    return std::string(text);
  };
  auto refuse = [&](const char *variable, const std::string &value, const std::string &why) {
    if (!problem.empty())
      problem += "\n";
    problem += std::string(variable) + " is '" + value + "'" + (why.empty() ? "" : ": " + why) +
               "; expected " + infoOf(variable).values;
  };

  if (auto text = valueOf("PAGEDC_EMU_CHECKS"); text && *text != "all") {
    Checks none;
    none.memcheck = none.racecheck = none.initcheck = none.synccheck = false;
    settings.checks = none;
    if (*text != "none") {
      for (const std::string &item : splitCommas(*text)) {
        bool *flag = item == kCheckers[0]   ? &settings.checks.memcheck
                     : item == kCheckers[1] ? &settings.checks.racecheck
                     : item == kCheckers[2] ? &settings.checks.initcheck
                     : item == kCheckers[3] ? &settings.checks.synccheck
                                            : nullptr;
        if (!flag) {
          refuse("PAGEDC_EMU_CHECKS", *text,
                 item.empty() ? "an empty checker name" : "unknown checker '" + item + "'");
          break;
        }
        *flag = true;
      }
    }
  }
  if (auto text = valueOf("PAGEDC_EMU_THREADS")) {
    if (auto value = integerIn(*text, 1, 256))
      settings.threads = static_cast<unsigned>(*value);
    else
      refuse("PAGEDC_EMU_THREADS", *text, "");
  }
  if (auto text = valueOf("PAGEDC_EMU_MULTIPROCESSORS")) {
    if (auto value = integerIn(*text, 1, 1024))
      settings.multiprocessors = static_cast<int>(*value);
    else
      refuse("PAGEDC_EMU_MULTIPROCESSORS", *text, "");
  }
  if (auto text = valueOf("PAGEDC_EMU_REGISTERS")) {
    for (const std::string &entry : splitCommas(*text)) {
      const size_t equals = entry.find('=');
      const std::string name = entry.substr(0, equals);
      std::optional<long long> value;
      if (equals != std::string::npos)
        value = integerIn(entry.substr(equals + 1), 1, 255);
      if (!isKernelName(name) || !value) {
        refuse("PAGEDC_EMU_REGISTERS", *text, "entry '" + entry + "'");
        break;
      }
      settings.registers[name] = static_cast<int>(*value);
    }
  }
  if (auto text = valueOf("PAGEDC_EMU_SAMPLE_BLOCKS")) {
    if (auto value = integerIn(*text, 0, (1ll << 40)))
      settings.sampleBlocks = static_cast<uint64_t>(*value);
    else
      refuse("PAGEDC_EMU_SAMPLE_BLOCKS", *text, "");
  }
  if (auto text = valueOf("PAGEDC_EMU_SAMPLE_KERNELS")) {
    for (const std::string &name : splitCommas(*text)) {
      if (!isKernelName(name)) {
        refuse("PAGEDC_EMU_SAMPLE_KERNELS", *text, "kernel name '" + name + "'");
        settings.sampleKernels.clear();
        break;
      }
      settings.sampleKernels.push_back(name);
    }
  }
  for (auto [variable, path] : {std::pair{"PAGEDC_EMU_REPORT", &settings.reportPath},
                                std::pair{"PAGEDC_EMU_COUNTERS", &settings.countersPath}}) {
    if (auto text = valueOf(variable)) {
      if (isWritableFile(*text))
        *path = *text;
      else
        refuse(variable, *text, "cannot write there");
    }
  }
  if (auto text = valueOf("PAGEDC_EMU_QUIET")) {
    if (*text == "0" || *text == "1")
      settings.quiet = *text == "1";
    else
      refuse("PAGEDC_EMU_QUIET", *text, "");
  }

  if (!problem.empty()) {
    if (error)
      *error = problem;
    return std::nullopt;
  }
  return settings;
}

std::optional<Settings> settingsFromEnvironment(std::string *error) {
  return parseSettings([](const char *variable) { return std::getenv(variable); }, error);
}

Checks Checks::fromEnvironment() {
  // Settings the driver refused (its cuInit failed with why) leave every
  // checker on rather than guess.
  std::optional<Settings> settings = settingsFromEnvironment(nullptr);
  return settings ? settings->checks : Checks{};
}

} // namespace pagedc::emu
