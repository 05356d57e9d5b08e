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

// acc (8 x s32) of a pair of int4 blocks against x's pair-permuted 64 bytes.
static inline __m256i u4_pair(__m256i acc, __m256i lo, __m256i hi, const int8_t* qx) {
  return D::dot2(acc, lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx)), hi,
                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + 32)));
}

// Two-term activations (kX2, "int8x2"): x ~ d2 * (254 * q1 + q2) per block, so one block's dot product is
// d2 * (254 * (w . q1) + w . q2): a second integer dot chain on the same unpacked weights, combined in int32
// (D::dot_x2 / dot2_x2; exact: |254 * p1 + p2| per s32 lane <= 254 * 4 * 127 * 127 + 4 * 127 * 127 < 2^24 for int8
// weights, 8 * 15 * 127 * 255 for int4 pairs, so also exact as fp32), then the same single float fma per block as
// the int8 mode.
static inline __m256i ld256(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

template <bool kX2>
static inline __m256i u4_pair_x(__m256i lo, __m256i hi, const int8_t* qx, const int8_t* qx2) {
  if constexpr (!kX2) return u4_pair(_mm256_setzero_si256(), lo, hi, qx);
  else return D::dot2_x2(lo, ld256(qx), hi, ld256(qx + 32), ld256(qx2), ld256(qx2 + 32));
}

// The integer dot vector of int4 pair j (its 32 bytes at w) against x's pair-permuted 64 bytes (+ the residual's).
template <bool kX2>
__attribute__((always_inline)) static inline __m256i pair_dot(const uint8_t* w, const XQ& xq, int64_t j) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i b = ld256(reinterpret_cast<const int8_t*>(w));
  const __m256i l = _mm256_and_si256(b, mask), h = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
  const __m256i x0 = ld256(xq.q + 64 * j), x1 = ld256(xq.q + 64 * j + 32);
  if constexpr (kX2) return D::dot2_x2(l, x0, h, x1, ld256(xq.q2 + 64 * j), ld256(xq.q2 + 64 * j + 32));
  else return D::dot2(_mm256_setzero_si256(), l, x0, h, x1);
}

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

// One int4 output n: the integer-dot sum acc, plus the mins' part sum_g min_g * xs_g (symmetric int4: min = -8 * scale,
// from the row's scales sc; the factor -8 commutes with rounding), plus the bias.
template <class S>
static inline float u4_output(const Problem& a, __m256 acc, const S* sc, const float* xs, int64_t ng, int64_t n) {
  const float s = hsum8(acc) + (a.mins ? dot_s(static_cast<const S*>(a.mins) + n * a.ldg, xs, ng)
                                       : -8.0f * dot_s(sc, xs, ng));
  return a.bias ? s + a.bias[n] : s;
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

// Rows n0 + r * rs (r < NR) x rows [m0, m0 + MR): out = int4 weights . XQ.
template <int MR, int NR, int kSpg, bool kX2, class S>
static inline void micro_u4(const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs = 1) {
  const int64_t nb = a.K / 32, np = nb / 2, spg = a.sb_per_group;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_ps();
  const uint8_t* w[NR];
  const S* sc[NR];
  for (int r = 0; r < NR; ++r) {
    w[r] = static_cast<const uint8_t*>(a.w) + (n0 + r * rs) * a.ldw;
    sc[r] = static_cast<const S*>(a.scales) + (n0 + r * rs) * a.ldg;
  }
  for (int64_t j = 0; j < np; ++j) {
    __m256i lo[NR], hi[NR];
    __m256 ws[NR];
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + j * 32) + kPrefetchBytes, _MM_HINT_T0);
      if (j % 8 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(sc[r] + group_of<kSpg>(2 * j, spg)) + 64, _MM_HINT_T0);
    }
    if constexpr (MR == 1) {  // one x row: each weight row's pair is unpacked and used at once (no spills)
      const int8_t* qx = xq.q + m0 * a.K + j * 64;
      const __m256i x0 = ld256(qx), x1 = ld256(qx + 32);
      const __m256i y0 = kX2 ? ld256(xq.q2 + m0 * a.K + j * 64) : x0;
      const __m256i y1 = kX2 ? ld256(xq.q2 + m0 * a.K + j * 64 + 32) : x1;
      const __m256 dx = _mm256_loadu_ps(xq.d + m0 * xq.ld_d + j * 8);
      for (int r = 0; r < NR; ++r) {
        const __m256i b = ld256(reinterpret_cast<const int8_t*>(w[r] + j * 32));
        const __m256i l = _mm256_and_si256(b, mask), h = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
        const __m256i p = kX2 ? D::dot2_x2(l, x0, h, x1, y0, y1) : D::dot2(_mm256_setzero_si256(), l, x0, h, x1);
        acc[0][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dx, pair_scales<kSpg, S>(sc[r], j, spg)),
                                    acc[0][r]);
      }
      continue;
    }
    for (int r = 0; r < NR; ++r) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + j * 32));
      lo[r] = _mm256_and_si256(b, mask);
      hi[r] = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
      ws[r] = pair_scales<kSpg, S>(sc[r], j, spg);
    }
    for (int m = 0; m < MR; ++m) {
      const int8_t* qx = xq.q + (m0 + m) * a.K + j * 64;
      const int8_t* qx2 = kX2 ? xq.q2 + (m0 + m) * a.K + j * 64 : nullptr;
      const __m256 dx = _mm256_loadu_ps(xq.d + (m0 + m) * xq.ld_d + j * 8);
      for (int r = 0; r < NR; ++r) {
        const __m256i p = u4_pair_x<kX2>(lo[r], hi[r], qx, qx2);
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dx, ws[r]), acc[m][r]);
      }
    }
  }
  if (nb % 2) {  // odd last block: natural order, 16 bytes -> [lo | hi] in one register
    const int64_t b = nb - 1;
    for (int r = 0; r < NR; ++r) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + b * 16));
      const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), mask);
      const __m256 ws = _mm256_set1_ps(to_f32(sc[r][b / spg]));
      for (int m = 0; m < MR; ++m) {
        const int8_t* qx = xq.q + (m0 + m) * a.K + b * 32;
        __m256i p;
        if constexpr (kX2)
          p = D::dot_x2(q, ld256(qx), ld256(xq.q2 + (m0 + m) * a.K + b * 32));
        else
          p = D::dot(_mm256_setzero_si256(), q, ld256(qx));
        const __m256 dx = _mm256_loadu_ps(xq.d + (m0 + m) * xq.ld_d + np * 8);
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dx, ws), acc[m][r]);
      }
    }
  }
  const int64_t ng = a.K / (32 * spg);
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      const int64_t n = n0 + r * rs;
      a.out[(m0 + m) * ldo_of(a) + n] = u4_output(a, acc[m][r], sc[r], xq.xs + (m0 + m) * xq.ld_xs, ng, n);
    }
}

// Per-block sums of four pairs' int32 dot vectors p0..p3 (pair j + i: lanes 0..3 block 2(j + i), 4..7 block
// 2(j + i) + 1), in the lane order [2j, 2j + 2, 2j + 4, 2j + 6 | 2j + 1, 2j + 3, 2j + 5, 2j + 7]: one 4 x 4 transpose-add
// per 128-bit lane (6 single-uop shuffles, 3 adds). A block sum stays exact through the fp32 convert: int8x2's is at
// most 32 * 15 * (254 * 127 + 127) = 15.5M < 2^24.
static inline __m256i fold4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
  const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}

// Eight consecutive scales (blocks 2j .. 2j + 7) as fp32 in fold4's lane order.
template <class S>
static inline __m256 scales8_folded(const S* s, int64_t j) {
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  if constexpr (sizeof(S) == 4)
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(s) + 2 * j), order);
  else
    return _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * j))),
                                    order);
}

// M = 1, int4 with 32-weight groups (GGUF Q4_0 / Q4_1 / Q4_K repacks, int4-g32), 4 row streams: micro_u4<1, 4, 1>'s
// arithmetic, written out so the loop is mostly integer work: named accumulators (the array form kept a copy in
// memory), one shared byte offset for the four weight rows, and four pairs (128 bytes of each row) per iteration
// whose integer dot vectors are reduced to one sum per block first (fold4), so the float epilogue (convert, scale
// product, fma) runs once per 8 blocks instead of once per pair. xq.dn holds dx per block in natural order, permuted
// like the sums. Leftover pairs (K % 256) take the per-pair form. Needs an even number of blocks (K % 64 == 0).
template <bool kX2, class S>
static inline void m1_u4_g32(const Problem& a, const XQ& xq, int64_t n0, int64_t rs) {
  const int64_t np = a.K / 64, ldw = a.ldw * rs, ldg = a.ldg * rs;
  const uint8_t* w0 = static_cast<const uint8_t*>(a.w) + n0 * a.ldw;
  const uint8_t *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
  const S* s0 = static_cast<const S*>(a.scales) + n0 * a.ldg;
  const S *s1 = s0 + ldg, *s2 = s1 + ldg, *s3 = s2 + ldg;
  const float* d = xq.d;
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  // Integer dot vector of pair j of row w against x.
  auto dotp = [&](const uint8_t* w, int64_t j) __attribute__((always_inline)) {
    return pair_dot<kX2>(w + 32 * j, xq, j);
  };
  auto quad = [&](const uint8_t* w, const S* sc, __m256 dx, int64_t j, __m256& acc) __attribute__((always_inline)) {
    const __m256i sum = fold4(dotp(w, j), dotp(w, j + 1), dotp(w, j + 2), dotp(w, j + 3));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dx, scales8_folded(sc, j)), acc);
  };
  int64_t j = 0;
  for (; j + 4 <= np; j += 4) {
    const int64_t pf = j * 32 + kPrefetchBytes;
    _mm_prefetch(reinterpret_cast<const char*>(w0 + pf), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + pf), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w2 + pf), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w3 + pf), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w0 + pf + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + pf + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w2 + pf + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w3 + pf + 64), _MM_HINT_T0);
    const __m256 dx = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xq.dn + 2 * j), order);
    quad(w0, s0, dx, j, acc0);
    quad(w1, s1, dx, j, acc1);
    quad(w2, s2, dx, j, acc2);
    quad(w3, s3, dx, j, acc3);
  }
  for (; j < np; ++j) {  // per pair: scale vector [s(2j) x4, s(2j + 1) x4]
    const __m256 dx = _mm256_loadu_ps(d + j * 8);
    auto row = [&](const uint8_t* w, const S* sc, __m256& acc) __attribute__((always_inline)) {
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dotp(w, j)), _mm256_mul_ps(dx, pair_scales<1, S>(sc, j, 1)), acc);
    };
    row(w0, s0, acc0);
    row(w1, s1, acc1);
    row(w2, s2, acc2);
    row(w3, s3, acc3);
  }
  const int64_t ng = a.K / 32;
  a.out[n0] = u4_output(a, acc0, s0, xq.xs, ng, n0);
  a.out[n0 + rs] = u4_output(a, acc1, s1, xq.xs, ng, n0 + rs);
  a.out[n0 + 2 * rs] = u4_output(a, acc2, s2, xq.xs, ng, n0 + 2 * rs);
  a.out[n0 + 3 * rs] = u4_output(a, acc3, s3, xq.xs, ng, n0 + 3 * rs);
}

// 8 fp32 / fp16 scales (or mins) at p as fp32, natural order.
template <class S>
static inline __m256 load8(const uint8_t* p) {
  if constexpr (sizeof(S) == 4) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// M = 1, one 4-row tile (Problem::tiled, TileGeo in quant.cpp): m1_u4_g32's arithmetic with each record's scales
// (and mins) read inline, so its result is bit-identical to the plain layout's: the quads as there, the leftover
// pairs of the last record per pair, and the mins' part sum_b min_b * xs_b accumulated in dot_s's lane order.
// The full records go through tile_records (256-bit) or, where the namespace has 512-bit integer dots (HQ_ZMM),
// tile_records_zmm; both leave the same per-lane floats in acc / ms.
template <bool kX2, class S, bool kMins>
static inline void tile_records(const XQ& xq, const TileGeo& g, const uint8_t* rec, __m256 acc[4], __m256 ms[4]) {
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  constexpr int64_t kSB = 8 * sizeof(S), kQ = (kMins ? 8 : 4) * kSB;  // a row's scales, the quants' offset
  for (int64_t k = 0; k < g.nq; ++k, rec += g.rec) {
    const char* pf = reinterpret_cast<const char*>(rec) + kPrefetchTileBytes;
    for (int64_t l = 0; l < g.rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    const int64_t j = 4 * k;
    const __m256 dx = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xq.dn + 2 * j), order);
    const __m256 xs = _mm256_loadu_ps(xq.xs + 2 * j);
    for (int r = 0; r < 4; ++r) {
      const uint8_t* w = rec + kQ + 128 * r;
      const __m256i sum = fold4(pair_dot<kX2>(w, xq, j), pair_dot<kX2>(w + 32, xq, j + 1),
                                pair_dot<kX2>(w + 64, xq, j + 2), pair_dot<kX2>(w + 96, xq, j + 3));
      const __m256 s8 = load8<S>(rec + kSB * r);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dx, _mm256_permutevar8x32_ps(s8, order)),
                               acc[r]);
      ms[r] = _mm256_fmadd_ps(kMins ? load8<S>(rec + 4 * kSB + kSB * r) : s8, xs, ms[r]);
    }
  }
}

#if HQ_ZMM
// fold4 on 512-bit vectors: per 128-bit lane L, [sum of p0's lane L, p1's, p2's, p3's].
static inline __m512i fold4_zmm(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

// 16 fp32 / fp16 scales (or mins) at p as fp32, natural order.
template <class S>
static inline __m512 load16(const uint8_t* p) {
  if constexpr (sizeof(S) == 4) return _mm512_loadu_ps(p);
  else return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// tile_records with 512-bit integer dots: one zmm holds two pairs of one row (blocks 0..3 or 4..7 of the record, a
// block per 128-bit lane), x's matching halves are gathered once per record for all four rows, and rows are worked
// two at a time (lanes 0..7 row r, 8..15 row r + 1). The integer block sums are exact either way and each float
// lane sees the same convert, multiply and fma as in tile_records, so acc / ms come out bit-identical. Less than
// half the vector instructions per record of tile_records, which shows in batch-1 decode on AVX-512BW without VNNI.
template <bool kX2, class S, bool kMins>
static inline void tile_records_zmm(const XQ& xq, const TileGeo& g, const uint8_t* rec, __m256 acc[4], __m256 ms[4]) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  // fold4_zmm(row r blocks 0-3, r 4-7, r+1 0-3, r+1 4-7) has block b of row r at 4 (b % 4) + b / 4 and row r + 1's
  // at + 2; this puts both rows in fold4's [0, 2, 4, 6, 1, 3, 5, 7] order, row r in lanes 0..7.
  const __m512i rows2 = _mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 2, 10, 3, 11, 6, 14, 7, 15);
  const __m512i order2 = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m512i dup_order = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7);
  const __m512i dup = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  constexpr int64_t kSB = 8 * sizeof(S), kQ = (kMins ? 8 : 4) * kSB;
  __m512 a01 = _mm512_setzero_ps(), a23 = a01, m01 = a01, m23 = a01;
  // x of pairs j .. j + 3 (4 x 64 bytes, each [first halves | second halves] of its two blocks) -> the first halves
  // of pairs (j, j + 1), their second halves, and the same for (j + 2, j + 3): one per zmm of a row's two pairs.
  auto xhalves = [](const int8_t* p, __m512i x[4]) __attribute__((always_inline)) {
    const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
    const __m512i c = _mm512_loadu_si512(p + 128), d = _mm512_loadu_si512(p + 192);
    x[0] = _mm512_shuffle_i64x2(a, b, 0x44), x[1] = _mm512_shuffle_i64x2(a, b, 0xEE);
    x[2] = _mm512_shuffle_i64x2(c, d, 0x44), x[3] = _mm512_shuffle_i64x2(c, d, 0xEE);
  };
  for (int64_t k = 0; k < g.nq; ++k, rec += g.rec) {
    const char* pf = reinterpret_cast<const char*>(rec) + kPrefetchTileBytes;
    for (int64_t l = 0; l < g.rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    const int64_t j = 4 * k;
    __m512i x[4], t[4];
    xhalves(xq.q + 64 * j, x);
    if constexpr (kX2) xhalves(xq.q2 + 64 * j, t);
    auto dotz = [&](const uint8_t* w, int h) __attribute__((always_inline)) {  // h: 0 pairs j, j + 1; 2: j + 2, j + 3
      const __m512i b = _mm512_loadu_si512(w);
      const __m512i lo = _mm512_and_si512(b, mask), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), mask);
      if constexpr (kX2) return D::dot2_x2_zmm(lo, x[h], hi, x[h + 1], t[h], t[h + 1]);
      else return D::dot2_zmm(lo, x[h], hi, x[h + 1]);
    };
    const __m512 dx = _mm512_permutexvar_ps(dup_order, _mm512_castps256_ps512(_mm256_loadu_ps(xq.dn + 2 * j)));
    const __m512 xs = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(xq.xs + 2 * j)));
    auto two_rows = [&](int r, __m512& acc2, __m512& ms2) __attribute__((always_inline)) {
      const uint8_t* w = rec + kQ + 128 * r;
      const __m512i f = fold4_zmm(dotz(w, 0), dotz(w + 64, 2), dotz(w + 128, 0), dotz(w + 192, 2));
      const __m512 s16 = load16<S>(rec + kSB * r);
      acc2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(rows2, f)),
                             _mm512_mul_ps(dx, _mm512_permutexvar_ps(order2, s16)), acc2);
      ms2 = _mm512_fmadd_ps(kMins ? load16<S>(rec + 4 * kSB + kSB * r) : s16, xs, ms2);
    };
    two_rows(0, a01, m01);
    two_rows(2, a23, m23);
  }
  auto split = [](__m512 v, __m256& lo, __m256& hi) __attribute__((always_inline)) {
    lo = _mm512_castps512_ps256(v);
    hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  };
  split(a01, acc[0], acc[1]);
  split(a23, acc[2], acc[3]);
  split(m01, ms[0], ms[1]);
  split(m23, ms[2], ms[3]);
}
#endif

template <bool kX2, class S, bool kMins>
static inline void m1_tile(const Problem& a, const XQ& xq, const TileGeo& g, int64_t t) {
  const uint8_t* rec = g.tile(a, t);
  __m256 acc[4], ms[4];
  for (int r = 0; r < 4; ++r) acc[r] = ms[r] = _mm256_setzero_ps();
#if HQ_ZMM
  tile_records_zmm<kX2, S, kMins>(xq, g, rec, acc, ms);
#else
  tile_records<kX2, S, kMins>(xq, g, rec, acc, ms);
#endif
  rec += g.nq * g.rec;
  float mt[4];
  for (int r = 0; r < 4; ++r) mt[r] = hsum8(ms[r]);
  if (g.tail) {  // the last record: n = g.tail pairs, per pair (scale vector [s(2j) x4, s(2j + 1) x4])
    const int64_t n = g.tail, sb = 2 * n * sizeof(S);
    const S* sc = reinterpret_cast<const S*>(rec);
    const S* mn = reinterpret_cast<const S*>(rec + 4 * sb);
    const uint8_t* qs = rec + (kMins ? 8 : 4) * sb;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = 4 * g.nq + i;
      const __m256 dx = _mm256_loadu_ps(xq.d + j * 8);
      for (int r = 0; r < 4; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_dot<kX2>(qs + 32 * (n * r + i), xq, j)),
                                 _mm256_mul_ps(dx, pair_scales<1, S>(sc + 2 * n * r, i, 1)), acc[r]);
    }
    for (int r = 0; r < 4; ++r)  // dot_s's scalar tail
      for (int64_t b = 0; b < 2 * n; ++b)
        mt[r] += to_f32((kMins ? mn : sc)[2 * n * r + b]) * xq.xs[8 * g.nq + b];
  }
  for (int r = 0; r < 4; ++r) {
    const int64_t o = 4 * t + r;
    const float v = hsum8(acc[r]) + (kMins ? mt[r] : -8.0f * mt[r]);
    a.out[o] = a.bias ? v + a.bias[o] : v;
  }
}

// M = 1, one tile of 6-bit weights (Problem::q6, kQ6Rec in quant.cpp). Per block of 32: the unsigned 6-bit values u
// (a nibble of ql | two bits of qh << 4) times x by maddubs, minus 32 * the sum of x (the same int32 per lane as the
// int8 kernel's w . x with w = u - 32), then the int8 group-16 kernel's float step (dx * [s(2b) x4, s(2b + 1) x4], one
// fma), so the result is bit-identical to micro_i8 on the unpacked weights. x's side (loads, the 32 * sum term) is
// shared by the tile's four rows.
template <bool kX2>
static inline void m1_q6_tile(const Problem& a, const XQ& xq, int64_t t) {
  const int64_t nsb = a.K / 256;
  const uint8_t* rec = static_cast<const uint8_t*>(a.w) + t * 4 * a.ldw;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
  const __m256i one = _mm256_set1_epi16(1), k254 = _mm256_set1_epi16(254);
  __m256 acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm256_setzero_ps();
  alignas(32) float sf[4][16];
  for (int64_t k = 0; k < nsb; ++k, rec += 4 * kQ6Rec) {
    const char* pf = reinterpret_cast<const char*>(rec) + kPrefetchTileBytes;
    for (int64_t l = 0; l < 4 * kQ6Rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    for (int r = 0; r < 4; ++r) {  // the row's 16 scales d * sc, exact in fp32
      const uint8_t* rr = rec + r * kQ6Rec;
      const __m256 d = _mm256_set1_ps(hk::f16_to_f32(uint16_t(rr[kQ6D] | rr[kQ6D + 1] << 8)));
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rr + kQ6Sc));
      _mm256_store_ps(sf[r], _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
      _mm256_store_ps(sf[r] + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    }
    for (int b = 0; b < 8; ++b) {  // block b: half h = b / 4, elements 32 j .. 32 j + 31 of it (j = b % 4)
      const int h = b / 4, j = b % 4;
      const int64_t blk = 8 * k + b;
      const __m256i x1 = ld256(xq.q + 32 * blk);
      __m256i corr = _mm256_madd_epi16(_mm256_maddubs_epi16(c32, x1), kX2 ? k254 : one);
      __m256i x2;
      if constexpr (kX2) {
        x2 = ld256(xq.q2 + 32 * blk);
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(c32, x2), one));
      }
      const __m256 dx = _mm256_set1_ps(xq.d[blk]);
      // the nibble: low (j < 2) or high; the high bits 2j..2j+1 of each qh byte moved to bits 4..5
      const __m128i nsh = _mm_cvtsi32_si128(j < 2 ? 0 : 4);
      const __m128i lsh = _mm_cvtsi32_si128(j < 3 ? 4 - 2 * j : 0), rsh = _mm_cvtsi32_si128(j == 3 ? 2 : 0);
      for (int r = 0; r < 4; ++r) {
        const uint8_t* rr = rec + r * kQ6Rec;
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ld256(reinterpret_cast<const int8_t*>(rr) + 64 * h + 32 * (j % 2)), nsh), m4);
        const __m256i qh = ld256(reinterpret_cast<const int8_t*>(rr) + kQ6Qh + 32 * h);
        const __m256i u = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srl_epi16(_mm256_sll_epi16(qh, lsh), rsh), m30));
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x1), kX2 ? k254 : one);
        if constexpr (kX2) dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x2), one));
        const __m256 f = _mm256_mul_ps(dx, pair_scales<1, float>(sf[r], b, 1));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot, corr)), f, acc[r]);
      }
    }
  }
  for (int r = 0; r < 4; ++r) {
    const int64_t o = 4 * t + r;
    const float v = hsum8(acc[r]);
    a.out[o] = a.bias ? v + a.bias[o] : v;
  }
}

#if HQ_ZMM
// m1_q6_tile with 512-bit vectors: a zmm holds 64 weights of one row (blocks 2z, 2z + 1 of the super-block), read
// as the file lays them out: one 64-byte ql load gives half h's elements 0..63 (low nibbles) and 64..127 (high), and
// its 32 qh bytes, broadcast to both halves of a zmm and rotated per dword by 4 / 2 (or 0 / 30), put the high bits
// of those elements at bits 4..5 of each byte. The integer dot and the 32 * sum(x) correction are m1_q6_tile's;
// the float step too, but blocks 2z and 2z + 1 accumulate in the two halves of one zmm per row (summed at the end),
// so results equal m1_q6_tile's up to fp32 summation order. ~13 vector ops per 64 weights and row against ~19.
template <bool kX2>
static inline void m1_q6_tile_zmm(const Problem& a, const XQ& xq, int64_t t) {
  const int64_t nsb = a.K / 256;
  const uint8_t* rec = static_cast<const uint8_t*>(a.w) + t * 4 * a.ldw;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), c32 = _mm512_set1_epi8(32);
  const __m512i one = _mm512_set1_epi16(1), k254 = _mm512_set1_epi16(254);
  const __m512i rot_lo = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i rot_hi = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 30, 30, 30, 30, 30, 30, 30, 30);
  __m512i sidx[4];  // zmm z's scale lanes: [s(4z) x4, s(4z + 1) x4, s(4z + 2) x4, s(4z + 3) x4]
  for (int z = 0; z < 4; ++z)
    sidx[z] = _mm512_add_epi32(_mm512_set1_epi32(4 * z),
                               _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
  __m512 acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < nsb; ++k, rec += 4 * kQ6Rec) {
    const char* pf = reinterpret_cast<const char*>(rec) + kPrefetchTileBytes;
    for (int64_t l = 0; l < 4 * kQ6Rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    __m512 sf[4];  // each row's 16 scales d * sc, exact in fp32
    for (int r = 0; r < 4; ++r) {
      const uint8_t* rr = rec + r * kQ6Rec;
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rr + kQ6Sc));
      sf[r] = _mm512_mul_ps(_mm512_set1_ps(hk::f16_to_f32(uint16_t(rr[kQ6D] | rr[kQ6D + 1] << 8))),
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    }
    for (int h = 0; h < 2; ++h) {
      __m512i x1[2], x2[2], corr[2];  // x's side of zmm z = 2h + i, shared by the four rows
      __m512 dx[2];
      for (int i = 0; i < 2; ++i) {
        const int64_t blk = 8 * k + 4 * h + 2 * i;
        x1[i] = _mm512_loadu_si512(xq.q + 32 * blk);
        corr[i] = _mm512_madd_epi16(_mm512_maddubs_epi16(c32, x1[i]), kX2 ? k254 : one);
        if constexpr (kX2) {
          x2[i] = _mm512_loadu_si512(xq.q2 + 32 * blk);
          corr[i] = _mm512_add_epi32(corr[i], _mm512_madd_epi16(_mm512_maddubs_epi16(c32, x2[i]), one));
        }
        dx[i] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_set1_ps(xq.d[blk]))),
                                                    _mm256_castps_pd(_mm256_set1_ps(xq.d[blk + 1])), 1));
      }
      for (int r = 0; r < 4; ++r) {
        const uint8_t* rr = rec + r * kQ6Rec;
        const __m512i nib = _mm512_loadu_si512(rr + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rr + kQ6Qh + 32 * h)));
        const __m512i u[2] = {
            _mm512_ternarylogic_epi32(_mm512_rolv_epi32(qh, rot_lo), m30, _mm512_and_si512(nib, m4), 0xEA),
            _mm512_ternarylogic_epi32(_mm512_rolv_epi32(qh, rot_hi), m30,
                                      _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4), 0xEA)};  // (hi & 0x30) | lo
        for (int i = 0; i < 2; ++i) {
          __m512i dot = _mm512_madd_epi16(_mm512_maddubs_epi16(u[i], x1[i]), kX2 ? k254 : one);
          if constexpr (kX2) dot = _mm512_add_epi32(dot, _mm512_madd_epi16(_mm512_maddubs_epi16(u[i], x2[i]), one));
          const __m512 f = _mm512_mul_ps(dx[i], _mm512_permutexvar_ps(sidx[2 * h + i], sf[r]));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot, corr[i])), f, acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < 4; ++r) {
    const int64_t o = 4 * t + r;
    const __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(acc[r]),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1)));
    const float v = hsum8(v8);
    a.out[o] = a.bias ? v + a.bias[o] : v;
  }
}
#endif

#if HQ_ZMM
// M = 1, int8 weights (not 16-weight groups), NR row streams (as micro_dot<1, NR>), x widened to int16 once per call
// (XQ::x16: q1, or 254 q1 + q2 in int8x2 mode, |.| <= 32385): per block and row one sign-extending load and one
// vpmaddwd give 16 exact int32 pair sums (|.| < 2^24, exact in fp32), then one convert and one fma with dx * scale,
// broadcast from a table built 16 blocks at a time. ~3 vector ALU ops per 32 weights and row against ~12 for
// micro_i8's sign / maddubs / madd chain (maddubs saturates, so there |w| must stay <= 127 by the sign trick).
// Blocks accumulate into 16 lanes of 2 elements instead of 8 of 4: micro_i8's results up to fp32 summation order.
// Faster per weight than micro_i8 on AVX-512BW without VNNI; in whole decode steps the gain is within noise.
template <int NR, class S>
static inline void m1_i8_zmm(const Problem& a, const XQ& xq, int64_t n0, int64_t rs) {
  const int64_t nb = a.K / 32, spg = a.sb_per_group;
  const bool per_channel = spg * 32 == a.K;
  const int8_t* w[NR];
  const S* sc[NR];
  for (int r = 0; r < NR; ++r) {
    w[r] = static_cast<const int8_t*>(a.w) + (n0 + r * rs) * a.ldw;
    sc[r] = static_cast<const S*>(a.scales) + (n0 + r * rs) * a.ldg;
  }
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  alignas(64) float fs[NR][16];  // dx * scale of blocks b0 .. b0 + 15 (per channel: dx, row 0's table for all)
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int64_t n = std::min<int64_t>(16, nb - b0);
    if (per_channel) {
      for (int64_t i = 0; i < n; ++i) fs[0][i] = xq.d[b0 + i];
    } else if (spg == 1) {  // (GGUF Q8_0, int8 group 32) a scale per block: 16 at once, the last ones masked
      const __mmask16 m = __mmask16((1u << n) - 1);
      const __m512 dx = _mm512_maskz_loadu_ps(m, xq.d + b0);
      for (int r = 0; r < NR; ++r) {
        __m512 s;
        if constexpr (sizeof(S) == 4) s = _mm512_maskz_loadu_ps(m, sc[r] + b0);
        else s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc[r] + b0));
        _mm512_store_ps(fs[r], _mm512_mul_ps(dx, s));
      }
    } else {  // (no division per block: ~40+ cycles each, more than the block's work)
      for (int r = 0; r < NR; ++r)
        for (int64_t i = 0, g = b0 / spg, e = b0 % spg; i < n; ++i, e = e + 1 == spg ? (++g, 0) : e + 1)
          fs[r][i] = xq.d[b0 + i] * to_f32(sc[r][g]);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = b0 + i;
      const __m512i xv = _mm512_loadu_si512(xq.x16 + 32 * b);
      for (int r = 0; r < NR; ++r) {
        if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(w[r] + 32 * b) + kPrefetchBytes, _MM_HINT_T0);
        const __m512i wv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + 32 * b)));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(wv, xv)),
                                 _mm512_set1_ps(fs[per_channel ? 0 : r][i]), acc[r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    const int64_t o = n0 + r * rs;
    float s = _mm512_reduce_add_ps(acc[r]);
    if (per_channel) s *= to_f32(sc[r][0]);
    a.out[o] = a.bias ? s + a.bias[o] : s;
  }
}
#endif

// 32 int8 weights x 32 int8 activations, signed x signed: |w| (u8) times x with w's sign.
static inline __m256i i8_block(__m256i acc, __m256i w, const int8_t* qx) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  return D::dot(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// Same for int8 weights. kPerChannel: one scale for the row, applied once at the end.
template <int MR, int NR, int kSpg, bool kX2, class S>
static inline void micro_i8(const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs = 1) {
  const int64_t nb = a.K / 32, spg = a.sb_per_group;
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_ps();
  const int8_t* w[NR];
  const S* sc[NR];
  for (int r = 0; r < NR; ++r) {
    w[r] = static_cast<const int8_t*>(a.w) + (n0 + r * rs) * a.ldw;
    sc[r] = static_cast<const S*>(a.scales) + (n0 + r * rs) * a.ldg;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wv[NR];
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + b * 32) + kPrefetchBytes, _MM_HINT_T0);  // see micro_u4
      wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b * 32));
    }
    for (int m = 0; m < MR; ++m) {
      const int8_t* qx = xq.q + (m0 + m) * a.K + b * 32;
      const float dx = xq.d[(m0 + m) * xq.ld_d + b];
      for (int r = 0; r < NR; ++r) {
        __m256i p;
        if constexpr (kX2)  // |w| (u8) times each x term with w's sign
          p = D::dot_x2(_mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(ld256(qx), wv[r]),
                        _mm256_sign_epi8(ld256(xq.q2 + (m0 + m) * a.K + b * 32), wv[r]));
        else
          p = i8_block(_mm256_setzero_si256(), wv[r], qx);
        __m256 f;
        if constexpr (kSpg == -1)
          f = _mm256_set1_ps(dx);
        else if constexpr (kSpg == -2)  // 16-weight groups: lanes 0..3 sum weights 0..15, lanes 4..7 16..31
          f = _mm256_mul_ps(_mm256_set1_ps(dx), pair_scales<1, S>(sc[r], b, 1));
        else
          f = _mm256_set1_ps(dx * to_f32(sc[r][group_of<kSpg>(b, spg)]));
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) {
      const int64_t n = n0 + r * rs;
      float s = hsum8(acc[m][r]);
      if (kSpg == -1) s *= to_f32(sc[r][0]);
      if (a.bias) s += a.bias[n];
      a.out[(m0 + m) * ldo_of(a) + n] = s;
    }
}

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

// Output rows [n_begin, n_end) for all M rows of x. M == 1: kStreamsM1 streams, each its own contiguous run of
// rows (see linear_impl.h run_rows), the last < kStreamsM1 rows one at a time. M > 1, int4-g32 (plain or tiles) and
// 6-bit tiles: the M = 1 kernels for each x row in turn on four weight rows (row_of). Other M > 1: up to kDotMR x
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
