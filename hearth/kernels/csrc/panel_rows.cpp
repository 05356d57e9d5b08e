// bf16 pair panels (panel_dot.cpp's layout) back to row-major bf16, a range of rows at a time: the weight tiles a
// long prompt's GEMM hands to torch's bf16 GEMM on CPUs with AMX tiles, which run it several times faster than
// vdpbf16ps. Per panel, [K / 2][32] 32-bit pairs transposed 16 x 16 at a time into its 32 rows' [K / 2] pairs.
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

constexpr int kNP = 32;  // rows per panel

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

#include "panel_common.h"

// Rows [32 p, 32 p + 32) (those below N) of panel p into dst rows (row stride K, dst row 0 = weight row r0).
void panel_to_rows(const uint32_t* panel, int64_t p, int64_t N, int64_t K, int64_t r0, uint32_t* dst) {
  const int64_t KP = K / 2;
  for (int half = 0; half < 2; ++half) {
    const int64_t row0 = p * kNP + 16 * half;
    const int nrows = (int)std::min<int64_t>(16, N - row0);
    if (nrows <= 0) break;
    int64_t kp = 0;
    for (; kp + 16 <= KP; kp += 16) {
      __m512i r[16], c[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(panel + (kp + j) * kNP + 16 * half);
      transpose16_epi32(r, c);
      for (int i = 0; i < nrows; ++i) _mm512_storeu_si512(dst + (row0 + i - r0) * KP + kp, c[i]);
    }
    for (; kp < KP; ++kp)
      for (int i = 0; i < nrows; ++i) dst[(row0 + i - r0) * KP + kp] = panel[kp * kNP + 16 * half + i];
  }
}

#pragma GCC pop_options

}  // namespace

extern "C" {

// Rows [r0, r1) of a weight of N rows x K (K even) held in bf16 pair panels w -> dst [r1 - r0][K] bf16, over
// nthreads (r0 a multiple of 32). Returns 0, -1 without AVX-512 BW, -2 for a range it does not take.
int hk_dot_panels_to_rows(const uint16_t* w, int64_t N, int64_t K, int64_t r0, int64_t r1, uint16_t* dst,
                          int nthreads) {
  if (!hk::cpu_has_avx512bw()) return -1;
  if (K % 2 || r0 % kNP || r0 < 0 || r1 > N || r1 <= r0) return -2;
  const auto* src = reinterpret_cast<const uint32_t*>(w);
  auto* out = reinterpret_cast<uint32_t*>(dst);
  const int64_t p0 = r0 / kNP, p1 = (r1 + kNP - 1) / kNP, panel_words = K / 2 * kNP;
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, p1 - p0));
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t p = p0; p < p1; ++p) panel_to_rows(src + p * panel_words, p, r1, K, r0, out);
  return 0;
}

}  // extern "C"
