// bf16 weights in 32-row pair panels, and the GEMM that reads them with AVX512-BF16 dot products (vdpbf16ps).
// The AVX512-BF16 counterpart of panel.cpp: same BLIS loop order and blocking, another layout and tile.
//
// Layout: W [N][K] (K even) becomes P = ceil(N / 32) panels [P][K / 2][64] (bf16). At (p, kp) the 64 values are
// two 64-byte vectors: 32-bit lane j of the first holds (W[32p + j][2kp], W[32p + j][2kp + 1]), of the second the
// same for row 32p + 16 + j. Rows past N are zero. Same bytes as panel.cpp's layout, another order.
//
// GEMM (y[M][N] = x[M][K] . W^T, x rounded to bf16: exact for a bf16 model's activations): broadcast form, each x
// row's (x[2kp], x[2kp + 1]) pair broadcast to 16 lanes and dotted with 32 outputs' weight pairs in two vdpbf16ps,
// i.e. 64 multiply-adds per weight vector pair where panel.cpp's tile does 32 FMAs after two conversions.
// Tiles of up to 6 rows x 64 outputs (24 accumulators) for any M: with few rows the tile is memory-bound anyway.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"
#include "simd_avx512.h"
#include "hk_api.h"

namespace {

constexpr int kNP = 32;  // outputs per panel
constexpr int kPanelPair = 64;  // bf16 values per (panel, k pair)
// k pairs ahead that tile() prefetches (4 KiB): far enough that loads and dot products overlap instead of taking
// turns when the weights come from memory.
constexpr int kPrefetchPairs = 32;
// K block in k pairs (2048 values): one block for a 0.5-1.1B model's hidden size, three for its MLP down.
constexpr int64_t kMaxKC = 1024;

using hk::kBF16, hk::kF16, hk::kF32;

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")

#include "panel_common.h"

uint16_t x_bf16(const void* x, int dtype, int64_t i) {
  if (dtype == kBF16) return static_cast<const uint16_t*>(x)[i];
  const float f = dtype == kF32 ? static_cast<const float*>(x)[i] : hk::f16_to_f32(static_cast<const uint16_t*>(x)[i]);
  return hk::f32_to_bf16(f);
}

// R (<= 8) x rows against C (1 or 2) panels over kpc k pairs. Row r's bf16 pair kp (as 32 bits) is
// xt[r * xs + kp * xk]: xs = 1, xk = R for a packed micro-panel [kpc][R], xs = row stride, xk = 1 for rows as they lie.
// accumulate: add to out (a later K block), else add bias (first block; null: none). nv[c]: valid columns.
// out16 (the last K block of a bf16-output GEMM): the sums go there in bf16 instead, out holding the earlier blocks'.
template <int R, int C>
inline void tile(const uint32_t* __restrict xt, int64_t xs, int64_t xk, const uint16_t* __restrict w0,
                 const uint16_t* __restrict w1, int64_t kpc, float* __restrict out, int64_t ldo, bool accumulate, const float* bias, const int* nv,
                 uint16_t* out16) {
  __m512 a[R][2 * C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2 * C; ++c) a[r][c] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < kpc; ++kp) {
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (kp + kPrefetchPairs) * kPanelPair), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w0 + (kp + kPrefetchPairs) * kPanelPair + 32), _MM_HINT_T0);
    __m512i b[2 * C];
    b[0] = _mm512_loadu_si512(w0 + kp * kPanelPair);
    b[1] = _mm512_loadu_si512(w0 + kp * kPanelPair + 32);
    if constexpr (C == 2) {
      _mm_prefetch(reinterpret_cast<const char*>(w1 + (kp + kPrefetchPairs) * kPanelPair), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w1 + (kp + kPrefetchPairs) * kPanelPair + 32), _MM_HINT_T0);
      b[2] = _mm512_loadu_si512(w1 + kp * kPanelPair);
      b[3] = _mm512_loadu_si512(w1 + kp * kPanelPair + 32);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i xv = _mm512_set1_epi32(int(xt[r * xs + kp * xk]));
      for (int c = 0; c < 2 * C; ++c) a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh)xv, (__m512bh)b[c]);
    }
  }
  if (out16) return store_tile_bf16<R, 2 * C>(a, out16, ldo, accumulate ? out : nullptr, ldo, bias, nv);
  store_tile<R, 2 * C>(a, out, ldo, accumulate, bias, nv);
}

template <int R>
inline void tile_rows(int r, const uint32_t* xt, int64_t xs, int64_t xk, const uint16_t* w0, const uint16_t* w1,
                      int64_t kpc, float* out, int64_t ldo, bool accumulate, const float* bias, const int* nv,
                      uint16_t* out16) {
  if constexpr (R >= 1) {
    if (r < R) return tile_rows<R - 1>(r, xt, xs, xk, w0, w1, kpc, out, ldo, accumulate, bias, nv, out16);
    if (w1) return tile<R, 2>(xt, xs, xk, w0, w1, kpc, out, ldo, accumulate, bias, nv, out16);
    return tile<R, 1>(xt, xs, xk, w0, w0, kpc, out, ldo, accumulate, bias, nv, out16);
  }
}

// Panels [p0, p1) of W [N][K] (row stride ldw, K even) into dst: per panel half (16 rows) and 16 k pairs, a 16 x 16
// transpose of 32-bit pairs (row i's pair q -> pair q's lane i).
void pack_range(const uint16_t* w, int64_t N, int64_t K, int64_t ldw, uint16_t* dst, int64_t p0, int64_t p1) {
  const int64_t KP = K / 2, KP16 = KP / 16 * 16;
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + p * K * kNP);  // [KP][32] 32-bit pairs
    for (int half = 0; half < 2; ++half) {
      for (int64_t q0 = 0; q0 < KP16; q0 += 16) {
        __m512i r[16], c[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t n = p * kNP + 16 * half + i;
          r[i] = n < N ? _mm512_loadu_si512(w + n * ldw + 2 * q0) : _mm512_setzero_si512();
        }
        transpose16_epi32(r, c);
        for (int q = 0; q < 16; ++q) _mm512_storeu_si512(d + (q0 + q) * kNP + 16 * half, c[q]);
      }
    }
    for (int i = 0; i < kNP; ++i) {  // the K tail (pairs past the last 16)
      const int64_t n = p * kNP + i;
      for (int64_t q = KP16; q < KP; ++q) {
        uint32_t v = 0;
        if (n < N) std::memcpy(&v, w + n * ldw + 2 * q, 4);
        d[q * kNP + i] = v;
      }
    }
  }
}

// out [M][N] = x . cat(parts)^T (+ bias): x packed into micro-panels of MR rows' bf16 pairs [K/2][MR]; each thread takes
// a range of panel pairs (or, with few pairs, of row tiles) and walks it in blocks of kPairsPerBlock pairs x KC
// k pairs: that weight block (<= 512 KiB) stays in L2 while each row tile's micro-panel (of kMC) runs against it.
// out16 (not null): the result in bf16 there, out then only holding the sums of K blocks before the last (null
// when K is one block).
void linear_dot(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts, const void* const* w,
                const int64_t* n, const float* bias, float* out, uint16_t* out16, int64_t N, int nthreads) {
  // Row tiles of 6 against a panel pair (24 accumulators); for 7, 8 or 16 rows tiles of 8 against one panel at a
  // time (16 accumulators): the weights then stream once per 8 rows, not once per 6 plus a thin remainder tile.
  // Tiles of 8 win at exactly these row counts (weights from memory); at 4-5 and 12 rows they lose.
  const int MR = M == 7 || M == 8 || M == 16 ? 8 : 6;
  // KC in k pairs; MC in row tiles (516 rows: x of a long prompt stays in L2 per pass over the weights).
  // Against 4 pairs x 256 k pairs without MC: a little ahead at 32-64 rows, well ahead on long prompts of a long K.
  constexpr int64_t kPairsPerBlock = 2, kMC = 86;
  const int64_t KP = K / 2;
  const std::vector<PanelPair> pairs = panel_pairs(nparts, w, n, bias, K * kNP);
  const int64_t G = (int64_t)pairs.size(), ntiles = (M + MR - 1) / MR;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, std::max(G, ntiles)));
  // bf16 x with 4-byte aligned rows is read where it lies (each tile row a stream of pairs); else packed first.
  const bool direct = x_dtype == kBF16 && ldx % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0;
  thread_local std::vector<uint32_t> xbuf;
  if (!direct && (int64_t)xbuf.size() < M * KP) xbuf.resize(M * KP);
  uint32_t* xp = xbuf.data();
#pragma omp parallel for num_threads(nt) if (!direct)
  for (int64_t t = 0; t < (direct ? 0 : ntiles); ++t) {
    const int64_t m0 = t * MR, r = std::min<int64_t>(MR, M - m0);
    uint32_t* d = xp + m0 * KP;
    for (int64_t m = 0; m < r; ++m) {
      if (x_dtype == kBF16) {  // the pairs as they lie (the common case: a bf16 model)
        const uint16_t* row = static_cast<const uint16_t*>(x) + (m0 + m) * ldx;
        for (int64_t q = 0; q < KP; ++q) std::memcpy(d + q * r + m, row + 2 * q, 4);
        continue;
      }
      for (int64_t q = 0; q < KP; ++q) {
        const int64_t i = (m0 + m) * ldx + 2 * q;
        d[q * r + m] = uint32_t(x_bf16(x, x_dtype, i)) | uint32_t(x_bf16(x, x_dtype, i + 1)) << 16;
      }
    }
  }
  const int64_t nk = (KP + kMaxKC - 1) / kMaxKC, KC = (KP + nk - 1) / nk;
  blocked_loop(G, ntiles, KP, KC, kPairsPerBlock, kMC, nt, [&](int64_t t, int64_t g, int64_t k0, int64_t kc) {
    const int64_t m0 = t * MR, r = std::min<int64_t>(MR, M - m0);
    const PanelPair& q = pairs[g];
    const uint16_t* w0 = q.w + k0 * kPanelPair;
    const uint32_t* xt = direct ? static_cast<const uint32_t*>(x) + m0 * (ldx / 2) + k0 : xp + m0 * KP + k0 * r;
    const int64_t xs = direct ? ldx / 2 : 1, xk = direct ? 1 : r;
    float* o = out ? out + m0 * N + q.col : nullptr;
    uint16_t* o16 = out16 && k0 + kc == KP ? out16 + m0 * N + q.col : nullptr;
    if (MR == 6) {
      tile_rows<6>((int)r, xt, xs, xk, w0, q.nv[1] ? w0 + K * kNP : nullptr, kc, o, N, k0 > 0, q.bias, q.nv, o16);
      return;
    }
    for (int c = 0; c < (q.nv[1] ? 2 : 1); ++c)
      tile_rows<8>((int)r, xt, xs, xk, w0 + c * K * kNP, nullptr, kc, o ? o + c * kNP : nullptr, N, k0 > 0,
                   q.bias ? q.bias + c * kNP : nullptr, q.nv + c, o16 ? o16 + c * kNP : nullptr);
  });
}

#pragma GCC pop_options

}  // namespace

extern "C" {

// w [N][K] bf16 (row stride ldw, K even) -> dst (ceil(N / 32) * K * 32 bf16) in pair panels, over nthreads.
// Returns 0, or -1 if this CPU lacks AVX512-BF16 (the layout's only reader) or K is odd.
int hk_pack_dot_panels(const uint16_t* w, int64_t N, int64_t K, int64_t ldw, uint16_t* dst, int nthreads) {
  if (!hk::cpu_has_bf16_dot() || K % 2) return -1;
  const int64_t P = (N + kNP - 1) / kNP;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, P));
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    pack_range(w, N, K, ldw, dst, P * t / T, P * (t + 1) / T);
  }
  return 0;
}

// out [M][ldo = sum n] (fp32) = x [M][K] (row stride ldx; f32 / bf16 / f16, rounded to bf16) . cat(parts)^T
// (+ bias), each part's weight in pair panels (w[i]: n[i] rows). Returns 0, or -1 as hk_pack_dot_panels.
int hk_linear_dot_panels(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                         const void* const* w, const int64_t* n, const float* bias, float* out, int nthreads) {
  if (!hk::cpu_has_bf16_dot() || K % 2) return -1;
  if (M <= 0) return 0;
  int64_t N = 0;
  for (int64_t i = 0; i < nparts; ++i) N += n[i];
  linear_dot(x, x_dtype, M, K, ldx, nparts, w, n, bias, out, nullptr, N, nthreads);
  return 0;
}
}  // extern "C"

namespace hk_family {

// As hk_linear_dot_panels with out [M][sum n] in bf16 (the fp32 sums rounded once, to nearest even): a bf16 model's
// GEMM without an fp32 output and a conversion pass over it (3% of a 512-token prefill).
int dense_dot_panels_bf16(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                          const void* const* w, const int64_t* n, const float* bias, uint16_t* out, int nthreads) {
  if (!hk::cpu_has_bf16_dot() || K % 2 || x_dtype < 0 || x_dtype > 2 || nparts < 1) return -1;
  if (M <= 0) return 0;
  int64_t N = 0;
  for (int64_t i = 0; i < nparts; ++i) N += n[i];
  float* partial = nullptr;  // the sums of K blocks before the last (K over one block)
  thread_local std::vector<float> buf;
  if (K / 2 > kMaxKC) {
    if ((int64_t)buf.size() < M * N) buf.resize(M * N);
    partial = buf.data();
  }
  linear_dot(x, x_dtype, M, K, ldx, nparts, w, n, bias, partial, out, N, nthreads);
  return 0;
}

}  // namespace hk_family
