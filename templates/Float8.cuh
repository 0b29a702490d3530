//===- Float8.cuh - 8-bit float K/V elements to f16 -------------*- CUDA -*-===//
//
// Conversions of 8-bit float cache elements (OCP e4m3fn and e5m2) to f16,
// the way PTX's cvt.rn.f16x2.e4m3x2 / cvt.rn.f16x2.e5m2x2 convert them:
// every finite code is exact in f16, e5m2's infinities stay infinities, and
// every NaN code becomes the canonical f16 NaN 0x7fff (sign dropped). Code
// for sm_89 and later uses the instructions; other targets and the emulator
// use the integer form below, which is the one cuda_fp8.hpp documents for
// the instructions (__nv_cvt_fp8_to_halfraw), so every target agrees bit for
// bit. Self-contained (it needs no configuration), so that a test unit can
// hold it alone.
//
//===----------------------------------------------------------------------===//

namespace pagedc {

/// Formats of 8-bit float K/V elements (pagedc_config::kKvFloat8; 0: the
/// cache holds the kernel's element type).
constexpr int kFloat8E4M3 = 1;
constexpr int kFloat8E5M2 = 2;

/// The f16 bit pattern of 8-bit float `code` (the low 8 bits) of `kFormat`
/// (kFloat8E5M2, else e4m3).
template <int kFormat> __device__ __forceinline__ uint32_t float8_to_half_bits(uint32_t code) {
  const uint32_t bits = (code & 0xffu) << 8;
  if constexpr (kFormat == kFloat8E5M2) {
    // The top byte of the f16 with the same value; NaN payloads go.
    return (bits & 0x7fffu) > 0x7c00u ? 0x7fffu : bits;
  } else {
    if ((code & 0x7fu) == 0x7fu)
      return 0x7fffu;
    const uint32_t sign = bits & 0x8000u;
    // Exponent bias 7 -> 15; mantissa 3 bits -> 10.
    uint32_t exponent = ((bits & 0x7800u) >> 1) + 0x2000u;
    uint32_t mantissa = (bits & 0x0700u) >> 1;
    if (exponent == 0x2000u) {
      if (mantissa == 0u)
        return sign; // +-0
      // A subnormal e4m3 (m x 2^-9) is a normal f16: shift the mantissa's
      // leading one to the implicit bit (1 to 3 places; m is 1..7).
      const uint32_t shift = mantissa >= 0x200u ? 1u : mantissa >= 0x100u ? 2u : 3u;
      mantissa = (mantissa << shift) & 0x3ffu;
      exponent -= (shift - 1u) << 10;
    }
    return sign | exponent | mantissa;
  }
}

/// Two 8-bit float codes (`codes`' low byte -> the low half) as two f16 in
/// one register: cvt.rn.f16x2.{e4m3x2,e5m2x2}.
template <int kFormat> __device__ __forceinline__ uint32_t float8x2_to_half2(uint32_t codes) {
#if !defined(PAGEDC_EMULATOR) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t halves;
  const unsigned short pair = static_cast<unsigned short>(codes);
  if constexpr (kFormat == kFloat8E5M2)
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(halves) : "h"(pair));
  else
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
  return halves;
#else
  return float8_to_half_bits<kFormat>(codes) | (float8_to_half_bits<kFormat>(codes >> 8) << 16);
#endif
}

/// cvt.f32.f16 of the low half of `half` (exact).
__device__ __forceinline__ float half_bits_to_float(uint32_t half) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::half_to_float(static_cast<uint16_t>(half));
#else
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<unsigned short>(half)));
  return value;
#endif
}

/// Two 8-bit float codes as two 16-bit elements in one register (the low
/// code in the low half): f16, or bf16 when kToBF16. Every code's value is
/// exact in both (at most 3 mantissa bits; e5m2's smallest, 2^-16, is a
/// bf16 normal), so the bf16 pattern is the top half of the f32's, NaN
/// included (0x7fff).
template <int kFormat, bool kToBF16>
__device__ __forceinline__ uint32_t float8x2_to_elements(uint32_t codes) {
  const uint32_t halves = float8x2_to_half2<kFormat>(codes);
  if constexpr (!kToBF16) {
    return halves;
  } else {
    const uint32_t lo = __float_as_uint(half_bits_to_float(halves & 0xffffu)) >> 16;
    const uint32_t hi = __float_as_uint(half_bits_to_float(halves >> 16)) >> 16;
    return lo | (hi << 16);
  }
}

} // namespace pagedc
