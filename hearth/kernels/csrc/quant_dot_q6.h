// 6-bit weights in 4-row tiles (GGUF Q6_K, kQ6Rec in quant.cpp) in the integer-dot body: the M = 1 tile kernel,
// 256- and 512-bit. Included by quant_dot_impl.h.

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

// MR rows of x (m0 ..) against one 6-bit tile, for steps of several rows: each row's 6-bit values u of a block are
// assembled once and dotted with every row's x (m1_q6_tile row by row assembled them MR times). Per x row the
// integer dots, the 32 * sum(x) correction and every float step are m1_q6_tile's, in the same order, so a row's
// result is bit-identical to m1_q6_tile's and does not depend on the rows that share its step.
template <int MR, bool kX2>
static inline void mr_q6_tile(const Problem& a, const XQ& xq, int64_t t, int64_t m0) {
  const int64_t nsb = a.K / 256;
  const uint8_t* rec = static_cast<const uint8_t*>(a.w) + t * 4 * a.ldw;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
  const __m256i one = _mm256_set1_epi16(1), k254 = _mm256_set1_epi16(254);
  XQ xr[MR];
  for (int m = 0; m < MR; ++m) xr[m] = row_of(xq, a, m0 + m);
  __m256 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < 4; ++r) acc[m][r] = _mm256_setzero_ps();
  alignas(32) float sf[4][16];
  for (int64_t k = 0; k < nsb; ++k, rec += 4 * kQ6Rec) {
    const char* pf = reinterpret_cast<const char*>(rec) + kPrefetchTileBytes;
    for (int64_t l = 0; l < 4 * kQ6Rec; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    for (int r = 0; r < 4; ++r) {  // (as m1_q6_tile)
      const uint8_t* rr = rec + r * kQ6Rec;
      const __m256 d = _mm256_set1_ps(hk::f16_to_f32(uint16_t(rr[kQ6D] | rr[kQ6D + 1] << 8)));
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rr + kQ6Sc));
      _mm256_store_ps(sf[r], _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
      _mm256_store_ps(sf[r] + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    }
    for (int b = 0; b < 8; ++b) {
      const int h = b / 4, j = b % 4;
      const int64_t blk = 8 * k + b;
      __m256i corr[MR];  // each row's 32 * sum(x) of the block
      for (int m = 0; m < MR; ++m) {
        corr[m] = _mm256_madd_epi16(_mm256_maddubs_epi16(c32, ld256(xr[m].q + 32 * blk)), kX2 ? k254 : one);
        if constexpr (kX2)
          corr[m] = _mm256_add_epi32(corr[m], _mm256_madd_epi16(_mm256_maddubs_epi16(c32, ld256(xr[m].q2 + 32 * blk)),
                                                                 one));
      }
      const __m128i nsh = _mm_cvtsi32_si128(j < 2 ? 0 : 4);
      const __m128i lsh = _mm_cvtsi32_si128(j < 3 ? 4 - 2 * j : 0), rsh = _mm_cvtsi32_si128(j == 3 ? 2 : 0);
      for (int r = 0; r < 4; ++r) {
        const uint8_t* rr = rec + r * kQ6Rec;
        const int8_t* ql = reinterpret_cast<const int8_t*>(rr) + 64 * h + 32 * (j % 2);
        const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ld256(ql), nsh), m4);
        const __m256i qh = ld256(reinterpret_cast<const int8_t*>(rr) + kQ6Qh + 32 * h);
        const __m256i u = _mm256_or_si256(lo, _mm256_and_si256(_mm256_srl_epi16(_mm256_sll_epi16(qh, lsh), rsh), m30));
        const __m256 s = pair_scales<1, float>(sf[r], b, 1);
        for (int m = 0; m < MR; ++m) {
          __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(u, ld256(xr[m].q + 32 * blk)), kX2 ? k254 : one);
          if constexpr (kX2)
            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(u, ld256(xr[m].q2 + 32 * blk)), one));
          const __m256 f = _mm256_mul_ps(_mm256_set1_ps(xr[m].d[blk]), s);
          acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot, corr[m])), f, acc[m][r]);
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < 4; ++r) {
      const int64_t o = 4 * t + r;
      const float v = hsum8(acc[m][r]);
      float* out = a.out + (m0 + m) * ldo_of(a);
      out[o] = a.bias ? v + a.bias[o] : v;
    }
}

// 6-bit tiles [t0, t1) for every row of x: rows 4 at a time (mr_q6_tile), the last 1-3 together.
template <bool kX2>
static void mr_q6_tiles(const Problem& a, const XQ& xq, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m = 0;
    for (; m + 4 <= a.M; m += 4) mr_q6_tile<4, kX2>(a, xq, t, m);
    switch (a.M - m) {
      case 3: mr_q6_tile<3, kX2>(a, xq, t, m); break;
      case 2: mr_q6_tile<2, kX2>(a, xq, t, m); break;
      case 1: mr_q6_tile<1, kX2>(a, xq, t, m); break;
      default: break;
    }
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

