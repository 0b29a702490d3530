//===- KernelOptions.h - Settings of the CUDA kernels of a call -*- C++ -*-===//
//
// KernelOptions says which CUDA kernel a flexAttention() call runs and how
// it is launched (AttentionOptions::kernel). Every field is optional: unset,
// the runtime decides, which is what a call that sets nothing gets. The
// runtime reads these settings from the call alone, never from the process
// environment, so that two callers in one process cannot change each
// other's kernels.
//
// Text settings ("prefill_tma=0") go through one parser, setKernelOption;
// kernelOptionsFromEnvironment() maps the former $PAGEDC_* variables onto
// the struct through it, for command-line tools and test binaries to call at
// their edge (the library itself never calls it).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_KERNELOPTIONS_H
#define PAGEDC_KERNELOPTIONS_H

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedc {

/// How a kernel compiled from mod code gets its mods (KernelOptions::linkMods).
enum class ModLinking : unsigned char {
  /// Inlined into the kernel: a whole kernel compile per mod variant.
  Inline,
  /// From a unit of their own, linked into a kernel compiled once per shape
  /// (KernelConfig::linkedMods): a new variant compiles in a fraction of the
  /// time, the kernel runs slower.
  Linked,
  /// Linked for the calls made while the inlined kernel compiles on a
  /// background thread, inlined from the first call after it is ready. A
  /// shape's first variant waits for its inlined kernel instead (its linked
  /// kernel would wait as long for the shape's unit), which is then built
  /// in the background for the variants that follow.
  LinkedFirst,
};

/// The kernel choices of one call. The text name of each field (for
/// setKernelOption, `pagedc run --kernel-option` and Python's
/// kernel_options) and the environment variable the tools map onto it are
/// given in brackets.
struct KernelOptions {
  /// [prefill_shape, $PAGEDC_PREFILL_SHAPE] The prefill tile instead of the
  /// one the runtime picks for the target (KernelConfig::choosePrefillShape):
  /// a comma-separated list of MxNxW entries (query rows x KV rows per tile x
  /// query rows per warp, or per warpgroup with W 64, e.g. 64x64x16), each
  /// with an optional suffix "r" (the mods' row values recomputed per KV
  /// tile) or, with W 64, "sK" (at most K = 2, 3 or 4 K/V stages) and then
  /// "c2" (two CTAs an SM; M 64, head dims 64 and 128), and optionally
  /// prefixed "dD=" to apply at head dim D alone ("dD=" with no
  /// shape keeps the default there); an entry without a prefix applies at
  /// the other head dims, e.g. "128x128x64,d256=128x64x64". A tile asked
  /// for is compiled as asked, never narrowed because ptxas reports spills.
  std::optional<std::string> prefillShape;
  /// [prefill_persistent, $PAGEDC_PREFILL_PERSISTENT] The warpgroup
  /// prefill's grid: true, persistent CTAs (one per resident slot, each
  /// taking query tiles one after another) under every mask; false, a CTA
  /// per query tile; unset, persistent CTAs where the tiles' heaviest-first
  /// numbering holds (no block mask, or one whose rows' visits grow) and
  /// the tiles outnumber the slots.
  std::optional<bool> prefillPersistent;
  /// [prefill_persistent_ctas, $PAGEDC_PREFILL_PERSISTENT_CTAS] At most this
  /// many persistent CTAs (1 to 2^20) instead of one per resident slot;
  /// only with prefillPersistent true.
  std::optional<int> prefillPersistentCtas;
  /// [prefill_tile_counter, $PAGEDC_PREFILL_TILE_COUNTER] Whether persistent
  /// CTAs take their tiles from a work counter (the next tile of the
  /// heaviest-first order when a CTA is free; unset: yes) rather than in
  /// fixed snaking rounds; not with prefillPersistent false.
  std::optional<bool> prefillTileCounter;
  /// [prefill_tma, $PAGEDC_PREFILL_TMA] Whether the warpgroup prefill copies
  /// K/V pages of 16 rows or more with tensor maps (unset: yes) rather than
  /// gathering every tile with cp.async.
  std::optional<bool> prefillTma;
  /// [prefill_tma_runs, $PAGEDC_PREFILL_TMA_RUNS] Whether the warpgroup
  /// prefill copies a run of consecutive pages with one tensor-map box per
  /// segment of a tile (unset: yes) rather than one box per page.
  std::optional<bool> prefillTmaRuns;
  /// [prefill_pingpong, $PAGEDC_PREFILL_PINGPONG] Whether the warpgroup
  /// prefill's two consumer warpgroups take turns issuing their wgmmas
  /// (unset: no).
  std::optional<bool> prefillPingPong;
  /// [decode_split_factor, $PAGEDC_DECODE_SPLIT_FACTOR] A decode gets this
  /// many times (1 to 16) the KV splits the performance model chooses
  /// (unset: 1).
  std::optional<int> decodeSplitFactor;
  /// [decode_splits, $PAGEDC_DECODE_SPLITS] The decode's split count (1 to
  /// 1024) instead of the performance model's, kept within what the call
  /// allows (a block mask's blocks a split; no split shorter than the
  /// planner's least, none empty); not with decode_split_factor (unset: the
  /// model's). flexAttention's CUDA calls; BatchAttention plans its own.
  std::optional<int> decodeSplits;
  /// [decode_merge_chunks, $PAGEDC_DECODE_MERGE_CHUNKS] The CTAs among which
  /// a split decode's merge divides each query row's columns: 1, 2, 4, 8 or
  /// 16, at most one per 16 columns (unset: as many as the merge's slots
  /// take for few rows, decodeMergeChunks). A packed batch's merge keeps one
  /// CTA per row.
  std::optional<int> decodeMergeChunks;
  /// [decode_tma, $PAGEDC_DECODE_TMA] Whether the decode kernel (code for
  /// sm_90 and later) copies K/V tiles with tensor maps (unset: yes) rather
  /// than gathering them with cp.async.
  std::optional<bool> decodeTma;
  /// [decode_tma_runs, $PAGEDC_DECODE_TMA_RUNS] Whether the decode kernel
  /// copies a tile of consecutive pages with one box per 64 head dims
  /// (unset: yes) rather than one box per page.
  std::optional<bool> decodeTmaRuns;
  /// [link_mods, $PAGEDC_LINK_MODS] How kernels compiled from mod code take
  /// their mods: "0" inlined (unset: so), "1" from a unit of their own
  /// linked into a kernel compiled once per shape and per which mods are
  /// present (KernelConfig::linkedMods), "first" linked until the inlined
  /// kernel, compiled in the background, is ready, except for a shape's
  /// first variant (ModLinking). Linked, a
  /// new mod variant costs its small unit and a link instead of a whole
  /// kernel compile (docs/kernels.md, "Linked mods"), but the kernel calls
  /// the mods instead of inlining them and runs slower. flexAttention's
  /// CUDA calls take all three; BatchAttention ignores it, and a kernel
  /// bundle holds the kernels it was built with.
  std::optional<ModLinking> linkMods;

  /// Whether linkMods asks for kernels with linked mods (1 or first).
  bool linksMods() const { return linkMods.value_or(ModLinking::Inline) != ModLinking::Inline; }

  bool operator==(const KernelOptions &other) const;
  bool operator!=(const KernelOptions &other) const { return !(*this == other); }
};

/// One text setting of KernelOptions: its name, the environment variable
/// the tools map onto it, the values it takes and what it changes.
struct KernelOptionInfo {
  const char *name;     ///< "prefill_tma"
  const char *variable; ///< "PAGEDC_PREFILL_TMA"
  const char *values;   ///< "0 or 1"
  const char *unset;    ///< what the runtime does when it is not set
  const char *help;     ///< what it changes
};

/// Every text setting, in KernelOptions's order.
const std::vector<KernelOptionInfo> &kernelOptionInfos();

/// "prefill_shape, prefill_persistent, ...": the valid names, for messages.
std::string kernelOptionNames();

/// Sets option `name` of `options` from `value` (the text the field's
/// comment describes; "" unsets it: the runtime decides). An unknown name
/// throws pagedc::Error listing the valid names; a value that does not
/// parse or is out of range throws pagedc::Error naming the option and the
/// values it takes. `options` is unchanged when it throws.
void setKernelOption(KernelOptions &options, std::string_view name, std::string_view value);

/// setKernelOption of "NAME=VALUE"; text without "=" throws pagedc::Error.
void setKernelOption(KernelOptions &options, std::string_view assignment);

/// KernelOptions of a list of "NAME=VALUE" settings, later ones winning;
/// throws as setKernelOption.
KernelOptions parseKernelOptions(const std::vector<std::string> &assignments);

/// The settings the former environment variables ask for: each
/// $PAGEDC_* variable of kernelOptionInfos() that is set and not empty,
/// parsed as setKernelOption parses its option (an error names the
/// variable). For command-line tools and test binaries, which keep the
/// variables working at their edge; the runtime never reads them.
KernelOptions kernelOptionsFromEnvironment();

/// Checks settings made on the struct directly as the parser checks text:
/// prefillShape's syntax, the ranges of prefillPersistentCtas and
/// decodeSplitFactor, and the settings that depend on each other
/// (prefillPersistentCtas without prefillPersistent true, prefillTileCounter
/// with prefillPersistent false). Throws pagedc::Error naming the options.
/// The CUDA path calls it before any work.
void checkKernelOptions(const KernelOptions &options);

} // namespace pagedc

#endif // PAGEDC_KERNELOPTIONS_H
