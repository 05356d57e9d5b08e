// 16-bit weights -> float32 for prefill GEMMs (torch's Tensor.float() on bf16 is single-threaded and slow enough
// to be a visible part of a prefill). bf16 is a 16-bit shift, f16 uses F16C.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "scalar.h"
#include "simd_avx2.h"

namespace {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
void widen_range(const uint16_t* src, int dtype, float* dst, int64_t b, int64_t e) {
  int64_t i = b;
  if (dtype == 1) {  // bf16
    for (; i + 8 <= e; i += 8) _mm256_storeu_ps(dst + i, hk::load_bf16x8(src + i));
    for (; i < e; ++i) dst[i] = hk::bf16_to_f32(src[i]);
  } else {  // f16
    for (; i + 8 <= e; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < e; ++i) dst[i] = hk::f16_to_f32(src[i]);
  }
}
#pragma GCC pop_options

}  // namespace

extern "C" {

// dst[n] (fp32) = src[n] (dtype 1 = bf16, 2 = f16), split over nthreads. Returns 0, or 1 for a bad dtype.
int hk_widen(const void* src, int dtype, int64_t n, float* dst, int nthreads) {
  if (dtype != 1 && dtype != 2) return 1;
  const auto* s = static_cast<const uint16_t*>(src);
  const int64_t grain = 1 << 16;
  const int64_t parts = (n + grain - 1) / grain;
  const int nt = (int)(parts < nthreads ? (parts > 0 ? parts : 1) : nthreads);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t per = (n + T - 1) / T;
    const int64_t b = t * per, e = b + per < n ? b + per : n;
    if (b < e) widen_range(s, dtype, dst, b, e);
  }
  return 0;
}

}  // extern "C"
