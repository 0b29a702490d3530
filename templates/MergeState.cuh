//===- MergeState.cuh - Attention states merged by their lse -*- CUDA -*-===//
//
// pagedc_merge_state combines partial attention results over disjoint key
// sets of the same query rows (mergeState, mergeStates): with L the
// logsumexp of the parts' lse, out = sum_i exp(lse_i - L) v_i and lse = L;
// a row whose parts are all -inf gets out 0 and lse -inf, and a -inf part
// is skipped (its values are never read, so they may be anything).
//
// The unit needs no mod code: Prelude.cuh, KernelArgs.h, then this file.
// Element types are arguments (f32, f16, bf16 for each source and the
// output), so one image serves every call.
//
// Grid: (tokens, heads); block: kMergeThreads threads, each over the
// columns d = threadIdx.x + k * kMergeThreads of the row. A thread reads
// every part's value in its columns before it writes them, and the lse is
// written after a barrier that follows every thread's read of the parts'
// lse, so the output may alias one part exactly (mergeStateInPlace).
//
//===----------------------------------------------------------------------===//

namespace pagedc_merge {

constexpr int kMergeThreads = 64;

PAGEDC_DEVICE float load(const void *base, int type, int64_t offset) {
  if (type == 1)
    return pagedc::to_float(static_cast<const pagedc_f16 *>(base)[offset]);
  if (type == 2)
    return pagedc::to_float(static_cast<const pagedc_bf16 *>(base)[offset]);
  return static_cast<const float *>(base)[offset];
}

PAGEDC_DEVICE void store(void *base, int type, int64_t offset, float value) {
  if (type == 0) {
    static_cast<float *>(base)[offset] = value;
    return;
  }
  uint16_t bits;
#ifdef PAGEDC_EMULATOR
  bits = type == 2 ? pagedc_emu::float_to_bf16(value) : pagedc_emu::float_to_half(value);
#else
  if (type == 2)
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
#endif
  static_cast<uint16_t *>(base)[offset] = bits;
}

} // namespace pagedc_merge

extern "C" __global__ void __launch_bounds__(pagedc_merge::kMergeThreads)
    pagedc_merge_state(const __grid_constant__ PagedcMergeStateArgs args) {
  using namespace pagedc_merge;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const float negative_infinity = -pagedc::infinity();
  float row_max = negative_infinity;
  for (int source = 0; source < 2; ++source) {
    const float *s = args.s[source] + t * args.s_stride[source][0] + h * args.s_stride[source][2];
    for (int part = 0; part < args.parts[source]; ++part)
      row_max = fmaxf(row_max, s[part * args.s_stride[source][1]]);
  }
  float total = 0.0f;
  if (row_max != negative_infinity) {
    for (int source = 0; source < 2; ++source) {
      const float *s = args.s[source] + t * args.s_stride[source][0] + h * args.s_stride[source][2];
      for (int part = 0; part < args.parts[source]; ++part)
        total += expf(s[part * args.s_stride[source][1]] - row_max);
    }
  }
  const float lse = row_max == negative_infinity ? negative_infinity : row_max + logf(total);
  for (int d = threadIdx.x; d < args.dim; d += kMergeThreads) {
    float value = 0.0f;
    for (int source = 0; source < 2 && row_max != negative_infinity; ++source) {
      const float *s = args.s[source] + t * args.s_stride[source][0] + h * args.s_stride[source][2];
      const int64_t row = t * args.v_stride[source][0] + h * args.v_stride[source][2] +
                          d * args.v_stride[source][3];
      for (int part = 0; part < args.parts[source]; ++part) {
        const float part_lse = s[part * args.s_stride[source][1]];
        if (part_lse == negative_infinity)
          continue;
        value += expf(part_lse - lse) *
                 load(args.v[source], args.value_type[source],
                      row + part * args.v_stride[source][1]);
      }
    }
    store(args.v_out, args.out_type,
          t * args.v_out_stride[0] + h * args.v_out_stride[1] + d * args.v_out_stride[2], value);
  }
  // Every thread has read the parts' lse before the row's lse is written
  // over the one it may alias.
  __syncthreads();
  if (threadIdx.x == 0)
    args.s_out[t * args.s_out_stride[0] + h * args.s_out_stride[1]] = lse;
}
