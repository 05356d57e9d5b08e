// bf16 weights packed into 32-row panels, and the decode GEMM that reads them (AVX-512 only).
//
// Layout: a weight W [N][K] becomes P = ceil(N / 32) panels [P][K][32] (bf16). At (p, k) the 32 values are 16
// 32-bit lanes; lane i holds W[32p + i][k] in its low half and W[32p + 16 + i][k] in its high half, so one 64-byte
// load gives both output halves as fp32 with one shift (low) and one and (high). Rows past N are zero.
//
// GEMM (y[M][N] = x[M][K] . W^T): broadcast form. For each k, the MR (<= 12) x values of a row tile are broadcast
// from memory straight into the FMAs ({1to16} operands; an explicit vbroadcastss costs a port-5 uop on this CPU),
// times the panel's two fp32 weight vectors, into 2 x MR accumulators. Per k: 2 MR FMAs for one weight load and two
// conversion ops, no horizontal reductions, and the weights stream as one sequential run per thread (software
// prefetch 2 KiB ahead). Against the row-dot kernel in linear.cpp on Qwen2.5-0.5B's gate_up (4864 x 896), bf16,
// 2 threads, weights from memory (alternated in one process, 2-vCPU Skylake-SP): M = 4 0.88 -> 0.60 ms,
// M = 8 1.56 -> 0.87, M = 16 2.59 -> 1.66, M = 32 4.85 -> 3.35; M = 1 at parity.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16.h"

namespace {

constexpr int kNP = 32;      // outputs per panel
constexpr int kMaxMR = 12;   // x rows per register tile: 24 accumulators + 2 weight vectors
constexpr int kPrefetch = 32;  // k steps (64 bytes each) ahead
constexpr int kStreams = 4;    // M = 1: panels read in lockstep

enum DType { kF32 = 0, kBF16 = 1, kF16 = 2 };

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

// acc (+)= xt . panel over kc steps, stored to out (row stride ldo; nvalid of the 32 columns). xt: the tile's x
// values k-major, each k's MR values twice ([k][2][MR]) so the two FMAs of a row read different addresses and the
// compiler keeps both as broadcast memory operands instead of loading the value once into a register.
template <int MR>
inline void micro(const float* __restrict xt, const uint16_t* __restrict wp, int64_t kc, float* __restrict out,
                  int64_t ldo, bool accumulate, const float* bias, int nvalid) {
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
  const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : __mmask16((1u << nvalid) - 1);
  const __mmask16 m1 = nvalid >= 32 ? 0xFFFF : nvalid <= 16 ? 0 : __mmask16((1u << (nvalid - 16)) - 1);
  for (int m = 0; m < MR; ++m) {
    float* o = out + m * ldo;
    if (accumulate) {
      a0[m] = _mm512_add_ps(a0[m], _mm512_maskz_loadu_ps(m0, o));
      a1[m] = _mm512_add_ps(a1[m], _mm512_maskz_loadu_ps(m1, o + 16));
    } else if (bias) {
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
    const __mmask16 m0 = nvalid[s] >= 16 ? 0xFFFF : __mmask16((1u << nvalid[s]) - 1);
    const __mmask16 m1 = nvalid[s] >= 32 ? 0xFFFF : nvalid[s] <= 16 ? 0 : __mmask16((1u << (nvalid[s] - 16)) - 1);
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
                       bool accumulate, const float* bias, int nvalid) {
  if constexpr (MR >= 1) {
    if (mr == MR) return micro<MR>(xt, wp, kc, out, ldo, accumulate, bias, nvalid);
    return micro_rows<MR - 1>(mr, xt, wp, kc, out, ldo, accumulate, bias, nvalid);
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
      const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : __mmask16((1u << nvalid) - 1);
      const __mmask16 m1 = nvalid >= 32 ? 0xFFFF : nvalid <= 16 ? 0 : __mmask16((1u << (nvalid - 16)) - 1);
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
// 32-bit values, then a 16 x 16 transpose of those gives the 16 k vectors (~10 GB/s, vs ~1 GB/s scalar).
void pack_range(const uint16_t* w, int64_t N, int64_t K, int64_t ldw, uint16_t* dst, int64_t p0, int64_t p1) {
  const int64_t K16 = K / 16 * 16;
  for (int64_t p = p0; p < p1; ++p) {
    uint16_t* d = dst + p * K * kNP;
    for (int64_t k0 = 0; k0 < K16; k0 += 16) {
      __m512i r[16], t[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t n0 = p * kNP + i, n1 = n0 + 16;
        const __m512i a = n0 < N ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + n0 * ldw + k0)))
                                 : _mm512_setzero_si512();
        const __m512i b = n1 < N ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + n1 * ldw + k0)))
                                 : _mm512_setzero_si512();
        r[i] = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));  // [k] = row n0's value | row n1's << 16
      }
      for (int j = 0; j < 8; ++j) {
        t[2 * j] = _mm512_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
        t[2 * j + 1] = _mm512_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
      }
      for (int j = 0; j < 4; ++j) {  // r[4j + q], 128-bit lane L: column 4L + q of rows 4j .. 4j + 3
        r[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        r[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        r[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        r[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
      }
      for (int q = 0; q < 4; ++q) {  // a 4 x 4 transpose of 128-bit lanes
        const __m512i v0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x44), v1 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xEE);
        _mm512_storeu_si512(d + (k0 + q) * kNP, _mm512_shuffle_i32x4(v0, v2, 0x88));
        _mm512_storeu_si512(d + (k0 + 4 + q) * kNP, _mm512_shuffle_i32x4(v0, v2, 0xDD));
        _mm512_storeu_si512(d + (k0 + 8 + q) * kNP, _mm512_shuffle_i32x4(v1, v3, 0x88));
        _mm512_storeu_si512(d + (k0 + 12 + q) * kNP, _mm512_shuffle_i32x4(v1, v3, 0xDD));
      }
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
  return dtype == kBF16 ? hk::bf16_to_f32(h) : _cvtsh_ss(h);
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
  // Row tiles of near-equal size (M = 16: 8 + 8, not 12 + 4), packed k-major with each value twice (see micro).
  const int64_t ntiles = (M + kMaxMR - 1) / kMaxMR;
  std::vector<int64_t> t0(ntiles + 1, 0);
  for (int64_t t = 0; t < ntiles; ++t) t0[t + 1] = t0[t] + M / ntiles + (t < M % ntiles);
  thread_local std::vector<float> xbuf;
  if ((int64_t)xbuf.size() < 2 * M * K) xbuf.resize(2 * M * K);
  float* xp = xbuf.data();
  for (int64_t t = 0; t < ntiles; ++t) {
    const int64_t r = t0[t + 1] - t0[t];
    float* d = xp + 2 * t0[t] * K;
    for (int64_t m = 0; m < r; ++m) {
      const int64_t row = (t0[t] + m) * ldx;
      for (int64_t k = 0; k < K; ++k) d[2 * k * r + m] = d[2 * k * r + r + m] = load_x(x, x_dtype, row + k);
    }
  }
  // K blocks keep every tile's x block within ~256 KiB of L2 while a panel's block is reused across the tiles.
  const int64_t KC = ntiles == 1 ? K : std::max<int64_t>(64, std::min<int64_t>(K, (256 << 10) / (8 * M)));
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, total));
  auto part_of = [&](int64_t g) { return int64_t(std::upper_bound(first.begin(), first.end(), g) - first.begin()) - 1; };
  if (ntiles == 1) {
    // One row tile, whole K: panels are independent, handed out in chunks as threads free up (a thread that got
    // less memory bandwidth does not hold the other at the end; same results whichever thread runs a panel).
    const int r = (int)M;
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
        micro_rows<kMaxMR>(r, xp, wp[0], K, o[0], N, false, bp[0], nv[0]);
      }
    }
    return 0;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t th = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t b = total * th / T, e = total * (th + 1) / T;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = std::min(KC, K - k0);
      for (int64_t i = 0, g = b; i < nparts && g < e; ++i) {
        const auto* wi = static_cast<const uint16_t*>(w[i]);
        for (; g < std::min(e, first[i + 1]); ++g) {
          const int64_t p = g - first[i];
          const int nvalid = (int)std::min<int64_t>(kNP, n[i] - p * kNP);
          const float* bp = bias ? bias + col[i] + p * kNP : nullptr;
          for (int64_t t = 0; t < ntiles; ++t) {
            const int r = (int)(t0[t + 1] - t0[t]);
            micro_rows<kMaxMR>(r, xp + 2 * (t0[t] * K + k0 * r), wi + (p * K + k0) * kNP, kc,
                               out + t0[t] * N + col[i] + p * kNP, N, k0 > 0, bp, nvalid);
          }
        }
      }
    }
  }
  return 0;
}

}  // extern "C"
