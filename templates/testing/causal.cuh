// Hand-written test mod in the generator's form:
//   mask causal(b, h, q, kv) = q >= kv
namespace pagedc_mods {
struct Params {};
constexpr bool kHasMask = true;
constexpr bool kHasScore = false;
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
struct ScoreRow {};
__device__ __forceinline__ ScoreRow score_row(const Params &, int, int, int) {
  return {};
}
__device__ __forceinline__ float score(const Params &, const ScoreRow &,
                                       float s, int, int, int, int) {
  return s;
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
