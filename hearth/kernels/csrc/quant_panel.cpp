// Quantized weights (int8, or int4 with or without mins) in 64-column panels, multiplied in broadcast form by
// AVX512-VNNI integer dot products (vpdpbusd: 64 u8 x s8 multiply-adds per instruction), or for int4 on AVX2 by
// vpmaddubsw (quant_panel_avx2.h, the same panels): the quantized counterpart of panel_dot.cpp, one kernel for every
// row count (decode steps of 1-64 rows and prompt steps alike).
//
// Layout (packed at load by hearth.kernels.quant.to_panels from the plain rows): P = ceil(N / 64) panels; panel p,
// k quad j (k = 4j .. 4j + 3) holds 64 columns x 4 k as unsigned bytes, column-major within 32-bit lanes:
//   int8: 4 vectors of 64 bytes, vector v lane i = columns 16v + i, bytes k 4j..4j+3 of q + 128
//   int4: 2 vectors of 64 bytes, vector v lane i: low nibbles = column 32v + i, high nibbles = column 32v + 16 + i
//         (q in 0..15 as stored by GGUF Q4_0/Q4_1 and hearth's int4)
// scales (and mins) per panel [K / group][64] in their own type (fp32, or fp16 for GGUF blocks). Columns past N are
// zero weights with zero scales.
//
// Activations: each x row quantized per block of 32 like the "int8" / "int8x2" decode kernels (quant_dot_impl.h,
// quant.quantize_activations / _x2: same scale and rounding, so the same numbers up to fp32 summation order).
// Per block b and output n: the integer sum sum_k u[k][n] q[k] (u the stored unsigned weight) becomes
//   s[n][g(b)] * dx[b] * (sum u q - off * sum q)          (off = 128 for int8, 8 for symmetric int4, 0 with mins)
//   (+ min[n][g(b)] * dx[b] * sum q                         with mins)
// the offset's part folded into the integer accumulator's start value; int8x2 runs two integer chains on the same
// weight vectors and combines them as 254 * a1 + a2 before the single float step per block.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"
#include "simd_avx2.h"
#include "simd_avx512.h"
#include "hk_api.h"
#include "blocked_loop.h"

namespace {

constexpr int kCols = 64;   // outputs per panel
constexpr int kQuads = 8;   // k quads per block of 32
// K block: a panel's K block of at most 32 KiB (int8: 16 blocks of 32, 512 values; int4: 32 blocks) stays in L1 while
// the row tiles run against it; with 2048 int8 values the 3-row int8 tiles waited on L2 (256 values were no better).
// int4 at 32 KiB rather than 16: one K block for a 896-wide input, so no partial sums through memory.
constexpr int64_t kKCBytes = 32 << 10;

// Software prefetch of the panel stream, chosen per CPU vendor by measurement (BENCHMARKS.md): Intel (a Xeon with
// AMX): into L2, 16 KiB ahead (L1 at 4 KiB left batch-1 decode behind the plain rows' kernels there); AMD, where
// this kernel was tuned: into L1, 4 KiB ahead.
struct Prefetch {
  int64_t ahead;
  bool l2;
};

const Prefetch& panel_prefetch() {
  static const Prefetch p = __builtin_cpu_is("intel") ? Prefetch{16 << 10, true} : Prefetch{4 << 10, false};
  return p;
}

using hk::kBF16, hk::kF16, hk::kF32;

// x quantized per block of 32: q1 (and q2) [M][K] int8, per block dx, the integer sums of q1 / q2 and the float sum
// of the dequantized block (for mins).
struct XQ {
  const int8_t* q1;
  const int8_t* q2;
  const float* d;
  const int32_t* s1;
  const int32_t* s2;
  const float* fs;
  int64_t K, nb;
};


#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

#include "panel_common.h"

inline __m512 load16(const void* x, int dtype, int64_t i) {
  if (dtype == kF32) return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
  if (dtype == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// One x row (elements off .. off + K of x) -> its blocks. The arithmetic of quant_dot_impl.h's quantize_x_row:
// dx = amax / 127, q1 = round-half-even(x * fl(1 / dx)); x2: d2 = fl(dx / 254), r = fl(x - d2 * 254 q1) (one fma),
// q2 = clamp(round(r * fl(1 / d2)), -127, 127), and the block's scale is d2.
void quantize_row(const void* x, int dtype, int64_t off, int64_t K, bool x2, int8_t* q1, int8_t* q2, float* d,
                  int32_t* s1, int32_t* s2, float* fs) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const __m512 v0 = load16(x, dtype, off + 32 * b), v1 = load16(x, dtype, off + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float dx = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(dx > 0.0f ? 1.0f / dx : 0.0f);
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + 32 * b), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
    const int32_t t1 = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    int32_t t2 = 0;
    if (x2) {
      const float d2 = dx / 254.0f;
      const __m512 vd2 = _mm512_set1_ps(d2), id2 = _mm512_set1_ps(d2 > 0.0f ? 1.0f / d2 : 0.0f);
      const __m512i k254 = _mm512_set1_epi32(254), lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
      auto second = [&](__m512i i, __m512 v) {
        const __m512 r = _mm512_fnmadd_ps(vd2, _mm512_cvtepi32_ps(_mm512_mullo_epi32(i, k254)), v);
        return _mm512_max_epi32(nlim, _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(r, id2))));
      };
      const __m512i j0 = second(i0, v0), j1 = second(i1, v1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 32 * b), _mm512_cvtsepi32_epi8(j0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 32 * b + 16), _mm512_cvtsepi32_epi8(j1));
      t2 = _mm512_reduce_add_epi32(_mm512_add_epi32(j0, j1));
      dx = d2;
    }
    d[b] = dx;
    s1[b] = t1;
    s2[b] = t2;
    fs[b] = dx * (float)(x2 ? 254 * t1 + t2 : t1);
  }
}

inline __m512 scales16(const float* s) { return _mm512_loadu_ps(s); }
inline __m512 scales16(const uint16_t* s) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
}

inline __m512i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// R x rows [m0, m0 + R) against one panel (64 columns, 4 vectors) over blocks [b0, b1): out (row stride ldo) gets
// the sums, added to what it holds (accumulate: a later K block) or to the bias (first block; null: none). nvalid:
// the panel's real columns. R <= 3 (int8: 12 integer + 12 float accumulators) or R <= 2 (int8x2: 16 + 8): every
// sum stays in a register (well ahead of 6-row tiles with the float sums in memory and 32-column passes).
template <int R, int BITS, bool X2, bool MINS, class S, bool PF>
void tile(const XQ& xq, int64_t m0, const uint8_t* wp, const S* sp, const S* mp, int64_t b0, int64_t b1,
          int64_t spg, float* out, int64_t ldo, bool accumulate, const float* bias, int nvalid, uint16_t* out16) {
  constexpr int NV = 4;  // 16-column vectors
  constexpr int32_t kOff = MINS ? 0 : (BITS == 8 ? 128 : 8);
  constexpr int64_t kQuadBytes = BITS == 8 ? 256 : 128;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const int64_t K = xq.K, nb = xq.nb;
  const Prefetch pf = panel_prefetch();
  __m512 f[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) f[r][c] = _mm512_setzero_ps();
  for (int64_t b = b0; b < b1; ++b) {
    // (Every loop here is unrolled in full, so the accumulators live in registers.)
    __m512i a1[R][NV], a2[X2 ? R : 1][NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i c1 = _mm512_set1_epi32(-kOff * xq.s1[(m0 + r) * nb + b]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) a1[r][c] = c1;
      if constexpr (X2) {
        const __m512i c2 = _mm512_set1_epi32(-kOff * xq.s2[(m0 + r) * nb + b]);
#pragma GCC unroll 4
        for (int c = 0; c < NV; ++c) a2[r][c] = c2;
      }
    }
    const uint8_t* wb = wp + b * kQuads * kQuadBytes;
    const int8_t* x1p = xq.q1 + m0 * K + 32 * b;
    const int8_t* x2p = xq.q2 + m0 * K + 32 * b;
#pragma GCC unroll 8
    for (int qd = 0; qd < kQuads; ++qd) {
      // Every line of the panel pf.ahead bytes ahead (the hardware prefetcher alone left decode steps of a few
      // rows waiting on memory between dot products, nearly twice as long).
      // (PF: only the first row tile of a pass over the panel; the others find it in L1 / L2.)
#pragma GCC unroll 4
      for (int64_t l = 0; l < (PF ? kQuadBytes : 0); l += 64) {
        const char* at = reinterpret_cast<const char*>(wb + qd * kQuadBytes + l) + pf.ahead;
        if (pf.l2) _mm_prefetch(at, _MM_HINT_T1);
        else _mm_prefetch(at, _MM_HINT_T0);
      }
      __m512i w[NV];
      if constexpr (BITS == 8) {
#pragma GCC unroll 4
        for (int c = 0; c < NV; ++c) w[c] = _mm512_loadu_si512(wb + qd * kQuadBytes + c * 64);
      } else {
#pragma GCC unroll 4
        for (int c = 0; c < NV; c += 2) {
          const __m512i l = _mm512_loadu_si512(wb + qd * kQuadBytes + c * 32);
          w[c] = _mm512_and_si512(l, nib);
          w[c + 1] = _mm512_and_si512(_mm512_srli_epi16(l, 4), nib);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i x1 = bcast32(x1p + r * K + 4 * qd);
#pragma GCC unroll 4
        for (int c = 0; c < NV; ++c) a1[r][c] = _mm512_dpbusd_epi32(a1[r][c], w[c], x1);
        if constexpr (X2) {
          const __m512i x2 = bcast32(x2p + r * K + 4 * qd);
#pragma GCC unroll 4
          for (int c = 0; c < NV; ++c) a2[r][c] = _mm512_dpbusd_epi32(a2[r][c], w[c], x2);
        }
      }
    }
    const int64_t g = b / spg;
    __m512 sw[NV], mn[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      sw[c] = scales16(sp + g * kCols + c * 16);
      if constexpr (MINS) mn[c] = scales16(mp + g * kCols + c * 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(xq.d[(m0 + r) * nb + b]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) {
        // int8x2: 254 a1 + a2 as one fma of the converted chains (the exact sum rounded once, as converting the
        // integer sum would: same bits, two operations fewer than the integer form)
        __m512 v = _mm512_cvtepi32_ps(a1[r][c]);
        if constexpr (X2) v = _mm512_fmadd_ps(v, _mm512_set1_ps(254.0f), _mm512_cvtepi32_ps(a2[r][c]));
        f[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(v, sw[c]), dx, f[r][c]);
        if constexpr (MINS) f[r][c] = _mm512_fmadd_ps(mn[c], _mm512_set1_ps(xq.fs[(m0 + r) * nb + b]), f[r][c]);
      }
    }
  }
  // (panel_common.h's stores for two 32-column halves: the same masked add of the bias or earlier K blocks)
  const int nv[2] = {std::min(nvalid, 32), std::max(nvalid - 32, 0)};
  if (out16 && b1 == nb)  // the last K block of a bf16-output call: rounded here, no fp32 pass after
    store_tile_bf16<R, NV>(f, out16, ldo, accumulate ? out : nullptr, ldo, bias, nv);
  else
    store_tile<R, NV>(f, out, ldo, accumulate, bias, nv);
}

template <int BITS, bool X2, bool MINS, class S, bool PF>
void tile_r(int r, const XQ& xq, int64_t m0, const uint8_t* wp, const S* sp, const S* mp, int64_t b0, int64_t b1,
            int64_t spg, float* out, int64_t ldo, bool accumulate, const float* bias, int nvalid, uint16_t* out16) {
#define HQ_TILE(R) \
  tile<R, BITS, X2, MINS, S, PF>(xq, m0, wp, sp, mp, b0, b1, spg, out, ldo, accumulate, bias, nvalid, out16)
  if (r == 1) return HQ_TILE(1);
  if constexpr (!X2)
    if (r == 3) return HQ_TILE(3);
  return HQ_TILE(2);
#undef HQ_TILE
}

// out [M][N] = x . W^T (+ bias) over the panels: x quantized first (rows in parallel), then the blocked loop of
// panel_common.h (panels split over threads, or row tiles when there are few panels; K in blocks of kKCBytes).
// out16 (or null): the result rounded to bf16 there instead (out then only holds the partial sums of earlier K
// blocks, and is not touched where K is one block).
// Panels [p0, p1) of an int8 / int4 weight of N rows (row stride ldw bytes) into dst (quant.to_panels's layout, byte
// for byte): each 64-byte vector of a quad is 16 rows' 32-bit groups, gathered; int4 picks each k's nibble half
// (elements 0-15 of a block are low nibbles, 16-31 high) and joins two rows per byte. Rows past N become zeros.
// A row is blocks of 32 weights, block_bytes apart, each holding its 32 int8 (or 16 nibble bytes) from byte `header`
// on: plain rows (32 / 16, 0), or a GGUF file's own blocks (Q8_0 34, 2; Q4_0 18, 2; Q4_1 20, 4: scales skipped).
void pack_range(const uint8_t* src, int bits, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes, int64_t header,
                uint8_t* dst, int64_t p0, int64_t p1) {
  const int64_t quads = K / 4, panel_bytes = bits == 8 ? kCols * K : kCols * K / 2;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i low = _mm512_set1_epi32(0x0F0F0F0F), flip = _mm512_set1_epi32(int32_t(0x80808080u));
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* base = src + p * kCols * ldw;
    uint8_t* d = dst + p * panel_bytes;
    auto rows = [&](int first, __m512i& idx, __mmask16& valid) {  // 16 rows from panel row `first`
      const __m512i r = _mm512_add_epi32(lane, _mm512_set1_epi32(first));
      valid = _mm512_cmplt_epi32_mask(r, _mm512_set1_epi32(int32_t(std::min<int64_t>(kCols, N - p * kCols))));
      idx = _mm512_mullo_epi32(r, _mm512_set1_epi32(int32_t(ldw)));
    };
    if (bits == 8) {
      for (int v = 0; v < 4; ++v) {
        __m512i idx;
        __mmask16 ok;
        rows(16 * v, idx, ok);
        for (int64_t j = 0; j < quads; ++j) {
          const uint8_t* at = base + (4 * j) / 32 * block_bytes + header + (4 * j) % 32;
          const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), ok, idx, at, 1);
          _mm512_storeu_si512(d + j * 256 + v * 64, _mm512_maskz_xor_epi32(ok, g, flip));
        }
      }
    } else {
      for (int v = 0; v < 2; ++v) {
        __m512i ia, ib;
        __mmask16 oka, okb;
        rows(32 * v, ia, oka);
        rows(32 * v + 16, ib, okb);
        for (int64_t j = 0; j < quads; ++j) {
          const int64_t e = (4 * j) % 32, off = (4 * j) / 32 * block_bytes + header + e % 16;
          const __m128i sh = _mm_cvtsi32_si128(int(4 * (e / 16)));
          const __m512i a = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), oka, ia, base + off, 1);
          const __m512i b = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), okb, ib, base + off, 1);
          const __m512i lo = _mm512_and_si512(_mm512_srl_epi32(a, sh), low);
          const __m512i hi = _mm512_and_si512(_mm512_srl_epi32(b, sh), low);
          _mm512_storeu_si512(d + j * 128 + v * 64, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)));
        }
      }
    }
  }
}

#pragma GCC pop_options

// A portable copy of pack_range (same bytes), for CPUs without AVX-512 (and forced AVX2 mode): 4 bytes at a time.
void pack_range_scalar(const uint8_t* src, int bits, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes,
                       int64_t header, uint8_t* dst, int64_t p0, int64_t p1) {
  const int64_t quads = K / 4, panel_bytes = bits == 8 ? kCols * K : kCols * K / 2;
  auto word = [&](int64_t row, int64_t off) {  // 4 bytes of a row (0 past N)
    uint32_t v = 0;
    if (row < N) std::memcpy(&v, src + row * ldw + off, 4);
    return v;
  };
  for (int64_t p = p0; p < p1; ++p) {
    uint8_t* d = dst + p * panel_bytes;
    const int64_t r0 = p * kCols;
    for (int64_t j = 0; j < quads; ++j) {
      const int64_t e = (4 * j) % 32;
      if (bits == 8) {
        const int64_t off = (4 * j) / 32 * block_bytes + header + e;
        for (int64_t c = 0; c < kCols; ++c) {
          const uint32_t v = r0 + c < N ? word(r0 + c, off) ^ 0x80808080u : 0;
          std::memcpy(d + j * 256 + 4 * c, &v, 4);
        }
      } else {
        const int64_t off = (4 * j) / 32 * block_bytes + header + e % 16, sh = 4 * (e / 16);
        for (int64_t v = 0; v < 2; ++v)
          for (int64_t i = 0; i < 16; ++i) {
            const uint32_t lo = (word(r0 + 32 * v + i, off) >> sh) & 0x0F0F0F0Fu;
            const uint32_t hi = (word(r0 + 32 * v + 16 + i, off) >> sh) & 0x0F0F0F0Fu;
            const uint32_t b = lo | (hi << 4);
            std::memcpy(d + j * 128 + v * 64 + 4 * i, &b, 4);
          }
      }
    }
  }
}

#include "quant_panel_avx2.h"

// The two bodies the driver below runs, each compiled for its own ISA: x rows quantized (quantize_row) and up to kMR
// rows against one panel over a K block (tile_r).
struct Avx512Body {
  template <bool X2>
  static constexpr int kMR = X2 ? 2 : 3;
  static constexpr auto quantize_row = ::quantize_row;
  template <int BITS, bool X2, bool MINS, class S, bool PF>
  static constexpr auto tile_r = ::tile_r<BITS, X2, MINS, S, PF>;
};
struct Avx2Body {  // int4 only (quant_panel_avx2.h)
  template <bool X2>
  static constexpr int kMR = X2 ? 2 : avx2::kRows;
  static constexpr auto quantize_row = avx2::quantize_row;
  template <int BITS, bool X2, bool MINS, class S, bool PF>
  static constexpr auto tile_r = avx2::tile_r<X2, MINS, S, PF>;
};

template <class Body, int BITS, bool X2, bool MINS, class S>
void gemm(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const uint8_t* w, int64_t N,
          const S* scales, const S* mins, int64_t group, const float* bias, float* out, uint16_t* out16,
          int nthreads) {
  constexpr int MR = Body::template kMR<X2>;
  const int64_t nb = K / 32, spg = group / 32, ng = K / group, P = (N + kCols - 1) / kCols;
  const int64_t panel_bytes = nb * kQuads * (BITS == 8 ? 256 : 128), ntiles = (M + MR - 1) / MR;
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> fbuf;
  thread_local std::vector<int32_t> ibuf;
  if ((int64_t)qbuf.size() < 2 * M * K) qbuf.resize(2 * M * K);
  if ((int64_t)fbuf.size() < 2 * M * nb) fbuf.resize(2 * M * nb);
  if ((int64_t)ibuf.size() < 2 * M * nb) ibuf.resize(2 * M * nb);
  // (thread_local: the team's other threads must see this thread's buffers through these pointers)
  int8_t* const q = qbuf.data();
  float* const fl = fbuf.data();
  int32_t* const in = ibuf.data();
  const XQ xq{q, q + M * K, fl, in, in + M * nb, fl + M * nb, K, nb};
  const int ntq = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, M));
#pragma omp parallel for num_threads(ntq)
  for (int64_t m = 0; m < M; ++m)
    Body::quantize_row(x, x_dtype, m * ldx, K, X2, q + m * K, q + M * K + m * K, fl + m * nb, in + m * nb,
                 in + M * nb + m * nb, fl + M * nb + m * nb);
  constexpr int64_t kMaxKC = kKCBytes / (kQuads * (BITS == 8 ? 256 : 128));  // blocks of 32 per K block
  const int64_t nk = (nb + kMaxKC - 1) / kMaxKC, KC = (nb + nk - 1) / nk;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, std::max(P, ntiles)));
  constexpr int64_t kMC = 64;  // row tiles per pass over a panel block
  blocked_loop(P, ntiles, nb, KC, 1, kMC, nt, [&](int64_t t, int64_t p, int64_t b0, int64_t kc) {
    const int64_t m0 = t * MR, r = std::min<int64_t>(MR, M - m0), col = p * kCols;
    auto fn = t % kMC == 0 ? Body::template tile_r<BITS, X2, MINS, S, true>
                           : Body::template tile_r<BITS, X2, MINS, S, false>;
    fn((int)r, xq, m0, w + p * panel_bytes, scales + p * ng * kCols, MINS ? mins + p * ng * kCols : nullptr, b0,
       b0 + kc, spg, out + m0 * N + col, N, b0 > 0, bias ? bias + col : nullptr,
       (int)std::min<int64_t>(kCols, N - col), out16 ? out16 + m0 * N + col : nullptr);
  });
}

template <class Body, int BITS, bool X2>
void gemm_s(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const uint8_t* w, int64_t N,
            const void* scales, const void* mins, int64_t group, const float* bias, float* out, uint16_t* out16,
            int nthreads, bool f16) {
#define HQ_GEMM(MINS, s, mn) gemm<Body, BITS, X2, MINS>(x, x_dtype, M, K, ldx, w, N, s, mn, group, bias, out, out16, nthreads)
  if (f16) {
    auto s = static_cast<const uint16_t*>(scales), mn = static_cast<const uint16_t*>(mins);
    if (BITS == 4 && mins) return HQ_GEMM(true, s, mn);
    return HQ_GEMM(false, s, mn);
  }
  auto s = static_cast<const float*>(scales), mn = static_cast<const float*>(mins);
  if (BITS == 4 && mins) return HQ_GEMM(true, s, mn);
  return HQ_GEMM(false, s, mn);
#undef HQ_GEMM
}


int run(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int code, int64_t N,
        const void* scales, const void* mins, int64_t group, const float* bias, float* out, uint16_t* out16,
        int nthreads, int scale_f16, bool x2) {
  const bool vnni = hk::cpu_has_vnni();
  if (!vnni && code != kPanelsInt4) return -1;  // int8 panels: VNNI only (see quant_panel_avx2.h)
  if ((code != kPanelsInt8 && code != kPanelsInt4) || K % 32 || group % 32 || K % group || x_dtype < 0 ||
      x_dtype > 2 || (code == kPanelsInt8 && mins))
    return -2;
  if (M <= 0) return 0;
  const auto wp = static_cast<const uint8_t*>(w);
  const bool f16 = scale_f16 != 0;
#define HQ_GEMM_S(BODY, BITS, X2) gemm_s<BODY, BITS, X2>(x, x_dtype, M, K, ldx, wp, N, scales, mins, group, bias, \
                                                         out, out16, nthreads, f16)
  if (!vnni) {
    if (x2) HQ_GEMM_S(Avx2Body, 4, true);
    else HQ_GEMM_S(Avx2Body, 4, false);
  } else if (code == kPanelsInt8) {
    if (x2) HQ_GEMM_S(Avx512Body, 8, true);
    else HQ_GEMM_S(Avx512Body, 8, false);
  } else {
    if (x2) HQ_GEMM_S(Avx512Body, 4, true);
    else HQ_GEMM_S(Avx512Body, 4, false);
  }
#undef HQ_GEMM_S
  return 0;
}

}  // namespace

extern "C" {

// w (rows of blocks of 32 weights, block_bytes apart, the weights from byte header of each: plain int8 [N][ldw] is
// 32 / 0, plain int4 with GGUF's nibble order 16 / 0, GGUF Q8_0 rows 34 / 2, Q4_0 18 / 2, Q4_1 20 / 4; bits 8 / 4)
// -> dst (ceil(N / 64) panels, quant.to_panels's layout) over nthreads. Returns 0, -2 for a
// shape it does not take. hq_pack_panels: plain rows.
int hq_pack_panels_blocks(const void* w, int bits, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes,
                          int64_t header, uint8_t* dst, int nthreads) {
  const int64_t payload = bits == 8 ? 32 : 16;  // bytes of weights per block of 32
  if ((bits != 8 && bits != 4) || K % 32 || N <= 0 || 64 * ldw > INT32_MAX || header < 0 ||
      block_bytes < header + payload || ldw < K / 32 * block_bytes)
    return -2;
  const int64_t P = (N + kCols - 1) / kCols;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, P));
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    (hk::cpu_has_avx512bw() ? pack_range : pack_range_scalar)(static_cast<const uint8_t*>(w), bits, N, K, ldw,
                                                              block_bytes, header, dst, P * t / T, P * (t + 1) / T);
  }
  return 0;
}

int hq_pack_panels(const void* w, int bits, int64_t N, int64_t K, int64_t ldw, uint8_t* dst, int nthreads) {
  return hq_pack_panels_blocks(w, bits, N, K, ldw, bits == 8 ? 32 : 16, 0, dst, nthreads);
}

// The fp16 field at byte `offset` of every block of 32 in w (rows of blocks as above: a GGUF Q8_0 / Q4_0 / Q4_1
// scale at 0, a Q4_1 min at 2) -> dst [ceil(N / 64)][K / 32][64], the panels' scale layout (rows past N: zero),
// over nthreads. Returns 0, -2 for a shape it does not take. (One pass over the blocks' bytes: numpy's strided
// gathers and the transpose into panels read them twice.)
int hq_pack_panel_scales_blocks(const void* w, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes,
                                int64_t offset, uint16_t* dst, int nthreads) {
  if (K % 32 || N <= 0 || offset < 0 || offset + 2 > block_bytes || ldw < K / 32 * block_bytes) return -2;
  const int64_t P = (N + kCols - 1) / kCols, KB = K / 32;
  const auto src = static_cast<const uint8_t*>(w);
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, P));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t p = 0; p < P; ++p) {
    uint16_t* d = dst + p * KB * kCols;
    for (int64_t c = 0; c < kCols; ++c) {
      const int64_t r = p * kCols + c;
      const uint8_t* row = src + r * ldw + offset;
      for (int64_t kb = 0; kb < KB; ++kb) {
        uint16_t v = 0;
        if (r < N) std::memcpy(&v, row + kb * block_bytes, 2);
        d[kb * kCols + c] = v;
      }
    }
  }
  return 0;
}
}  // extern "C"

namespace hk_family {

// out [M][N] (fp32) = x [M][K] (row stride ldx; f32 / bf16 / f16) . W^T (+ bias), W in VNNI panels (code
// kPanelsInt8 / kPanelsInt4, see the layout above; scales and mins per panel [K / group][64], fp16 if scale_f16),
// The panel GEMM (AVX512-VNNI's body, else AVX2's, quant_panel_avx2.h): x quantized to one int8 term per block of
// 32, or two (x2: "int8x2"); returns 0, -2 for a shape or code it does not take. With out16, the result rounded to bf16 (nearest
// even, as the fp32 result's .to(torch.bfloat16)) into out16 [M][N], no fp32 output pass, and partial fp32 [M][N]
// scratch for the partial sums of K blocks before the last (untouched where K fits one block); with out16 null,
// the fp32 result into partial.
int quant_panels(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int code,
                 int64_t N, const void* scales, const void* mins, int64_t group, const float* bias,
                 float* partial, uint16_t* out16, int nthreads, int scale_f16, int x2) {
  return run(x, x_dtype, M, K, ldx, w, code, N, scales, mins, group, bias, partial, out16, nthreads, scale_f16,
             x2 != 0);
}

}  // namespace hk_family
