// The integer-dot kernels' shared half (quant_dot_impl.h includes it first): x quantized to int8 blocks of 32, the
// prefetch distances, and the scale reads every weight format uses. No include guard: quant.cpp includes the body
// once per ISA namespace.

using hk::hsum8;

static inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum8(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// One row of x (K floats) -> XQ row m. int4: pair-permuted qx, dx per pair vector, group sums (G weights a group).
// q2 != nullptr: two-term ("int8x2") mode, see kX2 below: d2 = fl(dx / 254), q1 = round(x / dx) (as above),
// r = fl(x - d2 * (254 * q1)) (one fma), q2 = clamp(round(r * fl(1 / d2)), -127, 127); x ~ d2 * (254 * q1 + q2),
// |x - that| <= d2 / 2 (+ fp32 rounding). d holds d2 then, and the group sums are those of d2 * (254 * q1 + q2).
static void quantize_x_row(const float* x, int64_t K, bool int4, int64_t G, int8_t* q, float* d, float* xs,
                           int8_t* q2 = nullptr) {
  const int64_t nb = K / 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  float dxs[2], sums[2];
  for (int64_t b = 0; b < nb; ++b) {
    const float* p = x + b * 32;
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(p + 8 * i);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    float dx = amax / 127.0f;
    const float id = dx > 0.0f ? 1.0f / dx : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i iq[4];
    for (int i = 0; i < 4; ++i) iq[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));  // round half to even
    // s32 -> s8 in element order: packs interleave 128-bit lanes, the permute restores 0..31.
    const __m256i s16 = _mm256_packs_epi32(iq[0], iq[1]), t16 = _mm256_packs_epi32(iq[2], iq[3]);
    __m256i s8 = _mm256_packs_epi16(s16, t16);
    s8 = _mm256_permutevar8x32_epi32(s8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    __m256i s8b = _mm256_setzero_si256();
    if (q2) {
      const float d2 = dx / 254.0f;
      const __m256 vd2 = _mm256_set1_ps(d2), vid2 = _mm256_set1_ps(d2 > 0.0f ? 1.0f / d2 : 0.0f);
      const __m256i k254 = _mm256_set1_epi32(254), lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
      __m256i jq[4];
      for (int i = 0; i < 4; ++i) {
        const __m256i hi = _mm256_mullo_epi32(iq[i], k254);
        const __m256 r = _mm256_fnmadd_ps(vd2, _mm256_cvtepi32_ps(hi), v[i]);  // x - d2 * 254 q1, one rounding
        jq[i] = _mm256_max_epi32(nlim, _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_mul_ps(r, vid2))));
        iq[i] = _mm256_add_epi32(hi, jq[i]);  // 254 q1 + q2 (for the block sum)
      }
      s8b = _mm256_packs_epi16(_mm256_packs_epi32(jq[0], jq[1]), _mm256_packs_epi32(jq[2], jq[3]));
      s8b = _mm256_permutevar8x32_epi32(s8b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      dx = d2;
    }
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(iq[0], iq[1]), _mm256_add_epi32(iq[2], iq[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
    const int32_t sum = _mm_cvtsi128_si32(t4);
    if (!int4) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), s8);
      if (q2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + b * 32), s8b);
      d[b] = dx;
      continue;
    }
    const int64_t pair = b / 2, half = b % 2;
    const bool odd_last = (nb % 2) && b == nb - 1;
    if (odd_last) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), s8);  // natural order, lanes = lo | hi
      if (q2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + b * 32), s8b);
    } else {
      int8_t* o = q + pair * 64 + half * 16;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(s8));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm256_extracti128_si256(s8, 1));
      if (q2) {
        int8_t* o2 = q2 + pair * 64 + half * 16;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o2), _mm256_castsi256_si128(s8b));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o2 + 32), _mm256_extracti128_si256(s8b, 1));
      }
    }
    dxs[half] = dx;
    sums[half] = dx * (float)sum;
    if (half == 1 || odd_last) {
      float* dd = d + pair * 8;
      for (int i = 0; i < 4; ++i) dd[i] = dxs[0], dd[4 + i] = half ? dxs[1] : dxs[0];
    }
    const int64_t g = b * 32 / G;
    if (b * 32 % G == 0) xs[g] = 0.0f;
    xs[g] += sums[half];
  }
}

// Software prefetch: each weight row kPrefetchBytes ahead of the current block (and its scales every 8 pairs).
// (An earlier M = 1 path read 4 ADJACENT rows and needed the next tile prefetched explicitly; the row streams of
// run_dot_t read each row run sequentially, which the hardware prefetcher follows.)
constexpr int64_t kPrefetchBytes = 512;
// The same for a 4-row tile's single stream (m1_tile): 2 KiB ahead (1-2 KiB measured alike in a C harness, 512 B
// slower, 4 KiB mixed).
constexpr int64_t kPrefetchTileBytes = 2048;

// Two-term activations (kX2, "int8x2"): x ~ d2 * (254 * q1 + q2) per block, so one block's dot product is
// d2 * (254 * (w . q1) + w . q2): a second integer dot chain on the same unpacked weights, combined in int32
// (D::dot_x2 / dot2_x2; exact: |254 * p1 + p2| per s32 lane <= 254 * 4 * 127 * 127 + 4 * 127 * 127 < 2^24 for int8
// weights, 8 * 15 * 127 * 255 for int4 pairs, so also exact as fp32), then the same single float fma per block as
// the int8 mode.
static inline __m256i ld256(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Scales (and mins) are fp32 or, S = uint16_t, fp16 (GGUF's own: widened exactly here).
static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t v) { return hk::f16_to_f32(v); }

template <class S>
static inline float dot_s(const S* a, const float* b, int64_t n) {
  if constexpr (sizeof(S) == 4) {
    return dot_f32(reinterpret_cast<const float*>(a), b, n);
  } else {  // as dot_f32, 8 fp16 widened per load
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))),
                            _mm256_loadu_ps(b + i), acc);
    float s = hsum8(acc);
    for (; i < n; ++i) s += to_f32(a[i]) * b[i];
    return s;
  }
}

// Scale groups are kSpg sub-blocks of 32 when kSpg > 0 (compile time: 1 = Q4_0/Q4_1/Q8_0/Q4_K, 2, 4), else
// a.sb_per_group (a run-time division per block; profiled at ~30% of the int4 kernel's time when it was the only
// path). kSpg = -1 (int8 only): one scale per row; -2 (int8 only): 16-weight groups, two scales per block of 32.
template <int kSpg>
static inline int64_t group_of(int64_t sb, int64_t spg) {
  if constexpr (kSpg > 0) return sb / kSpg;
  else return sb / spg;
}

// Weight scale vector of pair j: [s(2j) x4, s(2j+1) x4].
template <int kSpg, class S>
static inline __m256 pair_scales(const S* s, int64_t j, int64_t spg) {
  if constexpr (kSpg == 1 && sizeof(S) == 4) {  // two adjacent scales: one 8-byte load, spread over the lanes
    const __m256 v = _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(s + 2 * j)));
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  } else if constexpr (kSpg == 1) {  // fp16: one 4-byte load, widened, spread
    int32_t two;
    std::memcpy(&two, s + 2 * j, 4);
    const __m256 v = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(two)));
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  } else if (kSpg > 1 || spg % 2 == 0) {
    return _mm256_set1_ps(to_f32(s[group_of<kSpg>(2 * j, spg)]));
  } else {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(to_f32(s[(2 * j) / spg]))),
                                _mm_set1_ps(to_f32(s[(2 * j + 1) / spg])), 1);
  }
}

