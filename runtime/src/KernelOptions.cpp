//===- KernelOptions.cpp - Parsing the kernel settings of a call ----------===//
//
// One parser for every text form of KernelOptions (command-line flags,
// Python dicts, the former environment variables): each setting is parsed
// by the same code whatever its source, and only the label its messages
// name differs.
//
//===----------------------------------------------------------------------===//

#include "pagedc/KernelOptions.h"
#include "Environment.h"

#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

namespace pagedc {
namespace {

/// An integer option's range and what its messages call it.
struct IntegerRange {
  long low, high;
  const char *what;
};
/// The largest persistent prefill grid a setting may ask for.
constexpr IntegerRange kPersistentCtasRange{1, 1L << 20, "the persistent prefill's CTAs"};
constexpr IntegerRange kDecodeSplitFactorRange{1, 16, "the decode's split count times this"};
/// The most decode splits a setting may ask for (CudaLaunch.cpp's kMaxSplits).
constexpr IntegerRange kDecodeSplitsRange{1, 1024, "the decode's split count"};
constexpr IntegerRange kDecodeMergeChunksRange{1, 16,
                                               "the merge's CTAs a query row, a power of two"};

/// What a 0/1 switch turns on, for its message.
const char *switchMeaning(std::string_view name) {
  if (name == "prefill_tma")
    return "tensor-map copies of K/V pages in the warpgroup prefill";
  if (name == "prefill_tma_runs")
    return "one tensor-map box per tile of consecutive pages in the warpgroup prefill";
  if (name == "prefill_pingpong")
    return "ping-pong consumer warpgroups in the warpgroup prefill";
  if (name == "prefill_tile_counter")
    return "persistent CTAs taking tiles from a work counter";
  if (name == "decode_tma")
    return "tensor-map copies of K/V pages in decode";
  if (name == "decode_tma_runs")
    return "one tensor-map box per tile of consecutive pages in decode";
  return "on";
}

bool parseSwitch(std::string_view label, std::string_view name, std::string_view value) {
  if (value == "0")
    return false;
  if (value == "1")
    return true;
  throw Error(fmt::format("{} is '{}': expected 1 ({}) or 0", label, value, switchMeaning(name)));
}

[[noreturn]] void throwOutOfRange(std::string_view label, std::string_view value,
                                  const IntegerRange &range) {
  throw Error(fmt::format("{} is '{}': expected an integer from {} to {} ({})", label, value,
                          range.low, range.high, range.what));
}

int parseInteger(std::string_view label, std::string_view value, const IntegerRange &range) {
  const std::string text(value);
  char *end = nullptr;
  errno = 0;
  const long number = std::strtol(text.c_str(), &end, 10);
  if (errno || *end || end == text.c_str() || number < range.low || number > range.high)
    throwOutOfRange(label, value, range);
  return static_cast<int>(number);
}

/// The parser's range check again, for a field set on the struct directly.
void checkInteger(std::string_view label, const std::optional<int> &value,
                  const IntegerRange &range) {
  if (value && (*value < range.low || *value > range.high))
    throwOutOfRange(label, std::to_string(*value), range);
}

/// decode_merge_chunks beyond its range: a power of two (`text` as given).
void checkMergeChunks(std::string_view label, int chunks, std::string_view text) {
  if (chunks < kDecodeMergeChunksRange.low || chunks > kDecodeMergeChunksRange.high ||
      (chunks & (chunks - 1)))
    throw Error(fmt::format("{} is '{}': expected 1, 2, 4, 8 or 16 (the merge's CTAs a query "
                            "row)",
                            label, text));
}

/// Parses `value` into option `name` of `options` (untouched when it
/// throws); `label` is what the messages call the setting. False: no such
/// name.
bool parseOption(KernelOptions &options, std::string_view name, std::string_view value,
                 std::string_view label) {
  const bool unset = value.empty();
  if (name == "prefill_shape") {
    if (!unset)
      checkPrefillShape(std::string(value), std::string(label));
    options.prefillShape = unset ? std::nullopt : std::optional<std::string>(value);
  } else if (name == "prefill_persistent") {
    if (!unset && value != "0" && value != "1")
      throw Error(fmt::format("{} is '{}': expected 1 (persistent CTAs in the warpgroup prefill "
                              "under every mask), 0 (a CTA per query tile) or nothing "
                              "(persistent CTAs where the block mask's visits grow)",
                              label, value));
    options.prefillPersistent = unset ? std::nullopt : std::optional<bool>(value == "1");
  } else if (name == "prefill_persistent_ctas") {
    options.prefillPersistentCtas =
        unset ? std::nullopt
              : std::optional<int>(parseInteger(label, value, kPersistentCtasRange));
  } else if (name == "link_mods") {
    std::optional<ModLinking> linking;
    if (value == "0")
      linking = ModLinking::Inline;
    else if (value == "1")
      linking = ModLinking::Linked;
    else if (value == "first")
      linking = ModLinking::LinkedFirst;
    else if (!unset)
      throw Error(fmt::format("{} is '{}': expected 0 (mods inlined), 1 (mods linked into a kernel "
                              "compiled once per shape) or first (linked until the inlined "
                              "kernel, compiled in the background, is ready)",
                              label, value));
    options.linkMods = linking;
  } else if (name == "decode_merge_chunks") {
    std::optional<int> chunks;
    if (!unset) {
      chunks = parseInteger(label, value, kDecodeMergeChunksRange);
      checkMergeChunks(label, *chunks, value);
    }
    options.decodeMergeChunks = chunks;
  } else if (name == "decode_splits") {
    options.decodeSplits =
        unset ? std::nullopt
              : std::optional<int>(parseInteger(label, value, kDecodeSplitsRange));
  } else if (name == "decode_split_factor") {
    options.decodeSplitFactor =
        unset ? std::nullopt
              : std::optional<int>(parseInteger(label, value, kDecodeSplitFactorRange));
  } else {
    std::optional<bool> KernelOptions::*field = nullptr;
    if (name == "prefill_tile_counter")
      field = &KernelOptions::prefillTileCounter;
    else if (name == "prefill_tma")
      field = &KernelOptions::prefillTma;
    else if (name == "prefill_tma_runs")
      field = &KernelOptions::prefillTmaRuns;
    else if (name == "prefill_pingpong")
      field = &KernelOptions::prefillPingPong;
    else if (name == "decode_tma")
      field = &KernelOptions::decodeTma;
    else if (name == "decode_tma_runs")
      field = &KernelOptions::decodeTmaRuns;
    else
      return false;
    options.*field = unset ? std::nullopt : std::optional<bool>(parseSwitch(label, name, value));
  }
  return true;
}

/// The pairs of settings that depend on each other; `label(name)` is what
/// a message calls a setting.
template <typename Label>
void checkPairs(const KernelOptions &options, Label label) {
  if (options.prefillPersistentCtas && options.prefillPersistent != true)
    throw Error(fmt::format("{} is '{}' but {} is not 1: the CTA count is for the persistent "
                            "prefill only",
                            label("prefill_persistent_ctas"), *options.prefillPersistentCtas,
                            label("prefill_persistent")));
  if (options.decodeSplits && options.decodeSplitFactor)
    throw Error(fmt::format("{} is '{}' and {} is '{}': give the split count or its factor, "
                            "not both",
                            label("decode_splits"), *options.decodeSplits,
                            label("decode_split_factor"), *options.decodeSplitFactor));
  if (options.prefillTileCounter && options.prefillPersistent == false)
    throw Error(fmt::format("{} is '{}' but {} is 0: the work counter is for the persistent "
                            "prefill only",
                            label("prefill_tile_counter"), *options.prefillTileCounter ? 1 : 0,
                            label("prefill_persistent")));
}

std::string optionLabel(std::string_view name) { return fmt::format("kernel option {}", name); }

} // namespace

bool KernelOptions::operator==(const KernelOptions &other) const {
  return prefillShape == other.prefillShape && prefillPersistent == other.prefillPersistent &&
         prefillPersistentCtas == other.prefillPersistentCtas &&
         prefillTileCounter == other.prefillTileCounter && prefillTma == other.prefillTma &&
         prefillTmaRuns == other.prefillTmaRuns && prefillPingPong == other.prefillPingPong &&
         decodeSplitFactor == other.decodeSplitFactor &&
         decodeSplits == other.decodeSplits && decodeMergeChunks == other.decodeMergeChunks &&
         decodeTma == other.decodeTma &&
         decodeTmaRuns == other.decodeTmaRuns && linkMods == other.linkMods;
}

const std::vector<KernelOptionInfo> &kernelOptionInfos() {
  static const std::vector<KernelOptionInfo> infos = {
      {"prefill_shape", "PAGEDC_PREFILL_SHAPE",
       "MxNxW[r|sK] entries, comma-separated, each optionally dD= (e.g. 128x128x64,d256=128x64x64)",
       "the tile chosen for the target", "the prefill tile (a tile asked for is never narrowed "
                                         "on spills)"},
      {"prefill_persistent", "PAGEDC_PREFILL_PERSISTENT", "0 or 1",
       "persistent where the mask's visits grow and tiles outnumber slots",
       "persistent CTAs (1) or a CTA per query tile (0) in the warpgroup prefill"},
      {"prefill_persistent_ctas", "PAGEDC_PREFILL_PERSISTENT_CTAS", "1 to 1048576",
       "one per resident slot", "the persistent prefill's CTAs (with prefill_persistent=1)"},
      {"prefill_tile_counter", "PAGEDC_PREFILL_TILE_COUNTER", "0 or 1", "1",
       "persistent CTAs take tiles from a work counter (1) or in fixed rounds (0)"},
      {"prefill_tma", "PAGEDC_PREFILL_TMA", "0 or 1", "1",
       "tensor-map copies of K/V pages in the warpgroup prefill (0: cp.async gather)"},
      {"prefill_tma_runs", "PAGEDC_PREFILL_TMA_RUNS", "0 or 1", "1",
       "one tensor-map box per run of consecutive pages in the warpgroup prefill"},
      {"prefill_pingpong", "PAGEDC_PREFILL_PINGPONG", "0 or 1", "0",
       "the warpgroup prefill's consumer warpgroups take turns issuing wgmmas"},
      {"decode_split_factor", "PAGEDC_DECODE_SPLIT_FACTOR", "1 to 16", "1",
       "a decode gets this many times the KV splits the model chooses"},
      {"decode_splits", "PAGEDC_DECODE_SPLITS", "1 to 1024", "the model's",
       "the decode's split count, kept within what the call allows (not with "
       "decode_split_factor)"},
      {"decode_merge_chunks", "PAGEDC_DECODE_MERGE_CHUNKS", "1, 2, 4, 8 or 16",
       "as many as the merge's slots take for few rows",
       "the CTAs among which a split decode's merge divides a query row's columns (at most "
       "one per 16)"},
      {"decode_tma", "PAGEDC_DECODE_TMA", "0 or 1", "1",
       "tensor-map copies of K/V tiles in decode, sm_90 code (0: cp.async gather)"},
      {"decode_tma_runs", "PAGEDC_DECODE_TMA_RUNS", "0 or 1", "1",
       "one tensor-map box per tile of consecutive pages in decode"},
      {"link_mods", "PAGEDC_LINK_MODS", "0, 1 or first", "0",
       "the mods compiled as a unit of their own and linked into a kernel compiled once per "
       "shape (1): a new variant compiles in a fraction of the time, the kernel runs slower; "
       "first: linked until the inlined kernel, compiled in the background, is ready (a "
       "shape's first variant: inlined at once)"},
  };
  return infos;
}

std::string kernelOptionNames() {
  std::string names;
  for (const KernelOptionInfo &info : kernelOptionInfos())
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  return names;
}

void setKernelOption(KernelOptions &options, std::string_view name, std::string_view value) {
  KernelOptions changed = options;
  if (!parseOption(changed, name, value, optionLabel(name)))
    throw Error(fmt::format("unknown kernel option '{}': the options are {}", name,
                            kernelOptionNames()));
  options = std::move(changed);
}

void setKernelOption(KernelOptions &options, std::string_view assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string_view::npos || equals == 0)
    throw Error(fmt::format("kernel option '{}' is not NAME=VALUE (names: {})", assignment,
                            kernelOptionNames()));
  setKernelOption(options, assignment.substr(0, equals), assignment.substr(equals + 1));
}

KernelOptions parseKernelOptions(const std::vector<std::string> &assignments) {
  KernelOptions options;
  for (const std::string &assignment : assignments)
    setKernelOption(options, assignment);
  return options;
}

KernelOptions kernelOptionsFromEnvironment() {
  KernelOptions options;
  for (const KernelOptionInfo &info : kernelOptionInfos()) {
    const char *value = env::kernelOptionVariable(info.variable);
    if (value)
      parseOption(options, info.name, value, info.variable);
  }
  checkPairs(options, [](std::string_view name) {
    for (const KernelOptionInfo &info : kernelOptionInfos())
      if (name == info.name)
        return std::string(info.variable);
    return std::string(name);
  });
  return options;
}

void checkKernelOptions(const KernelOptions &options) {
  // The parser's checks again, for fields set on the struct directly.
  if (options.prefillShape && !options.prefillShape->empty())
    checkPrefillShape(*options.prefillShape, optionLabel("prefill_shape"));
  checkInteger(optionLabel("prefill_persistent_ctas"), options.prefillPersistentCtas,
               kPersistentCtasRange);
  checkInteger(optionLabel("decode_split_factor"), options.decodeSplitFactor,
               kDecodeSplitFactorRange);
  checkInteger(optionLabel("decode_splits"), options.decodeSplits, kDecodeSplitsRange);
  if (options.decodeMergeChunks)
    checkMergeChunks(optionLabel("decode_merge_chunks"), *options.decodeMergeChunks,
                     std::to_string(*options.decodeMergeChunks));
  checkPairs(options, [](std::string_view name) { return optionLabel(name); });
}

} // namespace pagedc
