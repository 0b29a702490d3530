// Hand-written test mod in the generator's form: no mask mod, no score mod.
namespace pagedc_mods {
struct Params {};
constexpr bool kHasMask = false;
constexpr bool kHasScore = false;
struct MaskRow {};
struct ScoreRow {};
__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int) {
  return {};
}
__device__ __forceinline__ bool mask(const Params &, const MaskRow &, int, int,
                                     int, int) {
  return true;
}
__device__ __forceinline__ ScoreRow score_row(const Params &, int, int, int) {
  return {};
}
__device__ __forceinline__ float score(const Params &, const ScoreRow &,
                                       float s, int, int, int, int) {
  return s;
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
