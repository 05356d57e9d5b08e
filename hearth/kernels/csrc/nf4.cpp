// 4-bit codebook weights (bitsandbytes NF4 / FP4): w[n][k] = codebook[code] * absmax[n][k / group].
//
// Layout (hearth/weights/layouts.py, row "nf4"): codes uint8 [N][K / 2] in hearth's int4 order (per 32 weights, byte
// j = code[j] | code[j + 16] << 4), absmax fp32 [N][K / group] (row stride ldg), codebook fp32 [16]. group: a multiple
// of 32 dividing K.
//
// hk_family::codebook (hk_linear on a codebook weight): out[m][n] = sum_k x[m][k] w[n][k] (+ bias), x fp32 or bf16.
// AVX-512, fp32 x: the 16 codebook values sit in one register and vpermps looks a code up (it reads an index's low
// 4 bits, so a byte's high nibble needs only a shift); each block's products are summed first and scaled by its
// absmax once; rows of x 4 at a time. AVX2 (nf4_avx2.h): the codebook in two registers, x always as fp32.
// bf16 x with AVX512-BF16: per block the 16 values times its absmax, rounded to bf16 (bitsandbytes' bf16 weights),
// are looked up 32 at a time by vpermw and dotted with x by vdpbf16ps; rows of x 8 at a time.
// hq_nf4_dequant: rows [n0, n1) of w into fp32 or bf16 (torch's rounding), for the GEMM of long prompts.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hk_api.h"
#include "scalar.h"
#include "simd_avx2.h"
#include "parallel.h"

namespace {

using hk::kBF16, hk::kF32;

struct Nf4 {
  const uint8_t* w;
  int64_t ldw;
  const float* absmax;
  int64_t ldg, group, K;
  const float* codebook;
};

bool bad_shape(int64_t K, int64_t group) { return group <= 0 || group % 32 || K % group; }

// x rows as fp32 (bf16 widened once per call: every weight row reads them again).
const float* x_f32(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, std::vector<float>& buf,
                   int64_t* ld) {
  if (x_dtype == kF32) {
    *ld = ldx;
    return static_cast<const float*>(x);
  }
  buf.resize(M * K);
  const uint16_t* h = static_cast<const uint16_t*>(x);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) buf[m * K + k] = hk::bf16_to_f32(h[m * ldx + k]);
  *ld = K;
  return buf.data();
}

// The next NB weight rows' cache line at column k: a tile reads NB rows of K / 2 bytes side by side, runs too short
// for the hardware prefetcher to pick up before they end. (A prefetch past the weight's end does not fault.)
template <int NB>
inline void prefetch_next(const Nf4& p, int64_t n, int64_t k) {
  for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(p.w + (n + NB + j) * p.ldw + k / 2),
                                            _MM_HINT_T0);
}

#include "nf4_avx2.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

// 32 weights' codes (16 bytes) -> the codebook values of elements 0..15 (lo) and 16..31 (hi).
inline void decode32(const uint8_t* p, __m512 lut, __m512& lo, __m512& hi) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  lo = _mm512_permutexvar_ps(v, lut);
  hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
}

// MB rows of x (at x, stride ldx) against NB weight rows from n -> out (stride ldo). Per block and (row, weight row)
// two chains (lo / hi halves), so even MB = 1 keeps 2 * NB FMAs in flight.
template <int MB, int NB>
void tile(const Nf4& p, const float* x, int64_t ldx, int64_t n, float* out, int64_t ldo, const float* bias) {
  const __m512 lut = _mm512_loadu_ps(p.codebook);
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  const int64_t blocks = p.K / p.group;
  for (int64_t g = 0; g < blocks; ++g) {
    __m512 lo_s[MB][NB], hi_s[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < NB; ++j) lo_s[m][j] = hi_s[m][j] = _mm512_setzero_ps();
    for (int64_t k = g * p.group; k < (g + 1) * p.group; k += 32) {
      __m512 lo[NB], hi[NB];
      if (!(k & 127)) prefetch_next<NB>(p, n, k);
      for (int j = 0; j < NB; ++j) decode32(p.w + (n + j) * p.ldw + k / 2, lut, lo[j], hi[j]);
      for (int m = 0; m < MB; ++m) {
        const __m512 x0 = _mm512_loadu_ps(x + m * ldx + k), x1 = _mm512_loadu_ps(x + m * ldx + k + 16);
        for (int j = 0; j < NB; ++j) {
          lo_s[m][j] = _mm512_fmadd_ps(lo[j], x0, lo_s[m][j]);
          hi_s[m][j] = _mm512_fmadd_ps(hi[j], x1, hi_s[m][j]);
        }
      }
    }
    for (int j = 0; j < NB; ++j) {
      const __m512 s = _mm512_set1_ps(p.absmax[(n + j) * p.ldg + g]);
      for (int m = 0; m < MB; ++m) acc[m][j] = _mm512_fmadd_ps(_mm512_add_ps(lo_s[m][j], hi_s[m][j]), s, acc[m][j]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j)
      out[m * ldo + n + j] = _mm512_reduce_add_ps(acc[m][j]) + (bias ? bias[n + j] : 0.0f);
}

template <int MB>
void rows_mb(const Nf4& p, const float* x, int64_t ldx, int64_t n0, int64_t n1, float* out, int64_t ldo,
             const float* bias) {
  constexpr int NB = MB == 1 ? 4 : 2;
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) tile<MB, NB>(p, x, ldx, n, out, ldo, bias);
  for (; n < n1; ++n) tile<MB, 1>(p, x, ldx, n, out, ldo, bias);
}

// Weight rows [n0, n1) for every row of x: rows of x 4 at a time, the weight rows in slices that stay in cache
// while those passes reread them.
void linear_rows(const Nf4& p, const float* x, int64_t ldx, int64_t M, int64_t n0, int64_t n1, float* out,
                 int64_t ldo, const float* bias) {
  const int64_t slice = std::max<int64_t>(4, (int64_t(256) << 10) / std::max<int64_t>(1, p.K / 2) / 4 * 4);
  for (int64_t s0 = n0; s0 < n1; s0 += slice) {
    const int64_t s1 = std::min(n1, s0 + slice);
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows_mb<4>(p, x + m * ldx, ldx, s0, s1, out + m * ldo, ldo, bias);
    const float* xm = x + m * ldx;
    float* om = out + m * ldo;
    switch (M - m) {
      case 3: rows_mb<3>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 2: rows_mb<2>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 1: rows_mb<1>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      default: break;
    }
  }
}

void dequant_rows_avx512(const Nf4& p, int64_t n0, int64_t n1, void* out, int out_bf16) {
  const __m512 lut = _mm512_loadu_ps(p.codebook);
  const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < p.K; k += 32) {
      __m512 lo, hi;
      decode32(p.w + n * p.ldw + k / 2, lut, lo, hi);
      const __m512 s = _mm512_set1_ps(p.absmax[n * p.ldg + k / p.group]);
      const __m512 v[2] = {_mm512_mul_ps(lo, s), _mm512_mul_ps(hi, s)};
      const int64_t at = (n - n0) * p.K + k;
      for (int h = 0; h < 2; ++h) {
        if (!out_bf16) {
          _mm512_storeu_ps(static_cast<float*>(out) + at + 16 * h, v[h]);
          continue;
        }
        // round to nearest even, as torch's .to(bfloat16) (the products are finite)
        const __m512i u = _mm512_castps_si512(v[h]);
        const __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + at + 16 * h),
                            _mm512_cvtepi32_epi16(r));
      }
    }
  }
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")

// A block's 16 values codebook * absmax rounded to bf16 (torch's rounding, as bitsandbytes' bf16 dequantize), twice
// over: vpermw reads 5 index bits, and a byte's low-nibble lane carries its high nibble's lowest bit as bit 4.
inline __m512i block_table(__m512 cb, float absmax) {
  const __m256i t = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(cb, _mm512_set1_ps(absmax)));
  return _mm512_inserti64x4(_mm512_castsi256_si512(t), t, 1);
}

// 32 weights' codes (16 bytes) -> their 32 bf16 values, in element order.
inline __m512i decode32_bf16(const uint8_t* p, __m512i table) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  return _mm512_permutexvar_epi16(idx, table);
}

// bf16 x (MB rows) against NB weight rows decoded to bf16: one vdpbf16ps per 32 weights and row of x.
template <int MB, int NB>
void tile_bf16(const Nf4& p, const uint16_t* x, int64_t ldx, int64_t n, float* out, int64_t ldo, const float* bias) {
  const __m512 cb = _mm512_loadu_ps(p.codebook);
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  const int64_t blocks = p.K / p.group;
  for (int64_t g = 0; g < blocks; ++g) {
    __m512i table[NB];
    for (int j = 0; j < NB; ++j) table[j] = block_table(cb, p.absmax[(n + j) * p.ldg + g]);
    for (int64_t k = g * p.group; k < (g + 1) * p.group; k += 32) {
      __m512i w[NB];
      if (!(k & 127)) prefetch_next<NB>(p, n, k);
      for (int j = 0; j < NB; ++j) w[j] = decode32_bf16(p.w + (n + j) * p.ldw + k / 2, table[j]);
      for (int m = 0; m < MB; ++m) {
        const __m512i xv = _mm512_loadu_si512(x + m * ldx + k);
        for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], (__m512bh)xv, (__m512bh)w[j]);
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j)
      out[m * ldo + n + j] = _mm512_reduce_add_ps(acc[m][j]) + (bias ? bias[n + j] : 0.0f);
}

template <int MB>
void rows_mb_bf16(const Nf4& p, const uint16_t* x, int64_t ldx, int64_t n0, int64_t n1, float* out, int64_t ldo,
                  const float* bias) {
  constexpr int NB = MB <= 2 ? 4 : 2;
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) tile_bf16<MB, NB>(p, x, ldx, n, out, ldo, bias);
  for (; n < n1; ++n) tile_bf16<MB, 1>(p, x, ldx, n, out, ldo, bias);
}

void linear_rows_bf16(const Nf4& p, const uint16_t* x, int64_t ldx, int64_t M, int64_t n0, int64_t n1, float* out,
                      int64_t ldo, const float* bias) {
  const int64_t slice = std::max<int64_t>(4, (int64_t(256) << 10) / std::max<int64_t>(1, p.K / 2) / 4 * 4);
  for (int64_t s0 = n0; s0 < n1; s0 += slice) {
    const int64_t s1 = std::min(n1, s0 + slice);
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) rows_mb_bf16<8>(p, x + m * ldx, ldx, s0, s1, out + m * ldo, ldo, bias);
    const uint16_t* xm = x + m * ldx;
    float* om = out + m * ldo;
    switch (M - m) {
      case 7: rows_mb_bf16<7>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 6: rows_mb_bf16<6>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 5: rows_mb_bf16<5>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 4: rows_mb_bf16<4>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 3: rows_mb_bf16<3>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 2: rows_mb_bf16<2>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      case 1: rows_mb_bf16<1>(p, xm, ldx, s0, s1, om, ldo, bias); break;
      default: break;
    }
  }
}

// bitsandbytes' quantize_4bit on CPU, per block: absmax = max |w|, scaled = clamp(w * (1 / max(absmax, 1e-38)), -1, 1)
// in fp32 (the same two roundings as its torch code), code = the bounds below scaled (torch.bucketize, right=False).
void quantize_rows(const float* w, int64_t ldw, int64_t K, int64_t group, const float* bounds, int64_t n0, int64_t n1,
                   uint8_t* out, int64_t ldo, float* absmax, int64_t ldg) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512 lo_clamp = _mm512_set1_ps(-1.0f), hi_clamp = _mm512_set1_ps(1.0f);
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = w + n * ldw;
    for (int64_t g = 0; g < K / group; ++g) {
      __m512 mx = _mm512_setzero_ps();
      for (int64_t k = g * group; k < (g + 1) * group; k += 16)
        mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
      const float am = _mm512_reduce_max_ps(mx);
      absmax[n * ldg + g] = am;
      const __m512 inv = _mm512_set1_ps(1.0f / std::max(am, 1e-38f));
      for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
        __m512i c[2];
        for (int h = 0; h < 2; ++h) {
          const __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(row + k + 16 * h), inv),
                                                       lo_clamp), hi_clamp);
          c[h] = _mm512_setzero_si512();
          for (int b = 0; b < 15; ++b)
            c[h] = _mm512_mask_add_epi32(c[h], _mm512_cmp_ps_mask(_mm512_set1_ps(bounds[b]), x, _CMP_LT_OQ), c[h],
                                         one);
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + n * ldo + k / 2),
                         _mm512_cvtepi32_epi8(_mm512_or_si512(c[0], _mm512_slli_epi32(c[1], 4))));
      }
    }
  }
}

#pragma GCC pop_options

void dequant_rows_scalar(const Nf4& p, int64_t n0, int64_t n1, void* out, int out_bf16) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < p.K; ++k) {
      const uint8_t b = p.w[n * p.ldw + (k / 32) * 16 + k % 16];
      const float v = p.codebook[k % 32 < 16 ? b & 15 : b >> 4] * p.absmax[n * p.ldg + k / p.group];
      const int64_t at = (n - n0) * p.K + k;
      if (out_bf16)
        static_cast<uint16_t*>(out)[at] = hk::f32_to_bf16(v);
      else
        static_cast<float*>(out)[at] = v;
    }
}

bool has_avx512() { return hk::cpu_has_avx512bw(); }

constexpr int kISA_AVX2 = 1, kISA_AVX512 = 2;

}  // namespace

namespace hk_family {

// out [M][N] fp32 (row stride N) = x [M][K] (fp32 or bf16, row stride ldx) . w^T + bias, on the AVX-512 bodies
// where isa is 2 and the CPU has AVX-512, else the AVX2 ones. -1: an isa other than 1 / 2, -2: an x dtype other
// than fp32 / bf16, -3: a group that is not a multiple of 32 dividing K.
int codebook(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const uint8_t* w, int64_t N,
             int64_t ldw, const float* absmax, int64_t ldg, int64_t group, const float* codebook,
             const float* bias, float* out, int isa, int nthreads) {
  if (isa != kISA_AVX2 && isa != kISA_AVX512) return -1;
  if (x_dtype != kF32 && x_dtype != kBF16) return -2;
  if (bad_shape(K, group)) return -3;
  const Nf4 p{w, ldw, absmax, ldg, group, K, codebook};
  const bool avx512 = isa == kISA_AVX512 && has_avx512();
  if (avx512 && x_dtype == kBF16 && hk::cpu_has_bf16_dot()) {  // bf16 x: the weights as bf16 too, dotted by vdpbf16ps
    const uint16_t* xb = static_cast<const uint16_t*>(x);
    hk_par::parallel_dynamic(N, 64, nthreads,
                             [&](int64_t b, int64_t e) { linear_rows_bf16(p, xb, ldx, M, b, e, out, N, bias); });
    return 0;
  }
  std::vector<float> buf;
  int64_t ld;
  const float* xf = x_f32(x, x_dtype, M, K, ldx, buf, &ld);
  // chunks of weight rows handed out as threads free up (one thread's slower memory does not hold the other)
  hk_par::parallel_dynamic(N, 64, nthreads, [&](int64_t b, int64_t e) {
    if (avx512)
      linear_rows(p, xf, ld, M, b, e, out, N, bias);
    else
      linear_rows_avx2(p, xf, ld, M, b, e, out, N, bias);
  });
  return 0;
}

}  // namespace hk_family

extern "C" {

// Rows [n0, n1) of w -> out [n1 - n0][K], fp32 or (out_bf16) bf16 rounded as torch rounds. -3: a bad group.
int hq_nf4_dequant(const uint8_t* w, int64_t K, int64_t ldw, const float* absmax, int64_t ldg, int64_t group,
                   const float* codebook, int64_t n0, int64_t n1, void* out, int out_bf16, int nthreads) {
  if (bad_shape(K, group)) return -3;
  const Nf4 p{w, ldw, absmax, ldg, group, K, codebook};
  const bool avx512 = has_avx512(), avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  hk_par::parallel(n1 - n0, nthreads, [&](int64_t b, int64_t e) {
    void* o = static_cast<uint8_t*>(out) + b * K * (out_bf16 ? 2 : 4);
    if (avx512)
      dequant_rows_avx512(p, n0 + b, n0 + e, o, out_bf16);
    else if (avx2)
      dequant_rows_avx2(p, n0 + b, n0 + e, o, out_bf16);
    else
      dequant_rows_scalar(p, n0 + b, n0 + e, o, out_bf16);
  });
  return 0;
}

// w fp32 [N][K] (row stride ldw) -> codes [N][K / 2] (hearth's int4 order, row stride ldo) and absmax [N][K / group]
// (row stride ldg), as bitsandbytes quantizes with the 15 ascending bucket bounds given. -1: no AVX-512 here (the
// caller's torch form then), -3: a bad group.
int hq_nf4_quantize(const float* w, int64_t N, int64_t K, int64_t ldw, int64_t group, const float* bounds,
                    uint8_t* out, int64_t ldo, float* absmax, int64_t ldg, int nthreads) {
  if (!has_avx512()) return -1;
  if (bad_shape(K, group) || group % 16) return -3;
  hk_par::parallel(N, nthreads, [&](int64_t b, int64_t e) {
    quantize_rows(w, ldw, K, group, bounds, b, e, out, ldo, absmax, ldg);
  });
  return 0;
}

}  // extern "C"
