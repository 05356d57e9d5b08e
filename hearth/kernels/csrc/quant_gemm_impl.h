// Quantized GEMM for several rows of x (decode with 4+ sequences, short prefill chunks), AVX-512: included by
// quant.cpp inside namespace avx512 (T = 16-float vectors; Problem, TileGeo from namespace hq).
//
// Without VNNI an integer dot costs the FMA ports about what fp32 FMAs do, so the int8-activation kernels
// (quant_dot_impl.h) pay fp32-FMA cost per weight per row. Here x stays fp32 and each weight vector is dequantized
// in registers once per tile of up to 8 x rows (widen, convert, scale: ~2 FP ops per 16 weights, shared by the
// tile's 8 rows' FMAs), then plain fp32 FMAs: the dequantized float model's results, up to summation order.
//
// Tile (dot form): R (<= 8) x rows against C weight rows, R * C <= 24 accumulators of 16 k-partial sums. Weights of a
// block of kNB rows are first staged (int8 rows read in place; int4 unpacked to one byte per weight, symmetric int4 as
// int8 q - 8; scales / mins as fp32 per 32 weights, or one scale per row applied to the sums), K runs in blocks of <= kKC so an 8-row x tile stays in L1, the partial sums wait unreduced in
// a per-thread scratch between K blocks and are reduced once per block, 16 at a time by a transpose-add network.
//
// When it runs instead of the integer dots is hearth/weights/dispatch.py's choice (plan).

constexpr int64_t kNB = 24;   // weight rows per block: divisible by every tile width C below
constexpr int64_t kKC = 512;  // k per block (x tile: 8 rows x 2 KiB)
constexpr int kMaxR = 8;      // x rows per tile

// Tile width for R rows: R * C <= 24 accumulators, C divides kNB.
constexpr int tile_cols(int R) { return R >= 7 ? 3 : R >= 5 ? 4 : R >= 3 ? 6 : 8; }

static inline float scale_of(const void* base, bool f16, int64_t i) {
  return f16 ? hk::f16_to_f32(static_cast<const uint16_t*>(base)[i]) : static_cast<const float*>(base)[i];
}

// How a staged block is dequantized: q * scale (int8, symmetric int4 as q - 8), q only with the scale applied to the
// sums (int8 with one scale per row), or fma(q, scale, min) (int4 with mins).
enum Deq { kScaled = 0, kRowScale = 1, kMin = 2 };

// A block's weights as the tiles read them: row r's k-th value q[r * ldq + k] (int8; 0..15 for kMin), per sub-block
// of 32 fp32 scales sc[r * lds + k / 32] (kMin: and mins mn, same layout; kRowScale: sc[r] for the whole row).
struct Staged {
  const int8_t* q;
  int64_t ldq;
  const float* sc;
  const float* mn;
  int64_t lds;
  Deq deq;
};

// f(std::integral_constant<Deq, D>{}) for a staged block's kind: the tiles are instantiated once per kind.
template <class F>
static inline void with_deq(Deq d, F&& f) {
  if (d == kMin) return f(std::integral_constant<Deq, kMin>{});
  if (d == kScaled) return f(std::integral_constant<Deq, kScaled>{});
  f(std::integral_constant<Deq, kRowScale>{});
}

// 16 bytes of 32 nibbles (GGUF order: low nibbles = weights 0..15, high = 16..31) -> 32 bytes, one per weight, minus
// `bias` (8 for symmetric int4: then q - 8 as int8, and q * s == fma(q + 8, s, -8 * s) exactly).
static inline void unpack_nibbles(const uint8_t* src, int8_t* dst, int bias) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)), mask = _mm_set1_epi8(0x0F);
  const __m128i d = _mm_set1_epi8(char(bias));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_sub_epi8(_mm_and_si128(b, mask), d));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), mask), d));
}

// A row's ng group scales (fp16 or fp32) -> fp32 per sub-block of 32 (spg sub-blocks per group): 16 at a time, each
// group's value repeated by a lane permutation where spg divides 16 (groups of 32 / 64 / 128 / 256 / 512 weights).
static inline void expand_scales(const void* src, bool f16, int64_t ng, int64_t spg, float* dst) {
  if (16 % spg) {
    for (int64_t g = 0; g < ng; ++g) {
      const float v = scale_of(src, f16, g);
      for (int64_t j = 0; j < spg; ++j) dst[g * spg + j] = v;
    }
    return;
  }
  const int64_t ns = ng * spg, per = 16 / spg;  // groups per 16 sub-blocks
  const __m512i idx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        __builtin_ctz((unsigned)spg));
  for (int64_t i = 0, g = 0; i < ns; i += 16, g += per) {
    const int64_t n = std::min<int64_t>(per, ng - g);
    const __mmask16 m = __mmask16((1u << n) - 1), mo = ns - i >= 16 ? 0xFFFF : __mmask16((1u << (ns - i)) - 1);
    const __m512 v = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(src) + g))
                         : _mm512_maskz_loadu_ps(m, static_cast<const float*>(src) + g);
    _mm512_mask_storeu_ps(dst + i, mo, _mm512_permutexvar_ps(idx, v));
  }
}

// Rows [n0, n0 + nr) of a staged into qbuf / sbuf (resized here; nr a multiple of 4 for int4 tiles). Not for int8
// with 16-weight groups.
static Staged stage(const Problem& a, int64_t n0, int64_t nr, std::vector<int8_t>& qbuf, std::vector<float>& sbuf) {
  const int64_t K = a.K, ns = K / 32, cap = std::max(kNB, nr);
  sbuf.resize(2 * cap * ns);
  float* sc = sbuf.data();
  float* mn = sc + cap * ns;
  const bool has_min = a.int4 && (a.tiled ? a.tmins : a.mins != nullptr);
  Staged st{nullptr, K, sc, mn, ns, has_min ? kMin : kScaled};
  if (a.tiled) {  // int4 in 4-row tiles (TileGeo): records of up to 4 sub-block pairs per row
    qbuf.resize(cap * K);
    const TileGeo g(a);
    for (int64_t t = n0 / 4; t < (n0 + nr) / 4; ++t) {
      const uint8_t* tile = g.tile(a, t);
      for (int64_t q = 0; q <= g.nq; ++q) {
        const int64_t np = q < g.nq ? 4 : g.tail;
        if (np == 0) break;
        const uint8_t* rec = tile + q * g.rec;
        const int64_t sb = 2 * np * g.S;  // one row's scales in this record
        for (int64_t r = 0; r < 4; ++r) {
          const int64_t row = 4 * t - n0 + r;
          expand_scales(rec + r * sb, g.S == 2, 2 * np, 1, sc + row * ns + 8 * q);
          if (has_min) expand_scales(rec + 4 * sb + r * sb, g.S == 2, 2 * np, 1, mn + row * ns + 8 * q);
          const uint8_t* qs = rec + 4 * sb * g.c + r * 32 * np;
          for (int64_t i = 0; i < 2 * np; ++i) unpack_nibbles(qs + 16 * i, qbuf.data() + row * K + 256 * q + 32 * i,
                                                              has_min ? 0 : 8);
        }
      }
    }
    st.q = qbuf.data();
    return st;
  }
  const int64_t spg = a.sb_per_group;
  if (!a.int4 && spg == ns) {  // one scale per row: applied to the sums
    for (int64_t r = 0; r < nr; ++r) sc[r] = scale_of(a.scales, a.sf16, (n0 + r) * a.ldg);
    st.deq = kRowScale;
  } else {
    const int64_t es = a.sf16 ? 2 : 4;
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t at = (n0 + r) * a.ldg * es;
      expand_scales(static_cast<const char*>(a.scales) + at, a.sf16, ns / spg, spg, sc + r * ns);
      if (has_min) expand_scales(static_cast<const char*>(a.mins) + at, a.sf16, ns / spg, spg, mn + r * ns);
    }
  }
  if (!a.int4) {  // int8 rows are read where they lie
    st.q = static_cast<const int8_t*>(a.w) + n0 * a.ldw;
    st.ldq = a.ldw;
    return st;
  }
  qbuf.resize(cap * K);
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t s = 0; s < ns; ++s)
      unpack_nibbles(static_cast<const uint8_t*>(a.w) + (n0 + r) * a.ldw + 16 * s, qbuf.data() + r * K + 32 * s,
                     has_min ? 0 : 8);
  st.q = qbuf.data();
  return st;
}

// acc[r][c] (16 partial sums each, at acc + r * lda + 16 c) += x rows [R][kc] (stride ldx) . the dequantized staged
// rows [C] from k0 (kc a multiple of 16).
template <int R, int C, Deq D>
static inline void tile(const float* __restrict x, int64_t ldx, const Staged& st, int64_t k0, int64_t kc,
                        float* __restrict acc, int64_t lda) {
  __m512 s[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r][c] = _mm512_loadu_ps(acc + r * lda + 16 * c);
  const int8_t* q = st.q + k0;
  for (int64_t k = 0; k < kc; k += 16) {
    __m512 wv[C];
    const int64_t j = (k0 + k) / 32;
    for (int c = 0; c < C; ++c) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + c * st.ldq + k));
      if constexpr (D == kMin)
        wv[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), _mm512_set1_ps(st.sc[c * st.lds + j]),
                                _mm512_set1_ps(st.mn[c * st.lds + j]));
      else if constexpr (D == kScaled)
        wv[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(st.sc[c * st.lds + j]));
      else
        wv[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    }
    for (int r = 0; r < R; ++r) {
      __m512 xv = _mm512_loadu_ps(x + r * ldx + k);
      asm("" : "+v"(xv));  // keep x in a register: folded into each FMA as a memory operand it is loaded C times
      for (int c = 0; c < C; ++c) s[r][c] = _mm512_fmadd_ps(xv, wv[c], s[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + r * lda + 16 * c, s[r][c]);
}

template <int R, int C, Deq D>
static inline void tile_c(int c, const float* x, int64_t ldx, const Staged& st, int64_t k0, int64_t kc, float* acc,
                          int64_t lda) {
  if constexpr (C >= 1) {
    if (c == C) return tile<R, C, D>(x, ldx, st, k0, kc, acc, lda);
    tile_c<R, C - 1, D>(c, x, ldx, st, k0, kc, acc, lda);
  }
}

// R rows of x against the block's nr weight rows, C at a time.
template <int R, Deq D>
static inline void tile_rows(int r, const float* x, int64_t ldx, Staged st, int64_t nr, int64_t k0, int64_t kc,
                             float* acc, int64_t lda) {
  if constexpr (R >= 1) {
    if (r < R) return tile_rows<R - 1, D>(r, x, ldx, st, nr, k0, kc, acc, lda);
    constexpr int C = tile_cols(R);
    for (int64_t c0 = 0; c0 < nr; c0 += C) {
      Staged sc = st;
      sc.q += c0 * st.ldq, sc.sc += c0 * st.lds, sc.mn += c0 * st.lds;
      tile_c<R, C, D>((int)std::min<int64_t>(C, nr - c0), x, ldx, sc, k0, kc, acc + 16 * c0, lda);
    }
  }
}

// 16 vectors (stride 16 floats) -> their 16 horizontal sums, in order: a transpose-add network (45 ops, vs ~8 per
// vector for one reduce each).
static inline __m512 hsum16(const float* v) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_loadu_ps(v + 32 * i), b = _mm512_loadu_ps(v + 32 * i + 16);
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // per 128-bit lane: a02 b02 a13 b13
  }
  for (int i = 0; i < 4; ++i)  // per lane: the lane's sums of vectors 4i .. 4i + 3
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

// out [M][ldo] = x [M][K] (fp32, contiguous) . deq(w)^T (+ bias); each thread takes an even share of the weight
// blocks of kNB rows. Plain layouts (not int8 with 16-weight groups) and int4 tiles (not 6-bit tiles).
static void gemm(const Problem& a, int nthreads) {
  const int64_t M = a.M, N = a.N, K = a.K, ldo = ldo_of(a);
  const int64_t nblocks = (N + kNB - 1) / kNB;
  const int64_t nk = (K + kKC - 1) / kKC, kc_max = ((K + nk - 1) / nk + 31) / 32 * 32;
  const int64_t ntiles = (M + kMaxR - 1) / kMaxR;
  constexpr int64_t kLd = 33 * 16;  // scratch floats per x row: kNB (padded to 32) x 16 partial sums, + 16 (a
                                    // 2 KiB row stride aliases the tile's accumulator rows at 4 KiB)
  hk_par::parallel(nblocks, nthreads, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<int8_t> qbuf;
    thread_local std::vector<float> sbuf, scratch;
    scratch.resize(M * kLd);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kNB, nr = std::min(kNB, N - n0);
      const Staged st = stage(a, n0, nr, qbuf, sbuf);
      std::fill(scratch.begin(), scratch.end(), 0.0f);
      for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, K - k0);
        for (int64_t t = 0; t < ntiles; ++t) {  // balanced tiles of <= kMaxR rows
          const int64_t m0 = M * t / ntiles, r = M * (t + 1) / ntiles - m0;
          const float* x = a.x + m0 * K + k0;
          float* acc = scratch.data() + m0 * kLd;
          with_deq(st.deq,
                   [&](auto d) { tile_rows<kMaxR, decltype(d)::value>((int)r, x, K, st, nr, k0, kc, acc, kLd); });
        }
      }
      const __mmask16 m_lo = nr >= 16 ? 0xFFFF : __mmask16((1u << nr) - 1);
      const __mmask16 m_hi = nr <= 16 ? 0 : __mmask16((1u << (nr - 16)) - 1);
      __m512 s_lo = _mm512_set1_ps(1.0f), s_hi = s_lo;
      if (st.deq == kRowScale) {  // the rows' scales, sc[0 .. nr)
        s_lo = _mm512_maskz_loadu_ps(m_lo, st.sc);
        s_hi = _mm512_maskz_loadu_ps(m_hi, st.sc + 16);
      }
      for (int64_t m = 0; m < M; ++m) {
        float* o = a.out + m * ldo + n0;
        const float* s = scratch.data() + m * kLd;
        __m512 lo = _mm512_mul_ps(hsum16(s), s_lo), hi = _mm512_mul_ps(hsum16(s + 16 * 16), s_hi);
        if (a.bias) {
          lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m_lo, a.bias + n0));
          hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m_hi, a.bias + n0 + 16));
        }
        _mm512_mask_storeu_ps(o, m_lo, lo);
        _mm512_mask_storeu_ps(o + 16, m_hi, hi);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Broadcast form, for 32+ rows (decode steps with many sequences). The dot-form tiles above reach ~60% of what the
// bf16 panels' broadcast-form tiles (panel.cpp) do on the same shapes, so with enough rows to share the cost, each
// block of kBN weight rows x kBKC k is dequantized once into fp32 panels [kc][64] (16 x 16 transposes) and every
// 6-row x micro-panel runs 6 x 64 broadcast tiles against it. Per row, the results differ from the dot form only
// in summation order, but they do depend on the form: prompt steps keep the dot form at every row count (a prompt's
// last row recomputed alone after a prefix-cache hit must match its full prefill; see activations.prompt_rows).
// The broadcast form is ahead from about 32 rows (at 16 on a par, so not used there).

constexpr int64_t kBN = 64;     // weight rows per block: the tile's 64 columns
constexpr int64_t kBKC = 256;   // k per block (the fp32 panel block: 64 KiB, in L2)
constexpr int kBMR = 6;         // x rows per tile

static inline void transpose16(__m512* v) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    v[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    v[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    v[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    v[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes
    t[i] = _mm512_shuffle_f32x4(v[i], v[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(v[i], v[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(v[8 + i], v[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(v[8 + i], v[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    v[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    v[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    v[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
}

// Staged rows [r0, r0 + nr) (nr <= 16; the rest zero), k [k, k + 16), dequantized as the tiles above do, transposed
// into dst[j][0 .. 16) for j < 16 (row stride ld).
template <Deq D>
static inline void dequant_t16(const Staged& st, int64_t r0, int64_t nr, int64_t k, float* dst, int64_t ld) {
  __m512 v[16];
  const int64_t j = k / 32;
  for (int i = 0; i < 16; ++i) {
    if (i >= nr) {
      v[i] = _mm512_setzero_ps();
      continue;
    }
    const int64_t r = r0 + i;
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(st.q + r * st.ldq + k));
    if constexpr (D == kMin)
      v[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), _mm512_set1_ps(st.sc[r * st.lds + j]),
                             _mm512_set1_ps(st.mn[r * st.lds + j]));
    else if constexpr (D == kScaled)
      v[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(st.sc[r * st.lds + j]));
    else
      v[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(st.sc[r]));
  }
  transpose16(v);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ld, v[i]);
}

// out [R][64 masked] (row stride ldo) (+)= xt [kc][R] . wb [kc][64]: 24 accumulators, 4 loads + R broadcasts per k.
// accumulate: add to out (a later K block), else add bias (null: none).
template <int R>
static inline void btile(const float* __restrict xt, const float* __restrict wb, int64_t kc, float* __restrict out,
                         int64_t ldo, bool accumulate, const float* bias, const __mmask16* mask) {
  __m512 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) a[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b[4];
    for (int c = 0; c < 4; ++c) b[c] = _mm512_loadu_ps(wb + k * kBN + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(xt[k * R + r]);
      for (int c = 0; c < 4; ++c) a[r][c] = _mm512_fmadd_ps(xv, b[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) {
      float* o = out + r * ldo + 16 * c;
      const float* add = accumulate ? o : bias ? bias + 16 * c : nullptr;
      if (add) a[r][c] = _mm512_add_ps(a[r][c], _mm512_maskz_loadu_ps(mask[c], add));
      _mm512_mask_storeu_ps(o, mask[c], a[r][c]);
    }
}

template <int R>
static inline void btile_rows(int r, const float* xt, const float* wb, int64_t kc, float* out, int64_t ldo, bool acc,
                              const float* bias, const __mmask16* mask) {
  if constexpr (R >= 1) {
    if (r < R) return btile_rows<R - 1>(r, xt, wb, kc, out, ldo, acc, bias, mask);
    btile<R>(xt, wb, kc, out, ldo, acc, bias, mask);
  }
}

// One block of nr (<= kBN) weight rows from n0 against every row of x (xp: 6-row micro-panels, [K][r] each).
template <Deq D>
static void bcast_block(const Problem& a, const Staged& st, int64_t n0, int64_t nr, const float* xp, float* wb) {
  const int64_t M = a.M, K = a.K, ldo = ldo_of(a), ntiles = (M + kBMR - 1) / kBMR;
  const int64_t nk = (K + kBKC - 1) / kBKC, kc_max = ((K + nk - 1) / nk + 31) / 32 * 32;
  __mmask16 mask[4];
  for (int c = 0; c < 4; ++c) {
    const int64_t v = nr - 16 * c;
    mask[c] = v >= 16 ? 0xFFFF : v <= 0 ? 0 : __mmask16((1u << v) - 1);
  }
  for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
    const int64_t kc = std::min(kc_max, K - k0);
    for (int64_t g = 0; g < kBN / 16; ++g)
      for (int64_t k = 0; k < kc; k += 16)
        dequant_t16<D>(st, 16 * g, std::min<int64_t>(16, nr - 16 * g), k0 + k, wb + k * kBN + 16 * g, kBN);
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t m0 = t * kBMR, r = std::min<int64_t>(kBMR, M - m0);
      btile_rows<kBMR>((int)r, xp + m0 * K + k0 * r, wb, kc, a.out + m0 * ldo + n0, ldo, k0 > 0,
                       a.bias ? a.bias + n0 : nullptr, mask);
    }
  }
}

// out [M][ldo] = x . deq(w)^T (+ bias) in broadcast form; same formats as gemm().
static void gemm_bcast(const Problem& a, int nthreads) {
  const int64_t M = a.M, N = a.N, K = a.K;
  const int64_t ntiles = (M + kBMR - 1) / kBMR, nblocks = (N + kBN - 1) / kBN;
  std::vector<float> xbuf(M * K);
  float* xp = xbuf.data();
  for (int64_t t = 0; t < ntiles; ++t) {  // x rows packed k-major per 6-row tile
    const int64_t m0 = t * kBMR, r = std::min<int64_t>(kBMR, M - m0);
    for (int64_t m = 0; m < r; ++m)
      for (int64_t k = 0; k < K; ++k) xp[m0 * K + k * r + m] = a.x[(m0 + m) * K + k];
  }
  hk_par::parallel(nblocks, nthreads, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<int8_t> qbuf;
    thread_local std::vector<float> sbuf, wb;
    wb.resize(kBKC * kBN);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBN, nr = std::min(kBN, N - n0);
      const Staged st = stage(a, n0, nr, qbuf, sbuf);
      with_deq(st.deq, [&](auto d) { bcast_block<decltype(d)::value>(a, st, n0, nr, xp, wb.data()); });
    }
  });
}
