// Hand-written test mod in the generator's form (sliding window + softcap):
//   param window: i32 = 4096
//   param cap: f32 = 30.0
//   mask sliding(b, h, q, kv) = q >= kv && q - kv < window
//   score softcap(s, b, h, q, kv) = cap * tanh_approx(s / cap)
namespace pagedc_mods {
struct Params {
  int32_t window;
  float cap;
};
constexpr bool kHasMask = true;
constexpr bool kHasScore = true;
struct MaskRow {
  int32_t q;
  int32_t window;
};
__device__ __forceinline__ MaskRow mask_row(const Params &p, int, int, int q) {
  return {q, p.window};
}
__device__ __forceinline__ bool mask(const Params &, const MaskRow &row, int,
                                     int, int, int kv) {
  return row.q >= kv && row.q - kv < row.window;
}
struct ScoreRow {
  float cap;
  float inverseCap;
};
__device__ __forceinline__ ScoreRow score_row(const Params &p, int, int, int) {
  return {p.cap, 1.0f / p.cap};
}
__device__ __forceinline__ float score(const Params &, const ScoreRow &row,
                                       float s, int, int, int, int) {
  return row.cap * pagedc::tanh_approx(s * row.inverseCap);
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
