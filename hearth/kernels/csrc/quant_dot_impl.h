// Integer-dot body of the quantized decode GEMM (small M): x is quantized once per call to int8 blocks of 32
// (llama.cpp's Q8_0/Q8_1 activations), then y[m][n] = sum over blocks of scale products times integer dot products.
// Included by quant.cpp inside a namespace providing, under the matching `#pragma GCC target`:
//   struct D { static __m256i dot(__m256i acc, __m256i u, __m256i s); }   acc (8 x s32) += sums of 4 adjacent u8*s8
//   (and dot2(acc, u1, s1, u2, s2) = dot(dot(acc, u1, s1), u2, s2))
// (AVX2: maddubs + madd with ones; AVX-512 VNNI: one vpdpbusd). Both are exact here: |u8 * s8| pairs stay below
// 2^15 (int8 weights: 127 * 128 * 2 = 32512; int4: 15 * 127 * 2), so maddubs never saturates.
//
// Math (XQ = the quantized activations, see quantize_x): per block b of 32, x ~ dx[b] * qx[b][i] (qx in -127..127,
// dx = amax / 127, round-half-even), and the result is exactly the dequantized weights times that dequantized x up
// to fp32 summation order:
//   int8 w = q * s[g]          : y = sum_b s[g(b)] * dx[b] * (q . qx)_b
//   int4 w = q * s[g] + mn[g]  : y = sum_b s[g(b)] * dx[b] * (q . qx)_b + sum_g mn[g] * xs[g],
//                                xs[g] = sum over blocks b of group g of dx[b] * sum_i qx[b][i]  (precomputed)
// int4 works on pairs of blocks (2j, 2j + 1): one 32-byte load holds both blocks' nibbles, low nibbles = elements
// 0..15 of each, high nibbles = 16..31; quantize_x stores qx of a pair as [A0..15 B0..15 A16..31 B16..31] so that
// maddubs(lo, qx[0:32]) + maddubs(hi, qx[32:64]) has block A in the low 128-bit lane and B in the high one.
// (XQ, the quantized x, is defined in quant.cpp.)
//
// One header per weight format, included here in dependency order; this file keeps the dispatch over them.
#include "quant_dot_x.h"

// Row m of a Problem / of its quantized x, as a one-row problem (M > 1 int4-g32: the M = 1 kernels row by row).
// About twice as fast as unpacking the tile and running micro_u4, and several times faster for a Q6_K head (its
// tiles were unpacked to int8 by a scalar loop).
static inline Problem row_of(const Problem& a, int64_t m) {
  Problem p = a;
  p.M = 1;
  p.out = a.out + m * ldo_of(a);
  return p;
}
static inline XQ row_of(const XQ& xq, const Problem& a, int64_t m) {
  return XQ{xq.q + m * a.K, xq.d + m * xq.ld_d, xq.xs ? xq.xs + m * xq.ld_xs : nullptr, xq.ld_d, xq.ld_xs,
            xq.q2 ? xq.q2 + m * a.K : nullptr, xq.dn ? xq.dn + m * (a.K / 32) : nullptr, nullptr};
}

#include "quant_dot_int4.h"
#include "quant_dot_int4_tiles.h"
#include "quant_dot_q6.h"
#include "quant_dot_int8.h"

template <int MR, int NR, bool kX2, class S>
static inline void micro_dot_s(const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs) {
  const int64_t spg = a.sb_per_group;
  if (a.int4) {
    switch (spg) {
      case 1: return micro_u4<MR, NR, 1, kX2, S>(a, xq, m0, n0, rs);
      case 2: return micro_u4<MR, NR, 2, kX2, S>(a, xq, m0, n0, rs);
      case 4: return micro_u4<MR, NR, 4, kX2, S>(a, xq, m0, n0, rs);
      default: return micro_u4<MR, NR, 0, kX2, S>(a, xq, m0, n0, rs);
    }
  }
  if (spg * 32 == a.K) return micro_i8<MR, NR, -1, kX2, S>(a, xq, m0, n0, rs);
  switch (spg) {
    case 0: return micro_i8<MR, NR, -2, kX2, S>(a, xq, m0, n0, rs);
    case 1: return micro_i8<MR, NR, 1, kX2, S>(a, xq, m0, n0, rs);
    case 2: return micro_i8<MR, NR, 2, kX2, S>(a, xq, m0, n0, rs);
    case 4: return micro_i8<MR, NR, 4, kX2, S>(a, xq, m0, n0, rs);
    default: return micro_i8<MR, NR, 0, kX2, S>(a, xq, m0, n0, rs);
  }
}

template <int MR, int NR, bool kX2>
static inline void micro_dot(const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs = 1) {
  if (a.sf16) return micro_dot_s<MR, NR, kX2, uint16_t>(a, xq, m0, n0, rs);
  micro_dot_s<MR, NR, kX2, float>(a, xq, m0, n0, rs);
}

template <int MR, int NR, bool kX2>
static inline void micro_dot_mr(int mr, const Problem& a, const XQ& xq, int64_t m0, int64_t n0) {
  if constexpr (MR >= 1) {
    if (mr == MR) return micro_dot<MR, NR, kX2>(a, xq, m0, n0);
    micro_dot_mr<MR - 1, NR, kX2>(mr, a, xq, m0, n0);
  }
}

// int4 with 32-weight groups and an even block count: the folded M = 1 kernels' domain (m1_u4_g32, m1_tile).
static inline bool u4_g32(const Problem& a) { return a.int4 && !a.tiled && a.sb_per_group == 1 && a.K % 64 == 0; }

// Output rows [n_begin, n_end) for all M rows of x. M == 1: kStreamsM1 streams, each its own contiguous run of
// rows (see linear_impl.h run_rows), the last < kStreamsM1 rows one at a time. M > 1, tiles in the 256-bit namespace
// (AVX2): each tile unpacked once per 4 x rows (mr_tile, mr_q6_tile). M > 1, int4-g32 plain rows, and tiles in the
// 512-bit namespaces: the M = 1 kernels for each x row in turn on four weight rows (row_of). Every one of these gives
// a row the M = 1 kernel's numbers. Other M > 1: up to kDotMR x
// rows per weight row, so each weight row (a few KiB) is unpacked once per x tile and re-read from L1 by the next
// tile; x (M x K bytes, M <= 32 per call of this) stays in L2. That tile: 4 x rows per weight row (on AVX2, 4 x 1
// beat 2 x 2, 4 x 2 and 8 x 1, which spill accumulators or unpacked weights out of the 16 ymm registers).
constexpr int64_t kDotMR = 4, kDotNR = 1;
constexpr int kStreamsM1 = 4;  // 2 and 3 streams measured no better (noisy)
template <bool kX2>
static void run_dot_t(const Problem& a, const XQ& xq, int64_t n_begin, int64_t n_end) {
  constexpr int64_t MB = kDotMR;
  if (tiles_of(a)) {  // whole tiles (n_begin, n_end multiples of 4)
    const TileGeo g(a);
#if !HQ_ZMM
    if (a.M > 1) {  // AVX2: each tile unpacked once for 4 x rows, per row m1_tile's / m1_q6_tile's numbers
      const int64_t t0 = n_begin / 4, t1 = n_end / 4;
      if (a.q6)
        mr_q6_tiles<kX2>(a, xq, t0, t1);
      else if (a.sf16)
        a.tmins ? mr_tiles<kX2, uint16_t, true>(a, xq, g, t0, t1) : mr_tiles<kX2, uint16_t, false>(a, xq, g, t0, t1);
      else
        a.tmins ? mr_tiles<kX2, float, true>(a, xq, g, t0, t1) : mr_tiles<kX2, float, false>(a, xq, g, t0, t1);
      return;
    }
#endif
    if (a.M > 1) {  // the M = 1 tile kernel for each x row in turn, the tile hot in L1 / L2 after the first (both
      // equal the plain layout's M > 1 kernels: per output and x row the same integer sums and float steps)
      for (int64_t t = n_begin / 4; t < n_end / 4; ++t)
        for (int64_t m = 0; m < a.M; ++m) run_dot_t<kX2>(row_of(a, m), row_of(xq, a, m), 4 * t, 4 * t + 4);
    } else if (a.q6) {
#if HQ_ZMM
      for (int64_t t = n_begin / 4; t < n_end / 4; ++t) m1_q6_tile_zmm<kX2>(a, xq, t);
#else
      for (int64_t t = n_begin / 4; t < n_end / 4; ++t) m1_q6_tile<kX2>(a, xq, t);
#endif
    } else {
      for (int64_t t = n_begin / 4; t < n_end / 4; ++t) {
        if (a.sf16)
          a.tmins ? m1_tile<kX2, uint16_t, true>(a, xq, g, t) : m1_tile<kX2, uint16_t, false>(a, xq, g, t);
        else
          a.tmins ? m1_tile<kX2, float, true>(a, xq, g, t) : m1_tile<kX2, float, false>(a, xq, g, t);
      }
    }
    return;
  }
#if !HQ_ZMM
  if (xq.x16 && !a.int4) {  // int8 weights (linear_dot): M = 1 in kStreamsM1 streams as below, then 4 x 2 tiles
    if (a.M == 1) {
      const int64_t len = (n_end - n_begin) / kStreamsM1;
      for (int64_t i = 0; i < len; ++i) tile_i8_x16_mr<1, kStreamsM1>(1, a, xq, 0, n_begin + i, len);
      n_begin += kStreamsM1 * len;
    }
    return run_i8_x16(a, xq, n_begin, n_end);
  }
#endif
  if (a.M > 1 && u4_g32(a)) {  // as the tiles above, so that both layouts give the same results
    for (; n_begin + 4 <= n_end; n_begin += 4)
      for (int64_t m = 0; m < a.M; ++m) {
        const Problem p = row_of(a, m);
        a.sf16 ? m1_u4_g32<kX2, uint16_t>(p, row_of(xq, a, m), n_begin, 1)
               : m1_u4_g32<kX2, float>(p, row_of(xq, a, m), n_begin, 1);
      }
  }
  if (a.M == 1) {
    const int64_t len = (n_end - n_begin) / kStreamsM1;
    const bool g32 = u4_g32(a) && kStreamsM1 == 4;
    for (int64_t i = 0; i < len; ++i) {
      if (g32 && a.sf16)
        m1_u4_g32<kX2, uint16_t>(a, xq, n_begin + i, len);
      else if (g32)
        m1_u4_g32<kX2, float>(a, xq, n_begin + i, len);
#if HQ_ZMM
      else if (xq.x16 && a.sf16)
        m1_i8_zmm<kStreamsM1, uint16_t>(a, xq, n_begin + i, len);
      else if (xq.x16)
        m1_i8_zmm<kStreamsM1, float>(a, xq, n_begin + i, len);
#endif
      else
        micro_dot<1, kStreamsM1, kX2>(a, xq, 0, n_begin + i, len);
    }
    n_begin += kStreamsM1 * len;
  }
  for (int64_t n = n_begin; n < n_end; n += kDotNR)
    for (int64_t m0 = 0; m0 < a.M; m0 += MB)
      micro_dot_mr<MB, kDotNR, kX2>((int)std::min(MB, a.M - m0), a, xq, m0, n);
}

static void run_dot(const Problem& a, const XQ& xq, int64_t n_begin, int64_t n_end) {
  if (xq.q2)
    run_dot_t<true>(a, xq, n_begin, n_end);
  else
    run_dot_t<false>(a, xq, n_begin, n_end);
}
