//===- Hooks.cuh - The boundary between generated mods and kernels -*- CUDA -*-===//
//
// One CUDA translation unit is assembled (pagedc::assembleKernel) as:
//
//   1. Prelude.cuh + KernelArgs.h        fixed: integer types, pagedc_f16 /
//                                        pagedc_bf16, pagedc::tanh_approx,
//                                        to_float,
//                                        the kernels' argument structs
//   2. generated mod code                from the compiler (below)
//   3. Hooks.cuh (this file)             checks the hooks' exact signatures
//   4. namespace pagedc_config { ... }   configuration constexprs, emitted by
//                                        assembleKernel from a KernelConfig
//   5. KernelCommon.cuh + one kernel     Prefill.cuh, Decode.cuh or
//                                        BlockMaskBuilder.cuh
//
// The generated code defines, in namespace pagedc_mods:
//
//   struct Params {
//     // one field per runtime param, in declaration order:
//     //   float (f32) | int32_t (i32) | bool (bool)
//     // then one group per buffer, in declaration order:
//     //   const T *NAME; int64_t NAME_stride[RANK]; int64_t NAME_size[RANK];
//     // (sizes: the generated reads give 0 for an index outside them)
//     // T: float, int32_t, bool, pagedc_f16, pagedc_bf16
//   };
//   constexpr bool kHasMask = ...;   // false: mask() is never called
//   constexpr bool kHasScore = ...;  // false: score() is never called
//   struct MaskRow  { ... };  // mask values that do not depend on kv
//   struct ScoreRow { ... };  // score values that do not depend on kv
//   __device__ __forceinline__ MaskRow mask_row(const Params &, int b, int h,
//                                               int q);
//   __device__ __forceinline__ bool mask(const Params &, const MaskRow &,
//                                        int b, int h, int q, int kv);
//   struct MaskCol  { ... };  // mask values read from buffers by kv alone
//   __device__ __forceinline__ MaskCol mask_col(const Params &, int kv);
//   __device__ __forceinline__ bool mask_at(const Params &, const MaskRow &,
//                                           const MaskCol &, int b, int h,
//                                           int q, int kv);
//   __device__ __forceinline__ ScoreRow score_row(const Params &, int b,
//                                                 int h, int q);
//   __device__ __forceinline__ float score(const Params &, const ScoreRow &,
//                                          float s, int b, int h, int q,
//                                          int kv);
//
// mask_at(p, row, mask_col(p, kv), b, h, q, kv) == mask(p, row, b, h, q, kv):
// a kernel whose thread holds several rows of one key (apply_mods) reads a
// mask's key-only values, such as `document_id[kv]`, once per key. Hook sets
// written by hand define the column hooks with PAGEDC_MASK_COL_UNSPLIT()
// (Prelude.cuh): an empty MaskCol and mask_at calling mask.
//
// When a mod is absent the generator still emits the functions (empty row
// and column structs, mask returning true, score returning s) and sets the
// flag to false. Indices are LOGICAL: b is the call's batch index, h the
// query head, q = q_offset[b] + row, kv the logical key position. `s` is the
// scaled logit scale * q.k. The kernels call *_row once per query row they
// own and the per-element functions only inside `if constexpr (kHas*)`.
//
// The host packs Params with C layout rules (each field at the next multiple
// of its alignment: bool 1, int32_t/float 4, pointers and int64_t 8; total
// size a multiple of the largest alignment); pagedc::ParamsLayout computes
// it, and KernelConfig::paramsSize makes the TU static_assert the size.
// An empty Params (no params, no buffers) is allowed.
//
//===----------------------------------------------------------------------===//

namespace pagedc_hooks_check {
using namespace pagedc_mods;
using pagedc::is_same;
// Each fails to compile, naming the hook, when the generated code does not
// match the contract above.
static_assert(is_same<decltype(kHasMask), const bool>::value,
              "pagedc_mods::kHasMask must be a constexpr bool");
static_assert(is_same<decltype(kHasScore), const bool>::value,
              "pagedc_mods::kHasScore must be a constexpr bool");
static_assert(is_same<decltype(&mask_row),
                      MaskRow (*)(const Params &, int, int, int)>::value,
              "pagedc_mods::mask_row must be "
              "MaskRow mask_row(const Params &, int b, int h, int q)");
static_assert(is_same<decltype(&mask), bool (*)(const Params &, const MaskRow &,
                                                int, int, int, int)>::value,
              "pagedc_mods::mask must be bool mask(const Params &, const "
              "MaskRow &, int b, int h, int q, int kv)");
static_assert(is_same<decltype(&mask_col), MaskCol (*)(const Params &, int)>::value,
              "pagedc_mods::mask_col must be MaskCol mask_col(const Params &, int kv)");
static_assert(is_same<decltype(&mask_at), bool (*)(const Params &, const MaskRow &,
                                                   const MaskCol &, int, int, int, int)>::value,
              "pagedc_mods::mask_at must be bool mask_at(const Params &, const "
              "MaskRow &, const MaskCol &, int b, int h, int q, int kv)");
static_assert(is_same<decltype(&score_row),
                      ScoreRow (*)(const Params &, int, int, int)>::value,
              "pagedc_mods::score_row must be "
              "ScoreRow score_row(const Params &, int b, int h, int q)");
static_assert(is_same<decltype(&score),
                      float (*)(const Params &, const ScoreRow &, float, int,
                                int, int, int)>::value,
              "pagedc_mods::score must be float score(const Params &, const "
              "ScoreRow &, float s, int b, int h, int q, int kv)");
} // namespace pagedc_hooks_check
