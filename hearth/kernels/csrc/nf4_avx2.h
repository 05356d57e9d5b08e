// The codebook kernels' AVX2 bodies (nf4.cpp includes this inside its anonymous namespace, after Nf4 and
// prefetch_next): the linear on fp32 x and the dequantization, for CPUs without AVX-512.
//
// The 16 codebook values sit in two ymm registers (entries 0-7 and 8-15); vpermps looks a code up in both (it reads
// an index's low 3 bits) and a blend on the code's bit 3 picks the half. Each looked-up value is multiplied by its
// block's absmax, which gives exactly the reference's fp32 weight (codebook[code] * absmax), so the linear differs
// from the reference only in the order its fp32 products are summed.
#pragma once

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

// The codebook values of 8 codes, idx: one code per 32-bit lane in bits 0-2 (higher bits ignored), sel: the code's
// bit 3 in the lane's sign bit.
inline __m256 lookup8(__m256i idx, __m256i sel, __m256 lut_lo, __m256 lut_hi) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lut_lo, idx), _mm256_permutevar8x32_ps(lut_hi, idx),
                          _mm256_castsi256_ps(sel));
}

// 8 code bytes of a 32-weight run (bytes h*8 .. h*8+7 of its 16) -> the values of weights h*8 .. h*8+7 (lo: the low
// nibbles) and 16 + h*8 .. 16 + h*8+7 (hi: the high nibbles), in hearth's int4 order.
inline void decode16_avx2(const uint8_t* p, __m256 lut_lo, __m256 lut_hi, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  lo = lookup8(v, _mm256_slli_epi32(v, 28), lut_lo, lut_hi);
  hi = lookup8(_mm256_srli_epi32(v, 4), _mm256_slli_epi32(v, 24), lut_lo, lut_hi);
}

// MB rows of x (at x, stride ldx) against NB weight rows from n -> out (stride ldo). Each decoded weight vector is
// scaled once and dotted with every row of x; one row of x keeps two chains per weight row (lo / hi halves).
template <int MB, int NB>
void tile_avx2(const Nf4& p, const float* x, int64_t ldx, int64_t n, float* out, int64_t ldo, const float* bias) {
  constexpr int A = MB == 1 ? 2 : 1;
  const __m256 lut_lo = _mm256_loadu_ps(p.codebook), lut_hi = _mm256_loadu_ps(p.codebook + 8);
  __m256 acc[MB][NB][A];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j)
      for (int a = 0; a < A; ++a) acc[m][j][a] = _mm256_setzero_ps();
  const int64_t blocks = p.K / p.group;
  for (int64_t g = 0; g < blocks; ++g) {
    __m256 s[NB];
    for (int j = 0; j < NB; ++j) s[j] = _mm256_set1_ps(p.absmax[(n + j) * p.ldg + g]);
    for (int64_t k = g * p.group; k < (g + 1) * p.group; k += 32) {
      if (!(k & 127)) prefetch_next<NB>(p, n, k);
      for (int h = 0; h < 2; ++h) {
        for (int j = 0; j < NB; ++j) {
          __m256 lo, hi;
          decode16_avx2(p.w + (n + j) * p.ldw + k / 2 + 8 * h, lut_lo, lut_hi, lo, hi);
          lo = _mm256_mul_ps(lo, s[j]);
          hi = _mm256_mul_ps(hi, s[j]);
          for (int m = 0; m < MB; ++m) {
            const float* xm = x + m * ldx + k + 8 * h;
            acc[m][j][0] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xm), acc[m][j][0]);
            acc[m][j][A - 1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xm + 16), acc[m][j][A - 1]);
          }
        }
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) {
      const __m256 t = A == 2 ? _mm256_add_ps(acc[m][j][0], acc[m][j][A - 1]) : acc[m][j][0];
      out[m * ldo + n + j] = hk::hsum8(t) + (bias ? bias[n + j] : 0.0f);
    }
}

// 16 registers: one row of x against 4 weight rows (8 accumulators); 2-4 rows against 2 (at most 8).
template <int MB>
void rows_mb_avx2(const Nf4& p, const float* x, int64_t ldx, int64_t n0, int64_t n1, float* out, int64_t ldo,
                  const float* bias) {
  constexpr int NB = MB == 1 ? 4 : 2;
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) tile_avx2<MB, NB>(p, x, ldx, n, out, ldo, bias);
  for (; n < n1; ++n) tile_avx2<MB, 1>(p, x, ldx, n, out, ldo, bias);
}

// linear_rows (nf4.cpp) on AVX2: rows of x 4 at a time over weight-row slices that stay in cache between passes.
void linear_rows_avx2(const Nf4& p, const float* x, int64_t ldx, int64_t M, int64_t n0, int64_t n1, float* out,
                      int64_t ldo, const float* bias) {
  const int64_t slice = std::max<int64_t>(4, (int64_t(256) << 10) / std::max<int64_t>(1, p.K / 2) / 4 * 4);
  for (int64_t s0 = n0; s0 < n1; s0 += slice) {
    const int64_t s1 = std::min(n1, s0 + slice);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows_mb_avx2<4>(p, x + m * ldx, ldx, s0, s1, out + m * ldo, ldo, bias);
    const float* xm = x + m * ldx;
    float* om = out + m * ldo;
    switch (M - m) {
      case 3: rows_mb_avx2<3>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 2: rows_mb_avx2<2>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 1: rows_mb_avx2<1>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      default: break;
    }
  }
}

// Rows [n0, n1) of w -> out [n1 - n0][K], fp32 or bf16 (torch's rounding: the products are finite).
void dequant_rows_avx2(const Nf4& p, int64_t n0, int64_t n1, void* out, int out_bf16) {
  const __m256 lut_lo = _mm256_loadu_ps(p.codebook), lut_hi = _mm256_loadu_ps(p.codebook + 8);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < p.K; k += 32) {
      const __m256 s = _mm256_set1_ps(p.absmax[n * p.ldg + k / p.group]);
      for (int h = 0; h < 2; ++h) {
        __m256 lo, hi;
        decode16_avx2(p.w + n * p.ldw + k / 2 + 8 * h, lut_lo, lut_hi, lo, hi);
        const __m256 v[2] = {_mm256_mul_ps(lo, s), _mm256_mul_ps(hi, s)};
        for (int half = 0; half < 2; ++half) {
          const int64_t at = (n - n0) * p.K + k + 16 * half + 8 * h;
          if (!out_bf16) {
            _mm256_storeu_ps(static_cast<float*>(out) + at, v[half]);
            continue;
          }
          // the 8 bf16 in the high halves, shifted down and packed (packus per 128-bit lane, then lanes 0 and 2)
          const __m256i b = _mm256_srli_epi32(hk::bf16_high8(v[half]), 16);
          const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + at),
                           _mm256_castsi256_si128(packed));
        }
      }
    }
  }
}

#pragma GCC pop_options
