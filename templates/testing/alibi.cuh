// Hand-written test mod in the generator's form (causal + ALiBi):
//   buffer slopes: f32[H]
//   mask causal(b, h, q, kv) = q >= kv
//   score alibi(s, b, h, q, kv) = s + slopes[h] * (kv - q)
namespace pagedc_mods {
struct Params {
  const float *slopes;
  int64_t slopes_stride[1];
};
constexpr bool kHasMask = true;
constexpr bool kHasScore = true;
struct MaskRow {
  int32_t q;
};
__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int q) {
  return {q};
}
__device__ __forceinline__ bool mask(const Params &, const MaskRow &row, int,
                                     int, int, int kv) {
  return row.q >= kv;
}
struct ScoreRow {
  float slope;
  int32_t q;
};
__device__ __forceinline__ ScoreRow score_row(const Params &p, int, int h,
                                              int q) {
  return {p.slopes[h * p.slopes_stride[0]], q};
}
__device__ __forceinline__ float score(const Params &, const ScoreRow &row,
                                       float s, int, int, int, int kv) {
  return s + row.slope * static_cast<float>(kv - row.q);
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
