// hearth decode-shape linear kernels: y = x w^T (+ b) for bf16 / f16 / f32 weights, fp32 accumulate.
// Built without -march: each ISA body is compiled under its own `#pragma GCC target` and chosen at run time by
// the caller (Python reads the CPU flags); the generic code here uses no vector instructions beyond the baseline.
// Deliberately free of torch headers (they alone would dominate the compile): a C ABI called through ctypes with data
// pointers; threads are OpenMP regions on torch's own libgomp (same soname, already loaded), sized by the caller
// from torch.get_num_threads().
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"
#include "simd_avx2.h"
#include "parallel.h"
#include "hk_api.h"

enum class WKind { kBF16, kF16, kF32, kBF16Dot };

using hk::kBF16, hk::kF16, hk::kF32;  // (w_dtype past them: kBF16Panels, kBF16DotPanels in hk_api.h)

struct Problem {
  const float* x;  // packed: [M][K] fp32, full chunks deinterleaved (bf16 weights), tail in natural order
  const void* w;   // [N][ldw] weights, unit stride along K
  int64_t ldw;
  const float* bias;  // [N] or nullptr
  float* out;         // [M][ldo]
  int64_t M, N, K;
  int64_t kblock_chunks;  // K block in chunks; 0 = whole K
  WKind wkind;
  int64_t ldo;
};

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace hk_avx2 {
struct T {
  using V = __m256;
  static constexpr int L = 8;
  static constexpr int kMR = 2, kNR = 4;  // 16 ymm: 8 accumulators, 4 x, 2 weights
  static constexpr int kNR1 = 8;          // M == 1: 8 row streams in flight (run_rows; M = 2: 4, M = 3, 4: 2)
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V add(V a, V b) { return _mm256_add_ps(a, b); }
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline float hsum(V v) { return hk::hsum8(v); }
  // The L sums of the L consecutive L-float vectors at p (a transpose-add: 8 x 8 in 16 shuffles and 7 adds).
  static inline V reduce_rows(const float* p) {
    V s[4], t[2];
    for (int i = 0; i < 4; ++i) {
      const V a = _mm256_loadu_ps(p + 16 * i), b = _mm256_loadu_ps(p + 16 * i + 8);
      s[i] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));  // per 128-bit lane: 2i, 2i+1, ..
    }
    for (int i = 0; i < 2; ++i) {
      const __m256d a = _mm256_castps_pd(s[2 * i]), b = _mm256_castps_pd(s[2 * i + 1]);
      t[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }  // t[i]: per 128-bit lane outputs 4i .. 4i + 3
    return _mm256_add_ps(_mm256_permute2f128_ps(t[0], t[1], 0x20), _mm256_permute2f128_ps(t[0], t[1], 0x31));
  }
  static inline void load_bf16(const uint16_t* p, V& lo, V& hi) {
    __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xFFFF0000u))));
  }
  static inline void load_f16(const uint16_t* p, V& lo, V& hi) {
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  static inline void load_f32(const float* p, V& lo, V& hi) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
};
#include "linear_impl.h"
}  // namespace hk_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")
namespace hk_avx512 {
struct T {
  using V = __m512;
  static constexpr int L = 16;
  static constexpr int kMR = 4, kNR = 4;  // 32 zmm: 16 accumulators, 8 x, 2 weights
  static constexpr int kNR1 = 8;
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V add(V a, V b) { return _mm512_add_ps(a, b); }
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
  // The L sums of the L consecutive L-float vectors at p (a transpose-add: 16 x 16 in 30 shuffles and 15 adds).
  static inline V reduce_rows(const float* p) {
    V s[8], t[4], u[2];
    for (int i = 0; i < 8; ++i) {
      const V a = _mm512_loadu_ps(p + 32 * i), b = _mm512_loadu_ps(p + 32 * i + 16);
      s[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // per 128-bit lane: 2i, 2i+1, ..
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
      t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }  // t[i]: per 128-bit lane partial sums of outputs 4i .. 4i + 3
    for (int i = 0; i < 2; ++i)  // u[i]: lanes [4(2i).. A, B, 4(2i+1).. A, B]
      u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  }
  static inline void load_bf16(const uint16_t* p, V& lo, V& hi) {
    __m512i w = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  static inline void load_f16(const uint16_t* p, V& lo, V& hi) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  }
  static inline void load_f32(const float* p, V& lo, V& hi) {
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
};
#include "linear_impl.h"
}  // namespace hk_avx512
#pragma GCC pop_options

// AVX-512 with AVX512-BF16: hk_avx512's body plus the WBF16Dot kind, for
// bf16 x against bf16 weights (vdpbf16ps). Chosen in hk_family::dense_rows by __builtin_cpu_supports.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")
namespace hk_avx512bf16 {
struct T : hk_avx512::T {
  static inline V dot_bf16(V acc, V x, V w) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
};
#define HK_LINEAR_BF16_DOT 1
#include "linear_impl.h"
#undef HK_LINEAR_BF16_DOT
}  // namespace hk_avx512bf16
#pragma GCC pop_options


namespace {
constexpr int kISA_AVX2 = 1, kISA_AVX512 = 2;

// bf16 x . bf16 weights in vdpbf16ps where the CPU has it (hk_linear_set_bf16_dot(0): the fp32 FMA kernel instead).
bool g_bf16_dot = true;
bool bf16_dot_here() { return hk::cpu_has_bf16_dot() && g_bf16_dot; }

using hk_par::parallel;
using hk_par::parallel_dynamic;
}  // namespace

extern "C" {

// Whether bf16 x . bf16 weights run in vdpbf16ps where the CPU has AVX512-BF16 (1, default) or in fp32 FMAs (0).
// Returns 1 if the dot form runs here after the call.
int hk_linear_set_bf16_dot(int on) {
  g_bf16_dot = on != 0;
  return bf16_dot_here() ? 1 : 0;
}

int hk_linear_panels(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                     const void* const* w, const int64_t* n, const float* bias, float* out, int nthreads);
int hk_linear_dot_panels(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                         const void* const* w, const int64_t* n, const float* bias, float* out, int nthreads);

}  // extern "C"

namespace hk_family {

// hk_linear on dense weights: out[M][N] (fp32) = x[M][K] (row stride ldx, dtype x_dtype) . w^T + bias, w's rows in
// nparts pieces (w[p]: [n[p]][ldw], N = sum n[p]), e.g. q/k/v kept as the checkpoint stores them: x is packed once
// and one parallel region covers every part's rows, so a split weight costs what a merged one does. w_dtype 0-2:
// rows in f32 / bf16 / f16; 3: bf16 panels (panel.cpp, AVX-512 only); 4: bf16 pair panels (panel_dot.cpp,
// AVX512-BF16 only). isa: 1 = AVX2+FMA+F16C, 2 = AVX-512F/BW. kblock: K block in elements, 0 = auto (fit L1/L2).
int dense_rows(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
               const void* const* w, const int64_t* n, int w_dtype, int64_t ldw, const float* bias, float* out,
               int isa, int64_t kblock, int nthreads) {
  if (isa != kISA_AVX2 && isa != kISA_AVX512) return -1;
  if (w_dtype == kBF16Panels) {  // bf16 in 32-row panels (panel.cpp): AVX-512 only
    if (isa != kISA_AVX512 || x_dtype < 0 || x_dtype > 2 || nparts < 1) return -4;
    return hk_linear_panels(x, x_dtype, M, K, ldx, nparts, w, n, bias, out, nthreads);
  }
  if (w_dtype == kBF16DotPanels) {  // bf16 in pair panels (panel_dot.cpp): AVX512-BF16 only
    if (isa != kISA_AVX512 || x_dtype < 0 || x_dtype > 2 || nparts < 1) return -4;
    return hk_linear_dot_panels(x, x_dtype, M, K, ldx, nparts, w, n, bias, out, nthreads) ? -5 : 0;
  }
  if (x_dtype < 0 || x_dtype > 2 || w_dtype < 0 || w_dtype > 2) return -2;
  if (nparts < 1 || nparts > 8) return -3;
  int64_t N = 0;
  for (int64_t i = 0; i < nparts; ++i) N += n[i];
  if (M <= 0 || N <= 0) return 0;
  const bool avx512 = isa == kISA_AVX512;
  const bool dot = avx512 && w_dtype == kBF16 && x_dtype == kBF16 && bf16_dot_here();
  const WKind wk = dot ? WKind::kBF16Dot : w_dtype == kBF16 ? WKind::kBF16 : w_dtype == kF16 ? WKind::kF16 : WKind::kF32;
  const int64_t ch = avx512 ? 32 : 16;
  std::vector<float> xp(M * K);
  if (dot)
    hk_avx512bf16::pack_x(x, x_dtype, M, K, ldx, false, xp.data(), true);
  else if (avx512)
    hk_avx512::pack_x(x, x_dtype, M, K, ldx, wk == WKind::kBF16, xp.data());
  else
    hk_avx2::pack_x(x, x_dtype, M, K, ldx, wk == WKind::kBF16, xp.data());
  const int64_t rows = avx512 ? hk_avx512::rows_per_chunk(M) : hk_avx2::rows_per_chunk(M);
  const int64_t kb = kblock > 0 ? std::max<int64_t>(kblock / ch, 1) : 0;
  Problem p[8];
  int64_t first_chunk[9] = {0};
  for (int64_t i = 0, col = 0; i < nparts; col += n[i], ++i) {
    p[i] = Problem{xp.data(), w[i], ldw, bias ? bias + col : nullptr, out + col, M, n[i], K, kb, wk, N};
    first_chunk[i + 1] = first_chunk[i] + (n[i] + rows - 1) / rows;
  }
  auto chunks = [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < nparts; ++i) {
      const int64_t b = std::max(c0, first_chunk[i]), e = std::min(c1, first_chunk[i + 1]);
      if (b >= e) continue;
      if (dot)
        hk_avx512bf16::run(p[i], b - first_chunk[i], e - first_chunk[i]);
      else if (avx512)
        hk_avx512::run(p[i], b - first_chunk[i], e - first_chunk[i]);
      else
        hk_avx2::run(p[i], b - first_chunk[i], e - first_chunk[i]);
    }
  };
  const int64_t total = first_chunk[nparts];
  if (M == 1)  // row streams: ~16 chunks of rows per thread, taken as threads free up (see parallel_dynamic)
    parallel_dynamic(total, std::max<int64_t>(64, (total / (16 * std::max(1, nthreads)) + 7) / 8 * 8), nthreads,
                     chunks);
  else
    parallel(total, nthreads, chunks);
  return 0;
}

}  // namespace hk_family
