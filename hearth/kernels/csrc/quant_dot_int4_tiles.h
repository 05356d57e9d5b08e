// int4 weights in 4-row tiles (Problem::tiled, TileGeo in quant.cpp; GGUF Q4_0 / Q4_1 / Q4_K repacks) in the
// integer-dot body: the M = 1 tile kernel, 256- and 512-bit. Included by quant_dot_impl.h after quant_dot_int4.h.

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

// The rest of a one-row tile after its full records (acc / ms as tile_records leaves them): the last record's pairs,
// the mins' sums and the four outputs (m1_tile and mr_tile both end here, so their rows take the same float steps).
template <bool kX2, class S, bool kMins>
__attribute__((always_inline)) static inline void tile_finish(const Problem& a, const XQ& xq, const TileGeo& g,
                                                              int64_t t, __m256 acc[4], __m256 ms[4]) {
  const uint8_t* rec = g.tile(a, t) + g.nq * g.rec;
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

template <bool kX2, class S, bool kMins>
static inline void m1_tile(const Problem& a, const XQ& xq, const TileGeo& g, int64_t t) {
  __m256 acc[4], ms[4];
  for (int r = 0; r < 4; ++r) acc[r] = ms[r] = _mm256_setzero_ps();
#if HQ_ZMM
  tile_records_zmm<kX2, S, kMins>(xq, g, g.tile(a, t), acc, ms);
#else
  tile_records<kX2, S, kMins>(xq, g, g.tile(a, t), acc, ms);
#endif
  tile_finish<kX2, S, kMins>(a, xq, g, t, acc, ms);
}

// MR rows of x (m0 ..) against one tile, for steps of several rows: each weight row's nibbles are unpacked once per
// record and dotted with every row's x (m1_tile row by row unpacked them MR times). Per x row the integer block sums
// (exact) and every float step are tile_records' and tile_finish's, in the same order, so a row's result is
// bit-identical to m1_tile's and does not depend on the rows that share its step.
template <int MR, bool kX2, class S, bool kMins>
static inline void mr_tile(const Problem& a, const XQ& xq, const TileGeo& g, int64_t t, int64_t m0) {
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), mask = _mm256_set1_epi8(0x0F);
  constexpr int64_t kSB = 8 * sizeof(S), kQ = (kMins ? 8 : 4) * kSB;
  XQ xr[MR];
  for (int m = 0; m < MR; ++m) xr[m] = row_of(xq, a, m0 + m);
  __m256 acc[MR][4], ms[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < 4; ++r) acc[m][r] = ms[m][r] = _mm256_setzero_ps();
  const uint8_t* rec = g.tile(a, t);
  for (int64_t k = 0; k < g.nq; ++k, rec += g.rec) {
    const char* pf = reinterpret_cast<const char*>(rec) + kPrefetchTileBytes;
    for (int64_t l = 0; l < g.rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    const int64_t j = 4 * k;
    for (int r = 0; r < 4; ++r) {
      const uint8_t* w = rec + kQ + 128 * r;
      __m256i lo[4], hi[4];  // pair_dot's unpack of pairs j .. j + 3, once for all MR rows
      for (int i = 0; i < 4; ++i) {
        const __m256i b = ld256(reinterpret_cast<const int8_t*>(w + 32 * i));
        lo[i] = _mm256_and_si256(b, mask);
        hi[i] = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
      }
      const __m256 s8 = load8<S>(rec + kSB * r);
      const __m256 sm = kMins ? load8<S>(rec + 4 * kSB + kSB * r) : s8;
      for (int m = 0; m < MR; ++m) {
        const XQ& x = xr[m];
        auto dot = [&](int i) __attribute__((always_inline)) {  // pair_dot<kX2>(w + 32 i, x, j + i)
          const int8_t* q = x.q + 64 * (j + i);
          if constexpr (kX2) {
            const int8_t* q2 = x.q2 + 64 * (j + i);
            return D::dot2_x2(lo[i], ld256(q), hi[i], ld256(q + 32), ld256(q2), ld256(q2 + 32));
          } else {
            return D::dot2(_mm256_setzero_si256(), lo[i], ld256(q), hi[i], ld256(q + 32));
          }
        };
        const __m256i sum = fold4(dot(0), dot(1), dot(2), dot(3));
        const __m256 dx = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x.dn + 2 * j), order);
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dx, _mm256_permutevar8x32_ps(s8, order)),
                                    acc[m][r]);
        ms[m][r] = _mm256_fmadd_ps(sm, _mm256_loadu_ps(x.xs + 2 * j), ms[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) tile_finish<kX2, S, kMins>(row_of(a, m0 + m), xr[m], g, t, acc[m], ms[m]);
}

// Tiles [t0, t1) for every row of x: rows 4 at a time (mr_tile), the last 1-3 together.
template <bool kX2, class S, bool kMins>
static void mr_tiles(const Problem& a, const XQ& xq, const TileGeo& g, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) mr_tile<4, kX2, S, kMins>(a, xq, g, t, m);
    switch (a.M - m) {
      case 3: mr_tile<3, kX2, S, kMins>(a, xq, g, t, m); break;
      case 2: mr_tile<2, kX2, S, kMins>(a, xq, g, t, m); break;
      case 1: mr_tile<1, kX2, S, kMins>(a, xq, g, t, m); break;
      default: break;
    }
  }
}

