// bf16 rounding of 16 floats at once, for the AVX-512 kernel bodies (fused.cpp's activations, the pair-panel GEMM's
// bf16 epilogue, the prompt attention's probability pairs). Callers are compiled with AVX-512F or more.
#pragma once
#include <immintrin.h>

namespace hk {

// bf16 bits of v's 16 floats in the high halves of the 32-bit lanes, low halves zero: round to nearest even, a NaN
// stays a quiet NaN (f32_to_bf16's rules, bit for bit).
__attribute__((target("avx512f"))) inline __m512i bf16_high16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u)));
}

}  // namespace hk
