// bf16 weights packed into 32-row panels, and the decode GEMM that reads them (AVX-512 only).
//
// Layout: a weight W [N][K] becomes P = ceil(N / 32) panels [P][K][32] (bf16). At (p, k) the 32 values are 16
// 32-bit lanes; lane i holds W[32p + i][k] in its low half and W[32p + 16 + i][k] in its high half, so one 64-byte
// load gives both output halves as fp32 with one shift (low) and one and (high). Rows past N are zero.
//
// GEMM (y[M][N] = x[M][K] . W^T): broadcast form, x values broadcast into FMAs against 32 outputs' weights at once,
// no horizontal reductions. Two kernels:
// - micro (M < 4: memory-bound): one row tile over the whole K, x values as {1to16} FMA memory operands, weights
//   streamed once per thread (prefetch 2 KiB ahead; for M = 1 four panels in lockstep). At M = 1 on a par with the
//   row-dot kernel in linear.cpp.
// - tile / linear_tiled (M >= 4: compute-bound): BLIS loop order, 6 x 64 register tiles, x micro-panels in L1, a
//   K block of 4 panel pairs in L2: ahead of torch.mm (on widened weights or alone) up to a few hundred rows;
//   above that torch.mm on widened weights is ahead again, so prefill takes that path (hearth.weights.dispatch).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"
#include "simd_avx512.h"

namespace {

constexpr int kNP = 32;        // outputs per panel
constexpr int kTiledMinM = 4;  // rows from which linear_tiled runs (M = 2: on a par with micro; 4: ahead)
constexpr int kMaxMR = kTiledMinM - 1;  // micro: rows of its one tile
constexpr int kPrefetch = 32;  // k steps (64 bytes each) ahead
constexpr int kStreams = 4;    // M = 1: panels read in lockstep

using hk::kBF16, hk::kF16, hk::kF32;

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

#include "panel_common.h"

// out = xt . panel over kc steps (+ bias; row stride ldo; nvalid of the 32 columns). xt: the tile's x
// values k-major, each k's MR values twice ([k][2][MR]) so the two FMAs of a row read different addresses and the
// compiler keeps both as broadcast memory operands instead of loading the value once into a register.
template <int MR>
inline void micro(const float* __restrict xt, const uint16_t* __restrict wp, int64_t kc, float* __restrict out,
                  int64_t ldo, const float* bias, int nvalid) {
  __m512 a0[MR], a1[MR];
  for (int m = 0; m < MR; ++m) a0[m] = _mm512_setzero_ps(), a1[m] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t k = 0; k < kc; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(wp + (k + kPrefetch) * kNP), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(wp + k * kNP);
    const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    for (int m = 0; m < MR; ++m) {
      a0[m] = _mm512_fmadd_ps(_mm512_set1_ps(xt[k * 2 * MR + m]), lo, a0[m]);
      a1[m] = _mm512_fmadd_ps(_mm512_set1_ps(xt[k * 2 * MR + MR + m]), hi, a1[m]);
    }
  }
  const __mmask16 m0 = half_mask(nvalid, 0), m1 = half_mask(nvalid, 1);
  for (int m = 0; m < MR; ++m) {
    float* o = out + m * ldo;
    if (bias) {
      a0[m] = _mm512_add_ps(a0[m], _mm512_maskz_loadu_ps(m0, bias));
      a1[m] = _mm512_add_ps(a1[m], _mm512_maskz_loadu_ps(m1, bias + 16));
    }
    _mm512_mask_storeu_ps(o, m0, a0[m]);
    _mm512_mask_storeu_ps(o + 16, m1, a1[m]);
  }
}

// One x row against S panels in lockstep (S sequential streams far apart: more misses in flight than one
// stream, as the row-major kernel's run_rows; memory-bound, so conversions and broadcasts are free).
template <int S>
inline void micro_streams(const float* __restrict xt, const uint16_t* const* wp, int64_t kc, float* const* out,
                          const float* const* bias, const int* nvalid) {
  __m512 a0[S], a1[S];
  for (int s = 0; s < S; ++s) a0[s] = _mm512_setzero_ps(), a1[s] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b = _mm512_set1_ps(xt[2 * k]);
    for (int s = 0; s < S; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(wp[s] + (k + kPrefetch) * kNP), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(wp[s] + k * kNP);
      a0[s] = _mm512_fmadd_ps(b, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), a0[s]);
      a1[s] = _mm512_fmadd_ps(b, _mm512_castsi512_ps(_mm512_and_si512(v, high)), a1[s]);
    }
  }
  for (int s = 0; s < S; ++s) {
    const __mmask16 m0 = half_mask(nvalid[s], 0), m1 = half_mask(nvalid[s], 1);
    if (bias[s]) {
      a0[s] = _mm512_add_ps(a0[s], _mm512_maskz_loadu_ps(m0, bias[s]));
      a1[s] = _mm512_add_ps(a1[s], _mm512_maskz_loadu_ps(m1, bias[s] + 16));
    }
    _mm512_mask_storeu_ps(out[s], m0, a0[s]);
    _mm512_mask_storeu_ps(out[s] + 16, m1, a1[s]);
  }
}

template <int MR>
inline void micro_rows(int mr, const float* xt, const uint16_t* wp, int64_t kc, float* out, int64_t ldo,
                       const float* bias, int nvalid) {
  if constexpr (MR >= 1) {
    if (mr == MR) return micro<MR>(xt, wp, kc, out, ldo, bias, nvalid);
    return micro_rows<MR - 1>(mr, xt, wp, kc, out, ldo, bias, nvalid);
  }
}

// GEMM tile for many rows (BLIS order, see hk_linear_panels): R (<= 6) x rows against C (1 or 2) panels, 24
// accumulators for 6 x 64. The x micro-panel (xt [kc][R], single copy, broadcast by vbroadcastss loads) stays in
// L1 while the panels' K block streams from L2; 4 conversion ops per 24 FMAs. accumulate: add to out (a later K
// block), else add bias (first block; null: none). nv[c]: valid columns of panel c (masked loads / stores).
template <int R, int C>
inline void tile(const float* __restrict xt, const uint16_t* __restrict w0, const uint16_t* __restrict w1,
                 int64_t kc, float* __restrict out, int64_t ldo, bool accumulate, const float* bias, const int* nv) {
  __m512 a[R][2 * C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2 * C; ++c) a[r][c] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t k = 0; k < kc; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (k + 16) * kNP), _MM_HINT_T0);
    __m512 b[2 * C];
    const __m512i v0 = _mm512_loadu_si512(w0 + k * kNP);
    b[0] = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
    b[1] = _mm512_castsi512_ps(_mm512_and_si512(v0, high));
    if constexpr (C == 2) {
      _mm_prefetch(reinterpret_cast<const char*>(w1 + (k + 16) * kNP), _MM_HINT_T0);
      const __m512i v1 = _mm512_loadu_si512(w1 + k * kNP);
      b[2] = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
      b[3] = _mm512_castsi512_ps(_mm512_and_si512(v1, high));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(xt[k * R + r]);
      for (int c = 0; c < 2 * C; ++c) a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
    }
  }
  store_tile<R, 2 * C>(a, out, ldo, accumulate, bias, nv);
}

template <int R>
inline void tile_rows(int r, const float* xt, const uint16_t* w0, const uint16_t* w1, int64_t kc, float* out,
                      int64_t ldo, bool accumulate, const float* bias, const int* nv) {
  if constexpr (R >= 1) {
    if (r < R) return tile_rows<R - 1>(r, xt, w0, w1, kc, out, ldo, accumulate, bias, nv);
    if (w1) return tile<R, 2>(xt, w0, w1, kc, out, ldo, accumulate, bias, nv);
    return tile<R, 1>(xt, w0, w0, kc, out, ldo, accumulate, bias, nv);
  }
}

// dst [K][ldo] fp32, columns [32 p0, 32 p1) = panel rows transposed (the panels of one weight with n rows).
// K blocks of 16 outer, panels inner: each output row is written in one sequential run per block.
void widen_panels(const uint16_t* wp, int64_t n, int64_t K, float* dst, int64_t ldo, int64_t p0, int64_t p1) {
  constexpr int64_t KB = 16;
  const __m512i high = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t k1 = std::min(K, k0 + KB);
    for (int64_t p = p0; p < p1; ++p) {
      const int nvalid = (int)std::min<int64_t>(kNP, n - p * kNP);
      const __mmask16 m0 = half_mask(nvalid, 0), m1 = half_mask(nvalid, 1);
      const uint16_t* src = wp + p * K * kNP;
      float* d = dst + p * kNP;
      for (int64_t k = k0; k < k1; ++k) {
        const __m512i v = _mm512_loadu_si512(src + k * kNP);
        _mm512_mask_storeu_ps(d + k * ldo, m0, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        _mm512_mask_storeu_ps(d + k * ldo + 16, m1, _mm512_castsi512_ps(_mm512_and_si512(v, high)));
      }
    }
  }
}

// Panels [p0, p1) of W [N][K] (row stride ldw) into dst, 16 k at a time: rows i and 16 + i interleave into 16
// 32-bit values, then a 16 x 16 transpose of those gives the 16 k vectors (an order of magnitude above scalar).
void pack_range(const uint16_t* w, int64_t N, int64_t K, int64_t ldw, uint16_t* dst, int64_t p0, int64_t p1) {
  const int64_t K16 = K / 16 * 16;
  for (int64_t p = p0; p < p1; ++p) {
    uint16_t* d = dst + p * K * kNP;
    for (int64_t k0 = 0; k0 < K16; k0 += 16) {
      __m512i r[16], c[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t n0 = p * kNP + i, n1 = n0 + 16;
        const __m512i a = n0 < N ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + n0 * ldw + k0)))
                                 : _mm512_setzero_si512();
        const __m512i b = n1 < N ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + n1 * ldw + k0)))
                                 : _mm512_setzero_si512();
        r[i] = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));  // [k] = row n0's value | row n1's << 16
      }
      transpose16_epi32(r, c);
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(d + (k0 + q) * kNP, c[q]);
    }
    for (int i = 0; i < kNP; ++i) {  // the K tail
      const int64_t n = p * kNP + i;
      const int lane = (i % 16) * 2 + i / 16;
      for (int64_t k = K16; k < K; ++k) d[k * kNP + lane] = n < N ? w[n * ldw + k] : 0;
    }
  }
}

float load_x(const void* x, int dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(x)[i];
  const uint16_t h = static_cast<const uint16_t*>(x)[i];
  return dtype == kBF16 ? hk::bf16_to_f32(h) : hk::f16_to_f32(h);
}

// out [M][N] = x . cat(parts)^T (+ bias) for many rows (BLIS loop order, weights as the streamed vector operand):
// x is packed into 6-row micro-panels [K][6]; each thread takes a range of panel pairs (or, with few pairs, of row
// tiles) and walks it in blocks of kPairsPerBlock pairs x kc k: that weight block (<= 256 KiB) stays in L2 while
// every row tile's micro-panel (6 x kc, L1) runs against it; C tiles are re-read once per K block.
// Against the one-tile kernel above it wins at every M from 8, and at 128 rows it is ahead of torch.mm.
void linear_tiled(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                  const void* const* w, const int64_t* n, const float* bias, float* out, int64_t N, int nthreads) {
  constexpr int MR = 6;
  constexpr int64_t kPairsPerBlock = 4, kMaxKC = 512;
  const std::vector<PanelPair> pairs = panel_pairs(nparts, w, n, bias, K * kNP);
  // Row tiles of 6 and the rest (M = 8: 6 + 2 measured no slower than 4 + 4).
  const int64_t G = (int64_t)pairs.size(), ntiles = (M + MR - 1) / MR;
  thread_local std::vector<float> xbuf;
  if ((int64_t)xbuf.size() < M * K) xbuf.resize(M * K);
  float* xp = xbuf.data();
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, std::max(G, ntiles)));
#pragma omp parallel for num_threads(nt)
  for (int64_t t = 0; t < ntiles; ++t) {
    const int64_t m0 = t * MR, r = std::min<int64_t>(MR, M - m0);
    float* d = xp + m0 * K;
    for (int64_t m = 0; m < r; ++m)
      for (int64_t k = 0; k < K; ++k) d[k * r + m] = load_x(x, x_dtype, (m0 + m) * ldx + k);
  }
  const int64_t nk = (K + kMaxKC - 1) / kMaxKC, KC = (K + nk - 1) / nk;
  blocked_loop(G, ntiles, K, KC, kPairsPerBlock, ntiles, nt, [&](int64_t t, int64_t g, int64_t k0, int64_t kc) {
    const int64_t m0 = t * MR, r = std::min<int64_t>(MR, M - m0);
    const PanelPair& q = pairs[g];
    const uint16_t* w0 = q.w + k0 * kNP;
    tile_rows<MR>((int)r, xp + m0 * K + k0 * r, w0, q.nv[1] ? w0 + K * kNP : nullptr, kc, out + m0 * N + q.col, N,
                  k0 > 0, q.bias, q.nv);
  });
}

#pragma GCC pop_options

}  // namespace

extern "C" {

// w [N][K] bf16 (row stride ldw) -> dst (ceil(N / 32) * K * 32 bf16), over nthreads. Returns 0.
int hk_pack_panels(const uint16_t* w, int64_t N, int64_t K, int64_t ldw, uint16_t* dst, int nthreads) {
  const int64_t P = (N + kNP - 1) / kNP;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, P));
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    pack_range(w, N, K, ldw, dst, P * t / T, P * (t + 1) / T);
  }
  return 0;
}

// out [K][ldo] fp32: columns [col[i], col[i] + n[i]) = part i's rows (panels w[i]) transposed, i.e. cat(parts)^T,
// for prefill GEMMs (torch.mm(x, out)). Returns 0.
int hk_widen_panels(int64_t nparts, const void* const* w, const int64_t* n, int64_t K, float* out, int64_t ldo,
                    int nthreads) {
  std::vector<int64_t> first(nparts + 1, 0), col(nparts + 1, 0);
  for (int64_t i = 0; i < nparts; ++i) {
    first[i + 1] = first[i] + (n[i] + kNP - 1) / kNP;
    col[i + 1] = col[i] + n[i];
  }
  const int64_t total = first[nparts];
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, total));
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t b = total * t / T, e = total * (t + 1) / T;
    for (int64_t i = 0; i < nparts; ++i) {
      const int64_t pb = std::max(b, first[i]) - first[i], pe = std::min(e, first[i + 1]) - first[i];
      if (pb < pe) widen_panels(static_cast<const uint16_t*>(w[i]), n[i], K, out + col[i], ldo, pb, pe);
    }
  }
  return 0;
}

// out [M][ldo = sum n] (fp32) = x [M][K] (row stride ldx; f32 / bf16 / f16) . cat(parts)^T (+ bias), each part's
// weight in panel form (w[i]: n[i] rows). Returns 0.
int hk_linear_panels(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                     const void* const* w, const int64_t* n, const float* bias, float* out, int nthreads) {
  if (M <= 0) return 0;
  std::vector<int64_t> first(nparts + 1, 0), col(nparts + 1, 0);
  for (int64_t i = 0; i < nparts; ++i) {
    first[i + 1] = first[i] + (n[i] + kNP - 1) / kNP;
    col[i + 1] = col[i] + n[i];
  }
  const int64_t N = col[nparts], total = first[nparts];
  if (M >= kTiledMinM) {
    linear_tiled(x, x_dtype, M, K, ldx, nparts, w, n, bias, out, N, nthreads);
    return 0;
  }
  // Fewer rows: one tile over the whole K, x packed k-major with each value twice (see micro). Memory-bound:
  // panels are handed out in chunks as threads free up (a thread that got less memory bandwidth does not hold the
  // other at the end; same results whichever thread runs a panel).
  thread_local std::vector<float> xbuf;
  if ((int64_t)xbuf.size() < 2 * M * K) xbuf.resize(2 * M * K);
  float* xp = xbuf.data();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xp[2 * k * M + m] = xp[2 * k * M + M + m] = load_x(x, x_dtype, m * ldx + k);
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, total));
  auto part_of = [&](int64_t g) { return int64_t(std::upper_bound(first.begin(), first.end(), g) - first.begin()) - 1; };
  const int64_t chunk = std::max<int64_t>(4, total / (8 * nt));
  const int64_t nchunks = (total + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t g0 = c * chunk, g1 = std::min(total, (c + 1) * chunk);
    const uint16_t* wp[kStreams];
    float* o[kStreams];
    const float* bp[kStreams];
    int nv[kStreams];
    auto at = [&](int64_t g, int s) {
      const int64_t i = part_of(g), p = g - first[i];
      wp[s] = static_cast<const uint16_t*>(w[i]) + p * K * kNP;
      o[s] = out + col[i] + p * kNP;
      bp[s] = bias ? bias + col[i] + p * kNP : nullptr;
      nv[s] = (int)std::min<int64_t>(kNP, n[i] - p * kNP);
    };
    int64_t g = g0;
    if (M == 1) {  // kStreams panels far apart in lockstep: stream s walks its own quarter of the chunk
      const int64_t len = (g1 - g0) / kStreams;
      for (int64_t j = 0; j < len; ++j) {
        for (int s = 0; s < kStreams; ++s) at(g0 + s * len + j, s);
        micro_streams<kStreams>(xp, wp, K, o, bp, nv);
      }
      g = g0 + kStreams * len;
    }
    for (; g < g1; ++g) {
      at(g, 0);
      micro_rows<kMaxMR>((int)M, xp, wp[0], K, o[0], N, bp[0], nv[0]);
    }
  }
  return 0;
}

}  // extern "C"
