// int8 weights (per-row, per-group or 16-weight-group scales) in the integer-dot body: the 512-bit M = 1 kernel and
// the generic MR x NR micro-kernel. Included by quant_dot_impl.h.

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

// dx times the weight row's scale of block b, per lane (kSpg -1: per channel, the row's scale applied at the end;
// -2: 16-weight groups, lanes 0..3 sum weights 0..15 and lanes 4..7 16..31). micro_i8 and tile_i8_x16 share it, so
// their float steps stay the same.
template <int kSpg, class S>
static inline __m256 i8_factor(float dx, const S* sc, int64_t b, int64_t spg) {
  if constexpr (kSpg == -1)
    return _mm256_set1_ps(dx);
  else if constexpr (kSpg == -2)
    return _mm256_mul_ps(_mm256_set1_ps(dx), pair_scales<1, S>(sc, b, 1));
  else
    return _mm256_set1_ps(dx * to_f32(sc[group_of<kSpg>(b, spg)]));
}

// Output (m, n) of the int8 kernels from its lanes: the sum, per channel its scale, the bias. Per channel with a
// bias: one explicit fma. Written as s * scale + bias, the compiler fused it in some instantiations (MR, NR) and not
// in others, so a row's result moved by an ulp with the rows beside it.
template <int kSpg, class S>
static inline void i8_store(const Problem& a, __m256 acc, const S* sc, int64_t m, int64_t n) {
  float s = hsum8(acc);
  if (kSpg == -1)
    s = a.bias ? __builtin_fmaf(s, to_f32(sc[0]), a.bias[n]) : s * to_f32(sc[0]);
  else if (a.bias)
    s += a.bias[n];
  a.out[m * ldo_of(a) + n] = s;
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
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), i8_factor<kSpg, S>(dx, sc[r], b, spg), acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) i8_store<kSpg, S>(a, acc[m][r], sc[r], m0 + m, n0 + r * rs);
}

#if !HQ_ZMM
// int8 weights on AVX2 with x widened to int16 (XQ::x16: q1, or 254 q1 + q2 in int8x2 mode, each block's 32
// values stored as its 16 even-indexed then its 16 odd-indexed ones). A 32-byte weight load is split into the
// sign-extended even and odd bytes of its 16-bit words (two shifts), and per x row two vpmaddwd give lane j =
// products 4j .. 4j + 3: the very int32 lanes micro_i8's sign / maddubs / madd chain gives (and its 254 A + B in
// int8x2 mode), so results are micro_i8's bit for bit. ~5 vector ops per x row and block against micro_i8's ~10
// in int8x2 mode, and each weight row is loaded and widened once for MR x rows.
template <int MR, int NR, int kSpg, class S>
static inline void tile_i8_x16(const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs = 1) {
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
    __m256i we[NR], wo[NR];
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + b * 32) + kPrefetchBytes, _MM_HINT_T0);  // see micro_u4
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b * 32));
      we[r] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
      wo[r] = _mm256_srai_epi16(v, 8);
    }
    for (int m = 0; m < MR; ++m) {
      const int16_t* x = xq.x16 + (m0 + m) * a.K + b * 32;
      const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
      const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
      const float dx = xq.d[(m0 + m) * xq.ld_d + b];
      for (int r = 0; r < NR; ++r) {
        const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(we[r], xe), _mm256_madd_epi16(wo[r], xo));
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), i8_factor<kSpg, S>(dx, sc[r], b, spg), acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) i8_store<kSpg, S>(a, acc[m][r], sc[r], m0 + m, n0 + r * rs);
}

template <int MR, int NR, class S>
static inline void tile_i8_x16_s(const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs = 1) {
  const int64_t spg = a.sb_per_group;
  if (spg * 32 == a.K) return tile_i8_x16<MR, NR, -1, S>(a, xq, m0, n0, rs);
  switch (spg) {
    case 0: return tile_i8_x16<MR, NR, -2, S>(a, xq, m0, n0, rs);
    case 1: return tile_i8_x16<MR, NR, 1, S>(a, xq, m0, n0, rs);
    case 2: return tile_i8_x16<MR, NR, 2, S>(a, xq, m0, n0, rs);
    case 4: return tile_i8_x16<MR, NR, 4, S>(a, xq, m0, n0, rs);
    default: return tile_i8_x16<MR, NR, 0, S>(a, xq, m0, n0, rs);
  }
}

template <int MR, int NR>
static inline void tile_i8_x16_mr(int mr, const Problem& a, const XQ& xq, int64_t m0, int64_t n0, int64_t rs = 1) {
  if constexpr (MR >= 1) {
    if (mr != MR) return tile_i8_x16_mr<MR - 1, NR>(mr, a, xq, m0, n0, rs);
    a.sf16 ? tile_i8_x16_s<MR, NR, uint16_t>(a, xq, m0, n0, rs) : tile_i8_x16_s<MR, NR, float>(a, xq, m0, n0, rs);
  }
}

// Output rows [n_begin, n_end) of int8 weights for all x rows: kI8MR x rows by kI8NR weight rows per tile.
constexpr int64_t kI8MR = 4, kI8NR = 2;
static void run_i8_x16(const Problem& a, const XQ& xq, int64_t n_begin, int64_t n_end) {
  int64_t n = n_begin;
  for (; n + kI8NR <= n_end; n += kI8NR)
    for (int64_t m0 = 0; m0 < a.M; m0 += kI8MR)
      tile_i8_x16_mr<kI8MR, kI8NR>((int)std::min(kI8MR, a.M - m0), a, xq, m0, n);
  for (; n < n_end; ++n)
    for (int64_t m0 = 0; m0 < a.M; m0 += kI8MR)
      tile_i8_x16_mr<kI8MR, 1>((int)std::min(kI8MR, a.M - m0), a, xq, m0, n);
}
#endif
