//===- CudaLaunch.h - Grid, shared memory and arguments of launches -*- C++ -*-===//
//
// Planning a launch needs no GPU: planAttention() checks the call against
// the kernel's configuration, picks the grid (and the decode split count),
// and packs the argument blocks exactly as cuLaunchKernel takes them. The
// plan is then launched with launchPlan() on a machine with a driver; tests
// without one stop after planning (the "dry run").
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDALAUNCH_H
#define PAGEDC_CUDALAUNCH_H

#include "pagedc/BlockMask.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/KernelArgs.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/KernelSource.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pagedc {

/// One kernel launch, fully described.
struct KernelLaunch {
  std::string kernel;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned sharedMemoryBytes = 0;
  /// Launched with programmatic stream serialization (cuLaunchKernelEx)
  /// when the driver has it: the kernel may be scheduled while the previous
  /// launch drains and waits for it in-kernel (the decode merge on sm_90).
  bool programmaticDependent = false;
  /// Kernel parameters in order, each as the bytes of its value.
  std::vector<std::vector<unsigned char>> arguments;
  /// How the launch copies its data where there is a choice, for reports
  /// (the warpgroup prefill: "tensor maps" or "gather (<why>)").
  std::string note;
  /// cuLaunchKernel's kernelParams: pointers into `arguments`, valid while
  /// this object is alive and unchanged.
  std::vector<void *> parameterPointers();
};

/// The launches of one attention call.
struct AttentionLaunchPlan {
  /// Prefill: one launch. Decode: the split kernel, then the merge kernel
  /// when there is more than one split.
  std::vector<KernelLaunch> launches;
  PagedcAttentionKernelArgs args{};
  /// Dv, the width of out and of the decode partials.
  int headDim = 0;
  /// f32 workspace the decode splits need (0 for prefill or one split):
  /// partial_out [B, Hq, Lq, splits, Dv] then partial_lse [B, Hq, Lq, splits].
  size_t workspaceBytes = 0;
  /// Points the decode partials at a workspace of workspaceBytes at `base`
  /// and repacks the launch arguments.
  void setWorkspace(cu::DevicePointer base);
};

/// Checks `args` (device pointers, strides, sizes; partial_* and
/// num_splits/split_size are filled here) against `config`, chooses the
/// decode split count for `multiprocessors` SMs holding
/// `residentCtasPerSm` decode CTAs each (the driver's occupancy of the
/// kernel) and the longest sequence `maxKvLength`, and packs `params`
/// (pagedc_mods::Params bytes, see ParamsLayout). Throws pagedc::Error
/// naming the first mismatch.
///
/// `maxVisibleKv` bounds the kv span a decode CTA's rows see (the block
/// mask's, decodeVisibleSpan()); negative: maxKvLength. Splits divide that
/// span (templates/Decode.cuh), so a window over a long context gets as many
/// splits as the window needs, not as the context would.
///
/// `options`: the call's kernel options; the plan reads decodeSplitFactor
/// (the launch options are applied afterwards: bindPrefillTensorMaps, ...).
AttentionLaunchPlan planAttention(const KernelConfig &config,
                                  const PagedcAttentionKernelArgs &args,
                                  const std::vector<unsigned char> &params,
                                  int maxKvLength, int multiprocessors,
                                  int residentCtasPerSm = 2, int64_t maxVisibleKv = -1,
                                  const KernelOptions &options = {});

/// The longest kv span (from the first to the last kv block listed, cut at
/// kv_len) that the query rows of one batch entry of a call see in
/// `mask`: the rows of every query head at q positions qOffset[b] ..
/// qOffset[b] + qLength - 1 (qOffset null: 0). An upper bound of what any
/// decode CTA's rows see; 0 when no row sees anything.
int64_t decodeVisibleSpan(const BlockMask &mask, int batch, int headsQ, int qLength,
                          const int32_t *kvLength, const int32_t *qOffset);

/// A decode split plan: `splits` parts of at most `granulesPerSplit`
/// granules each.
struct DecodeSplitChoice {
  int64_t splits = 0;
  int64_t granulesPerSplit = 0;
};

/// What the decode split count is chosen for: a grid of `ctasPerSplit`
/// CTAs per split (batch x KV heads x head chunks), each serving
/// `rowsPerCta` query rows, over `granules` granules of `granuleLength` kv
/// positions (the longest span a CTA's rows see), on `multiprocessors` SMs
/// holding `residentCtasPerSm` decode CTAs each.
struct DecodeSplitProblem {
  int64_t ctasPerSplit = 1;
  int64_t granules = 1;
  int64_t granuleLength = 64;
  int64_t rowsPerCta = 1;
  int headDim = 128;
  int multiprocessors = 1;
  int residentCtasPerSm = 1;
  /// A split covers at most this many granules (0: no limit) ...
  int64_t maxGranulesPerSplit = 0;
  /// ... and, when there are enough, at least this many.
  int64_t minGranulesPerSplit = 1;
  /// The model's split count times this (at most as many splits as
  /// minGranulesPerSplit allows, none empty): an experiment's knob
  /// (KernelOptions::decodeSplitFactor).
  int splitFactor = 1;
  /// When > 0, the split count instead of the model's (kept within the
  /// fewest and most splits above, none empty): an experiment's knob
  /// (KernelOptions::decodeSplits).
  int64_t splits = 0;
};

/// CTAs the decode merge divides each of `rows` rows' `valueDim` columns
/// among (a power of two, each CTA 8 column pairs or more) so that its
/// grid fills the merge CTA slots of `multiprocessors` SMs; 1 when the
/// rows fill them. `asked` > 0 (a power of two, KernelOptions::
/// decodeMergeChunks): that count, halved while above one per 16 columns.
int decodeMergeChunks(int64_t rows, int valueDim, int multiprocessors, int asked = 0);

/// The split count by the performance model's rule (docs/emulator.md): the
/// decode grid's K/V and partial bytes, the merge's, each over the fraction
/// of the device's CTA slots its waves keep busy, and the merge launch; the
/// fewest splits within 1% of the cheapest. No split is left empty.
DecodeSplitChoice chooseDecodeSplits(const DecodeSplitProblem &problem);

/// Pages of at least this many rows are what the warpgroup prefill copies
/// with tensor maps (templates/PrefillWgmma.cuh, kTmaPageRows).
constexpr int kPrefillTmaPageRows = 16;
/// Rows of one run box of the warpgroup prefill (PrefillWgmma.cuh,
/// kRunRows): a KV tile's pages are taken in segments of this many rows
/// (or the tile, if smaller), each one box per 64 head dims when its pages
/// are consecutive.
constexpr int kPrefillRunRows = 64;

/// Sets the ping-pong switch in the warpgroup prefill's third argument
/// (nothing for other kernels); the launch's note ends in ", ping-pong"
/// when on. Kernels with one consumer warpgroup or head dim 256 ignore it.
void setPrefillPingPong(AttentionLaunchPlan &plan, bool on);

/// What KernelOptions::prefillPersistent asks of the warpgroup prefill's
/// grid. Persistent CTAs: a grid of one CTA per resident slot (SMs x
/// resident CTAs, or KernelOptions::prefillPersistentCtas), each taking
/// query tiles one after another (templates/KernelCommon.cuh,
/// next_counted_tile or prefill_round_tile) so that its producer copies the
/// next tile's Q and K/V while the consumers finish the current one.
enum class PrefillPersistence : uint8_t {
  /// Unset: persistent CTAs where the query tiles' heaviest-first
  /// numbering holds (no block mask, or one whose rows' visits grow:
  /// blockMaskVisitsGrow) and there are more tiles than slots; otherwise a
  /// CTA per tile (applyPrefillPersistentRequest).
  Auto,
  /// false: a CTA per query tile.
  Off,
  /// true: persistent CTAs whatever the mask.
  On,
};
/// The persistence `options` ask for.
PrefillPersistence prefillPersistence(const KernelOptions &options);

/// Makes the warpgroup prefill's launch persistent: grid min(ctas, query
/// tiles) instead of one CTA per query tile (nothing for other kernels, or
/// when ctas < 1), and the launch's note gains ", persistent (N CTAs)".
/// The kernel needs no other argument: it walks rounds of gridDim.x tiles.
/// Call it after bindPrefillTensorMaps, which rewrites the note.
void setPrefillPersistent(const KernelConfig &config, AttentionLaunchPlan &plan, int64_t ctas);

/// Gives a persistent warpgroup prefill its work counter: `counter` (a
/// zeroed int32 in device memory that the launches keep at zero between
/// them) in the third argument, and ", tile counter" on the note. Nothing
/// for a launch that is not a persistent warpgroup prefill (its grid holds
/// every query tile) or when counter is 0 (which unbinds it).
void setPrefillTileCounter(const KernelConfig &config, AttentionLaunchPlan &plan,
                           cu::DevicePointer counter);

/// Sets the warpgroup prefill's grid as `options` ask
/// (prefillPersistence): persistent CTAs, setPrefillPersistent with
/// options.prefillPersistentCtas or else `slots` (the device's SMs x
/// resident CTAs), when prefillPersistent is true, or when it is unset,
/// `visitsGrow` (the call has no block mask, or blockMaskVisitsGrow of it)
/// and the launch has more query tiles than `slots`. (Persistent CTAs gain
/// where the tiles are numbered heaviest first, as under causal and
/// sliding-window masks, and lose where they are not, as under document
/// masks: docs/kernels.md has the figures.) Returns whether the grid is
/// persistent. Options that
/// checkKernelOptions refuses (the CTA count without prefillPersistent
/// true) throw pagedc::Error.
bool applyPrefillPersistentRequest(const KernelConfig &config, AttentionLaunchPlan &plan,
                                   int64_t slots, bool visitsGrow,
                                   const KernelOptions &options);

/// Encodes tensor maps of the plan's k_cache and v_cache ([Hkv, kPages or
/// vPages, pageSize, D], the strides of plan.args) with the driver's
/// cuTensorMapEncodeTiled into the warpgroup prefill's third argument and
/// enables them. Returns "" when they are bound, else why the kernel will
/// gather every tile instead (not the warpgroup prefill, pages under
/// kPrefillTmaPageRows rows, head dim 256 with 128-row tiles (two consumer
/// warpgroups), no cuTensorMapEncodeTiled, a layout the
/// tensor-map unit does not take, the driver's refusal); the launch's note
/// says which. With pages under the KV tile it also encodes the run maps
/// (boxes of a whole tile of consecutive pages) unless
/// options.prefillTmaRuns is false; the note then adds ", page runs" (or why
/// not). (Whether to bind them at all is options.prefillTma, which the
/// caller reads: CudaAttentionLaunch::applyLaunchOptions.)
std::string bindPrefillTensorMaps(const CudaDriver &driver, const KernelConfig &config,
                                  AttentionLaunchPlan &plan, int64_t kPages, int64_t vPages,
                                  const KernelOptions &options = {});

/// Pages of at least this many rows are what the decode kernel copies with
/// tensor maps (templates/Decode.cuh, kDecodeTmaPageRows).
constexpr int kDecodeTmaPageRows = 16;
/// Head dims under this the decode kernel always gathers (Decode.cuh,
/// kDecodeTmaMinHeadDim).
constexpr int kDecodeTmaMinHeadDim = 128;

/// The decode split factor `options` ask for (decodeSplitFactor, 1 when
/// unset); out of range throws pagedc::Error.
int decodeSplitFactor(const KernelOptions &options);

/// Encodes tensor maps of the plan's caches (as bindPrefillTensorMaps, boxes
/// of 64 elements x min(pageSize, 64) rows) into the decode kernel's third
/// argument and enables them. Returns "" when they are bound, else why the
/// kernel will gather every tile instead (not the decode kernel, code for
/// an arch before sm_90 (`arch`: the kernel's), pages under
/// kDecodeTmaPageRows rows, head dims under kDecodeTmaMinHeadDim, no
/// cuTensorMapEncodeTiled, a layout the
/// tensor-map unit does not take, the driver's refusal); the launch's note
/// says which. With pages under 64 rows it also encodes the run maps
/// unless options.decodeTmaRuns is false (note: ", page runs").
std::string bindDecodeTensorMaps(const CudaDriver &driver, const KernelConfig &config,
                                 const std::string &arch, AttentionLaunchPlan &plan,
                                 int64_t kPages, int64_t vPages,
                                 const KernelOptions &options = {});

/// Applies the launch options of `options` to a planned call, as
/// CudaAttentionLaunch::applyLaunchOptions does for the runtime: the copy
/// path first (tensor maps where options.prefillTma / decodeTma allow them,
/// bound through `driver` by bindPrefillTensorMaps / bindDecodeTensorMaps
/// for caches of `kPages` and `vPages` pages and code for `arch`; else the
/// note "gather (prefill_tma=0)" or "gather (decode_tma=0)"); then, for the
/// warpgroup prefill, its grid (applyPrefillPersistentRequest over `slots`,
/// `visitsGrow`), the work counter `tileCounter()` returns where the grid is
/// persistent and options.prefillTileCounter allows one
/// (setPrefillTileCounter), and ping-pong (setPrefillPingPong). `driver`
/// null plans without a device: the maps are left unbound (their note
/// "gather (tensor maps not bound)"). Returns the main launch's note, or ""
/// for a kernel without launch options (the mma.sync prefill).
std::string applyKernelOptions(const CudaDriver *driver, const KernelConfig &config,
                               const std::string &arch, AttentionLaunchPlan &plan,
                               int64_t kPages, int64_t vPages, int64_t slots, bool visitsGrow,
                               const KernelOptions &options,
                               const std::function<cu::DevicePointer()> &tileCounter);

/// The block-mask builder's launch: grid (num_q_blocks, heads, batch).
KernelLaunch planBlockMaskBuild(const PagedcBlockMaskKernelArgs &args,
                                const std::vector<unsigned char> &params);

/// Launches `launch` on `stream` (`function` from the kernel's module).
void launchKernel(const CudaDriver &driver, cu::Function function,
                  KernelLaunch &launch, cu::Stream stream);

} // namespace pagedc

#endif // PAGEDC_CUDALAUNCH_H
