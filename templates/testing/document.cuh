// Hand-written test mod in the generator's form (document mask):
//   buffer doc: i32[B, S]
//   mask document(b, h, q, kv) = doc[b, q] == doc[b, kv] && q >= kv
namespace pagedc_mods {
struct Params {
  const int32_t *doc;
  int64_t doc_stride[2];
};
constexpr bool kHasMask = true;
constexpr bool kHasScore = false;
struct MaskRow {
  const int32_t *docRow;
  int32_t docOfQ;
  int32_t q;
};
__device__ __forceinline__ MaskRow mask_row(const Params &p, int b, int,
                                            int q) {
  const int32_t *docRow = p.doc + b * p.doc_stride[0];
  return {docRow, docRow[q * p.doc_stride[1]], q};
}
__device__ __forceinline__ bool mask(const Params &p, const MaskRow &row, int,
                                     int, int, int kv) {
  return row.docRow[kv * p.doc_stride[1]] == row.docOfQ && row.q >= kv;
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
