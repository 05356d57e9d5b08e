// int4 weights (plain rows, 4-bit nibbles of blocks of 32 with scales and optional mins) in the integer-dot body:
// the pair dot products, the generic MR x NR micro-kernel and the folded M = 1 kernel of 32-weight groups.
// Included by quant_dot_impl.h after quant_dot_x.h.

// acc (8 x s32) of a pair of int4 blocks against x's pair-permuted 64 bytes.
static inline __m256i u4_pair(__m256i acc, __m256i lo, __m256i hi, const int8_t* qx) {
  return D::dot2(acc, lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx)), hi,
                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + 32)));
}

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

// One int4 output n: the integer-dot sum acc, plus the mins' part sum_g min_g * xs_g (symmetric int4: min = -8 * scale,
// from the row's scales sc; the factor -8 commutes with rounding), plus the bias.
template <class S>
static inline float u4_output(const Problem& a, __m256 acc, const S* sc, const float* xs, int64_t ng, int64_t n) {
  const float s = hsum8(acc) + (a.mins ? dot_s(static_cast<const S*>(a.mins) + n * a.ldg, xs, ng)
                                       : -8.0f * dot_s(sc, xs, ng));
  return a.bias ? s + a.bias[n] : s;
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

