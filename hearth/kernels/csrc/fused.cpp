// hearth fused element-wise kernels: the small ops between the matmuls of a decoder layer, one C call each
// instead of 5-15 torch ops. At decode shapes (a few tokens of a few thousand channels) the torch ops cost far more
// in dispatch than in arithmetic; at prefill shapes these loops are memory-bound and parallel over rows.
//   hk_rms_norm      (x [+ residual]) -> normalized * (weight + offset), and the sum as the new residual
//   hk_rope_neox     q, k rotated in place (rotate_half layout, first `rot` dims of each head)
//   hk_act_and_mul   act(gate) * up for x = [gate | up] (silu, gelu-tanh)
//   hk_kv_write      this step's K/V rows into their paged-cache slots (both caches in one call)
//   hk_sample        one token per row drawn from softmax(logits / T) by inverting its cumulative distribution
//   hk_argmax        each row's greedy token, as torch.argmax picks it
// Math is fp32 like the torch code it replaces (same rounding points: the residual sum is rounded to the model
// dtype before it is normalized, outputs once at the end).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"
#include "simd_avx2.h"
#include "simd_avx512.h"
#include "hk_api.h"

// NOTE: the whole file is AVX2+FMA+F16C code: Python calls it only when hearth.kernels.isa() found those.
#pragma GCC target("avx2,fma,f16c")

namespace {

using hk::kBF16, hk::kF16, hk::kF32;
using hk::bf16_to_f32, hk::f16_to_f32, hk::f32_to_bf16, hk::f32_to_f16;

template <int D>
inline float load(const void* p, int64_t i) {
  if constexpr (D == kF32) return static_cast<const float*>(p)[i];
  if constexpr (D == kBF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

template <int D>
inline void store(void* p, int64_t i, float v) {
  if constexpr (D == kF32) static_cast<float*>(p)[i] = v;
  else if constexpr (D == kBF16) static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  else static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
}

// Rounds through the model dtype, as torch does when it stores an intermediate in that dtype.
template <int D>
inline float round_to(float v) {
  if constexpr (D == kF32) return v;
  if constexpr (D == kBF16) return bf16_to_f32(f32_to_bf16(v));
  return f16_to_f32(f32_to_f16(v));
}

// Parallel only when the work pays for waking the team (prefill); decode runs on the calling thread.
inline int team(int64_t elems, int threads) { return elems >= (1 << 15) ? threads : 1; }

// ---- 8 lanes at a time: the same values as load / store / round_to above ----
template <int D>
inline __m256 load8(const void* p, int64_t i) {
  if constexpr (D == kF32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  if constexpr (D == kBF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

using hk::bf16_high8;

template <int D>
inline __m256 round8(__m256 v) {
  if constexpr (D == kF32) return v;
  if constexpr (D == kBF16) return _mm256_castsi256_ps(bf16_high8(v));
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

template <int D>
inline void store8(void* p, int64_t i, __m256 v) {
  if constexpr (D == kF32) {
    _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  } else {
    __m128i h;
    if constexpr (D == kBF16) {
      const __m256i r = _mm256_srli_epi32(bf16_high8(v), 16);
      h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
    } else {
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), h);
  }
}

using hk::hsum8;

// ---- RMSNorm with optional residual add ----
// x, residual: [T][H] rows at stride ldx / ldr; out, sum_out: [T][H] contiguous; weight: fp32 [H].
template <int D>
void rms_norm(const void* x, int64_t ldx, const void* residual, int64_t ldr, const float* weight, float offset,
              float eps, void* out, void* sum_out, int64_t T, int64_t H, int threads) {
#pragma omp parallel for num_threads(team(T * H, threads)) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float buf[8192];
    float* h = H <= 8192 ? buf : new float[H];
    __m256 ss8 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= H; i += 8) {
      __m256 v = load8<D>(x, t * ldx + i);
      if (residual) {
        v = round8<D>(_mm256_add_ps(v, load8<D>(residual, t * ldr + i)));
        store8<D>(sum_out, t * H + i, v);
      }
      _mm256_storeu_ps(h + i, v);
      ss8 = _mm256_fmadd_ps(v, v, ss8);
    }
    float ss = hsum8(ss8);
    for (; i < H; ++i) {
      float v = load<D>(x, t * ldx + i);
      if (residual) {
        v = round_to<D>(v + load<D>(residual, t * ldr + i));
        store<D>(sum_out, t * H + i, v);
      }
      h[i] = v;
      ss += v * v;
    }
    float inv = 1.0f / std::sqrt(ss / float(H) + eps);
    const __m256 inv8 = _mm256_set1_ps(inv), off8 = _mm256_set1_ps(offset);
    for (i = 0; i + 8 <= H; i += 8)
      store8<D>(out, t * H + i,
                _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(h + i), inv8), _mm256_add_ps(_mm256_loadu_ps(weight + i), off8)));
    for (; i < H; ++i) store<D>(out, t * H + i, h[i] * inv * (weight[i] + offset));
    if (h != buf) delete[] h;
  }
}

// ---- rotary embedding, rotate_half (GPT-NeoX) layout ----
// q: [T] rows of Hq heads, token stride ldq, head stride D; k likewise. cos/sin: fp32 [rows][rot/2]; rows[t] picks
// each token's table row. Dims past rot are left as they are.
template <int D>
void rope_neox(void* q, int64_t ldq, int64_t Hq, void* k, int64_t ldk, int64_t Hk, int64_t head_dim, int64_t rot,
               const float* cos, const float* sin, const int64_t* rows, int64_t T, int threads) {
  const int64_t half = rot / 2;
#pragma omp parallel for num_threads(team(T * (Hq + Hk) * rot, threads)) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos + rows[t] * half;
    const float* s = sin + rows[t] * half;
    for (int which = 0; which < 2; ++which) {
      void* base = which ? k : q;
      const int64_t ld = which ? ldk : ldq, nh = which ? Hk : Hq;
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t o = t * ld + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float x1 = load<D>(base, o + i), x2 = load<D>(base, o + half + i);
          store<D>(base, o + i, x1 * c[i] - x2 * s[i]);
          store<D>(base, o + half + i, x2 * c[i] + x1 * s[i]);
        }
      }
    }
  }
}

using hk::exp8;  // (simd_avx2.h: the one exp, shared with attention)

template <int A>
inline __m256 act8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  if constexpr (A == 0) {  // silu: g / (1 + e^-g)
    return _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
  }
  // gelu (tanh form): 0.5 g (1 + tanh(y)) = g - g / (e^{2y} + 1), y = sqrt(2/pi) (g + 0.044715 g^3)
  __m256 y = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                           _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g), _mm256_mul_ps(g, g), g));
  __m256 e = exp8(_mm256_add_ps(y, y));
  return _mm256_sub_ps(g, _mm256_div_ps(g, _mm256_add_ps(e, one)));
}

// ---- the same on 16 lanes (AVX-512F/BW), for CPUs that have it: same polynomial, same rounding points, so the
// same values as the 8-lane body, at about twice its rate on a prompt's [T, 2 x intermediate].
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")

template <int D>
inline __m512 load16(const void* p, int64_t i) {
  if constexpr (D == kF32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
  if constexpr (D == kBF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

using hk::bf16_high16;  // (simd_avx512.h: bf16_high8 on 16 lanes)

template <int D>
inline __m512 round16(__m512 v) {
  if constexpr (D == kF32) return v;
  if constexpr (D == kBF16) return _mm512_castsi512_ps(bf16_high16(v));
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

template <int D>
inline void store16(void* p, int64_t i, __m512 v) {
  if constexpr (D == kF32) {
    _mm512_storeu_ps(static_cast<float*>(p) + i, v);
  } else {
    __m256i h;
    if constexpr (D == kBF16) h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_high16(v), 16));
    else h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p) + i), h);
  }
}

using hk::exp16;

template <int A>
inline __m512 act16(__m512 g) {  // act8's formulas
  const __m512 one = _mm512_set1_ps(1.0f);
  if constexpr (A == 0) return _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
  __m512 y = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                           _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), g), _mm512_mul_ps(g, g), g));
  __m512 e = exp16(_mm512_add_ps(y, y));
  return _mm512_sub_ps(g, _mm512_div_ps(g, _mm512_add_ps(e, one)));
}

// Columns [0, d / 16 * 16) of act_and_mul's rows; returns where the 8-lane body takes over.
template <int D, int A>
int64_t act_and_mul_row16(const void* x, int64_t xo, void* out, int64_t oo, int64_t d) {
  int64_t i = 0;
  for (; i + 16 <= d; i += 16)
    store16<D>(out, oo + i, _mm512_mul_ps(round16<D>(act16<A>(load16<D>(x, xo + i))), load16<D>(x, xo + d + i)));
  return i;
}
#pragma GCC pop_options


// ---- gated activations: out[t][i] = act(x[t][i]) * x[t][d + i] ----
enum Act { kSilu = 0, kGeluTanh = 1 };

template <int D, int A>
void act_and_mul(const void* x, int64_t ldx, void* out, int64_t T, int64_t d, int threads) {
  const bool wide = hk::cpu_has_avx512bw();
#pragma omp parallel for num_threads(team(T * d, threads)) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    int64_t i = wide ? act_and_mul_row16<D, A>(x, t * ldx, out, t * d, d) : 0;
    for (; i + 8 <= d; i += 8)
      store8<D>(out, t * d + i, _mm256_mul_ps(round8<D>(act8<A>(load8<D>(x, t * ldx + i))), load8<D>(x, t * ldx + d + i)));
    for (; i < d; ++i) {
      // the gate's activation is rounded to the model dtype before the product, as torch's two ops do
      float g = load<D>(x, t * ldx + i), u = load<D>(x, t * ldx + d + i), a;
      if constexpr (A == kSilu) {
        a = g / (1.0f + std::exp(-g));
      } else {
        a = 0.5f * g * (1.0f + std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)));
      }
      store<D>(out, t * d + i, round_to<D>(a) * u);
    }
  }
}

// ---- paged KV-cache write: each new token's K and V rows (all kv heads) into its slot ----
void kv_write(const char* k, int64_t ldk, const char* v, int64_t ldv, char* k_cache, char* v_cache,
              const int64_t* slots, int64_t T, int64_t row_bytes) {
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(k_cache + slots[t] * row_bytes, k + t * ldk, row_bytes);
    std::memcpy(v_cache + slots[t] * row_bytes, v + t * ldv, row_bytes);
  }
}

// ---- sampling: row r's token is the first i whose running sum of e_j = exp((l_j - max) * inv_t) exceeds u * total ----
// (inverse-CDF sampling of softmax(l / T) with one uniform u in [0, 1): torch's softmax + cumsum + searchsorted in
// three passes over the row, no intermediate tensors). Pass 1 the max; pass 2 e into scratch, the sum of each block
// of 8 (8 blocks at a time by a transpose-add) and the total; pass 3 walks the block sums to the block where the
// running sum passes the target u * total, then its entries. Rounding (the walk adds in another order than the
// total) can only leave the target unreached at the end: then the last entry with mass. exp of anything below -87
// is taken as 0, so a token with no mass is never drawn. Returns the token, or -1 when the row has no finite maximum
// or no mass (the caller falls back to torch).

int64_t sample_row(const float* l, int64_t V, float inv_t, float u, std::vector<float>& e, std::vector<float>& bs) {
  const int64_t nb = (V + 7) / 8;
  e.resize(nb * 8);
  bs.resize(nb);
  for (int64_t j = V; j < nb * 8; ++j) e[j] = 0.0f;  // the last block's padding
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(l + i));
  alignas(32) float m8[8];
  _mm256_store_ps(m8, mv);
  float m = -INFINITY;
  for (int j = 0; j < 8; ++j) m = std::max(m, m8[j]);
  for (; i < V; ++i) m = std::max(m, l[i]);
  if (!std::isfinite(m) || !(inv_t > 0.0f) || !std::isfinite(inv_t)) return -1;
  const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(inv_t), lo = _mm256_set1_ps(-87.0f);
  auto exp_at = [&](int64_t j) __attribute__((always_inline)) {
    const __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(l + j), vm), vt);
    const __m256 v = _mm256_and_ps(exp8(x), _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
    _mm256_storeu_ps(e.data() + j, v);
    return v;
  };
  __m256 tv = _mm256_setzero_ps();
  for (i = 0; i + 64 <= V; i += 64) {  // 8 blocks: their sums by a transpose-add (hadd tree), into bs and the total
    const __m256 h0 = _mm256_hadd_ps(exp_at(i), exp_at(i + 8)), h1 = _mm256_hadd_ps(exp_at(i + 16), exp_at(i + 24));
    const __m256 h2 = _mm256_hadd_ps(exp_at(i + 32), exp_at(i + 40)), h3 = _mm256_hadd_ps(exp_at(i + 48), exp_at(i + 56));
    const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
    const __m256 b8 = _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
    _mm256_storeu_ps(bs.data() + i / 8, b8);
    tv = _mm256_add_ps(tv, b8);
  }
  float total = hsum8(tv);
  for (; i + 8 <= V; i += 8) {
    const __m256 v = exp_at(i);
    total += bs[i / 8] = hsum8(v);
  }
  if (i < V) {
    for (int64_t j = i; j < V; ++j) {
      const float x = (l[j] - m) * inv_t;
      e[j] = x >= -87.0f ? std::exp(x) : 0.0f;
    }
    float b = 0.0f;
    for (int j = 0; j < 8; ++j) b += e[i + j];
    total += bs[i / 8] = b;
  }
  if (!(total > 0.0f) || !std::isfinite(total)) return -1;
  const float target = u * total;
  float c = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    if (c + bs[b] <= target && b + 1 < nb) {
      c += bs[b];
      continue;
    }
    int64_t last = -1;
    for (int64_t j = 8 * b; j < std::min(V, 8 * b + 8); ++j) {
      if (e[j] <= 0.0f) continue;
      c += e[j];
      last = j;
      if (c > target) return j;
    }
    if (last >= 0) return last;
    for (int64_t j = std::min(V, 8 * b) - 1; j >= 0; --j)  // (only when the last block had no mass)
      if (e[j] > 0.0f) return j;
    return -1;
  }
  return -1;
}

// argmax of x[j0, j1) as torch.argmax picks it: the first maximal index, and a NaN counts as the maximum (the first
// NaN's index). Returns the index; *nan: a NaN was found. Memory-bound: 8 lanes, each keeping its first maximum
// (strict >), then the smallest index among the lanes holding the largest value; a NaN anywhere (rare) means a
// second pass for the first one.
int64_t argmax_range(const float* x, int64_t j0, int64_t j1, float* best, bool* nan) {
  int64_t j = j0 + 1, bi = j0;
  float bv = x[j0];
  bool any_nan = std::isnan(bv);
  if (j1 - j0 >= 16) {
    __m256 vmax = _mm256_loadu_ps(x + j0), unord = _mm256_cmp_ps(vmax, vmax, _CMP_UNORD_Q);
    __m256i vidx = _mm256_add_epi32(_mm256_set1_epi32((int)j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i cur = vidx;
    const __m256i step = _mm256_set1_epi32(8);
    for (j = j0 + 8; j + 8 <= j1; j += 8) {
      cur = _mm256_add_epi32(cur, step);
      const __m256 v = _mm256_loadu_ps(x + j);
      const __m256 gt = _mm256_cmp_ps(v, vmax, _CMP_GT_OQ);
      unord = _mm256_or_ps(unord, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      vmax = _mm256_blendv_ps(vmax, v, gt);
      vidx = _mm256_blendv_epi8(vidx, cur, _mm256_castps_si256(gt));
    }
    any_nan = _mm256_movemask_ps(unord) != 0;
    alignas(32) float mv[8];
    alignas(32) int32_t mi[8];
    _mm256_store_ps(mv, vmax);
    _mm256_store_si256(reinterpret_cast<__m256i*>(mi), vidx);
    bv = mv[0];
    bi = mi[0];
    for (int l = 1; l < 8; ++l)
      if (mv[l] > bv || (mv[l] == bv && mi[l] < bi)) bv = mv[l], bi = mi[l];
  }
  for (; j < j1; ++j) {  // the tail (indices above every lane's)
    any_nan |= std::isnan(x[j]);
    if (x[j] > bv) bv = x[j], bi = j;
  }
  *nan = any_nan;
  if (any_nan) {
    bi = j0;
    while (!std::isnan(x[bi])) ++bi;
  }
  *best = x[bi];
  return bi;
}

}  // namespace

#define HK_DISPATCH_DTYPE(dtype, CALL)        \
  switch (dtype) {                            \
    case kF32: { constexpr int DT = kF32; CALL; return 0; }   \
    case kBF16: { constexpr int DT = kBF16; CALL; return 0; } \
    case kF16: { constexpr int DT = kF16; CALL; return 0; }   \
    default: return 1;                        \
  }

extern "C" {

int hk_rms_norm(const void* x, int64_t ldx, const void* residual, int64_t ldr, const float* weight, float offset,
                float eps, void* out, void* sum_out, int64_t T, int64_t H, int dtype, int threads) {
  HK_DISPATCH_DTYPE(dtype, rms_norm<DT>(x, ldx, residual, ldr, weight, offset, eps, out, sum_out, T, H, threads))
}

int hk_rope_neox(void* q, int64_t ldq, int64_t Hq, void* k, int64_t ldk, int64_t Hk, int64_t head_dim, int64_t rot,
                 const float* cos, const float* sin, const int64_t* rows, int64_t T, int dtype, int threads) {
  HK_DISPATCH_DTYPE(dtype, rope_neox<DT>(q, ldq, Hq, k, ldk, Hk, head_dim, rot, cos, sin, rows, T, threads))
}

// ldk / ldv in bytes; slot rows are row_bytes apart in the caches.
int hk_kv_write(const void* k, int64_t ldk, const void* v, int64_t ldv, void* k_cache, void* v_cache,
                const int64_t* slots, int64_t T, int64_t row_bytes, int64_t num_slots) {
  for (int64_t t = 0; t < T; ++t)
    if (slots[t] < 0 || slots[t] >= num_slots) return 1;  // never write outside the cache
  kv_write(static_cast<const char*>(k), ldk, static_cast<const char*>(v), ldv, static_cast<char*>(k_cache),
           static_cast<char*>(v_cache), slots, T, row_bytes);
  return 0;
}

// logits: fp32 [n][V] at row stride ld; inv_t (1 / temperature), u: [n]; out: [n] tokens (-1: that row needs the
// torch path).
int hk_sample(const float* logits, int64_t ld, int64_t n, int64_t V, const float* inv_t, const float* u, int64_t* out,
              int threads) {
#pragma omp parallel for num_threads(team(n * V, threads)) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    thread_local std::vector<float> e, bs;
    out[r] = sample_row(logits + r * ld, V, inv_t[r], u[r], e, bs);
  }
  return 0;
}

// out[r] = argmax of logits row r (fp32 [n][V], row stride ld), as torch.argmax(dim=-1). Rows are split into chunks
// so that a batch of one uses every thread too; each chunk's result is combined in index order. Returns 0.
int hk_argmax(const float* logits, int64_t ld, int64_t n, int64_t V, int64_t* out, int threads) {
  if (n <= 0 || V <= 0) return 0;
  const int nt = team(n * V, threads);
  const int64_t chunks = n >= nt ? 1 : (nt + n - 1) / n;  // per row
  const int64_t len = (V + chunks - 1) / chunks;
  std::vector<int64_t> idx(n * chunks);
  std::vector<float> val(n * chunks);
  std::vector<char> nan(n * chunks);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n * chunks; ++i) {
    const int64_t r = i / chunks, j0 = (i % chunks) * len, j1 = std::min(V, j0 + len);
    bool isnan = false;
    if (j0 < j1) idx[i] = argmax_range(logits + r * ld, j0, j1, &val[i], &isnan);
    else idx[i] = -1;
    nan[i] = isnan;
  }
  for (int64_t r = 0; r < n; ++r) {
    int64_t bi = -1;
    float bv = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i = r * chunks + c;
      if (idx[i] < 0) continue;
      if (nan[i]) {
        bi = idx[i];
        break;
      }
      if (bi < 0 || val[i] > bv) bi = idx[i], bv = val[i];
    }
    out[r] = bi;
  }
  return 0;
}

int hk_act_and_mul(const void* x, int64_t ldx, void* out, int64_t T, int64_t d, int act, int dtype, int threads) {
  if (act == kSilu) {
    HK_DISPATCH_DTYPE(dtype, (act_and_mul<DT, kSilu>(x, ldx, out, T, d, threads)))
  }
  if (act == kGeluTanh) {
    HK_DISPATCH_DTYPE(dtype, (act_and_mul<DT, kGeluTanh>(x, ldx, out, T, d, threads)))
  }
  return 2;
}

}  // extern "C"
