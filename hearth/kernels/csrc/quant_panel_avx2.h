// The panel GEMM on CPUs with AVX2 and no VNNI: the panels of quant_panel.cpp, byte for byte, multiplied in
// broadcast form by vpmaddubsw. Included by quant_panel.cpp inside its anonymous namespace, outside its AVX-512
// region; everything here is compiled for AVX2 + FMA + F16C only.
//
// Reading the AVX-512 layout 32 bytes at a time: the 32-byte half h of int4 vector v of a quad holds, per 32-bit
// lane i (0..7), k 4j..4j+3 of column 32v + 8h + i in its low nibbles and of column 32v + 16 + 8h + i in its high
// ones. So one load and two masks give two 8-column groups x 4 k, and one vpmaddubsw per group and x row (an x row's
// 4 bytes broadcast to every lane) adds pairs of u8 x s8 products into 16-bit lanes.
// 16-bit sums are exact over a whole block of 32: 8 quads x 2 x 15 x 127 = 30480 < 2^15, so the integer sum of a
// block costs one vpmaddwd (to 32 bits) per group and x row, not one per quad (what the row kernels pay: a
// vpmaddubsw + vpmaddwd pair per 32 products). int8 panels stay on VNNI: read here as two nibble halves (u8 to 255
// would saturate 16 bits) they took twice the vpmaddubsw of the int8 row kernels, and ran slower than those.
//
// Per block and output the float steps are quant_panel.cpp's: (int sum - off * sum q) converted, times the scale,
// fma'd with dx (+ min * the block's float sum for mins; int8x2: 254 a1 + a2 as one fma). So each x row's result
// depends only on that row, never on the rows sharing its step.

namespace avx2 {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

// x rows per tile (one int8 term): 4 rows x 2 groups keep 8 16-bit sums, the slice's two vectors and a broadcast
// in the 16 ymm registers (the float sums spill to L1 once per block).
constexpr int kRows = 4;
constexpr int64_t kPrefetchBytes = 4 << 10;  // (as the AVX-512 body's on AMD)

inline __m256 load8(const void* x, int dtype, int64_t i) {
  if (dtype == kF32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  if (dtype == kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline int32_t hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 32 int32 (four vectors, in order) -> 32 int8 with signed saturation, in order.
inline __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// quant_panel.cpp's quantize_row on 8 lanes: the same operations per element (amax, dx = amax / 127, q1 = round
// half even of x * fl(1 / dx), the second term by one fnmadd), so the same bytes and scales.
void quantize_row(const void* x, int dtype, int64_t off, int64_t K, bool x2, int8_t* q1, int8_t* q2, float* d,
                  int32_t* s1, int32_t* s2, float* fs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load8(x, dtype, off + 32 * b + 8 * i);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    }
    float dx = hk::hmax8(mx) / 127.0f;
    const __m256 id = _mm256_set1_ps(dx > 0.0f ? 1.0f / dx : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q1 + 32 * b), pack32(q[0], q[1], q[2], q[3]));
    const int32_t t1 = hsum8i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    int32_t t2 = 0;
    if (x2) {
      const float d2 = dx / 254.0f;
      const __m256 vd2 = _mm256_set1_ps(d2), id2 = _mm256_set1_ps(d2 > 0.0f ? 1.0f / d2 : 0.0f);
      const __m256i k254 = _mm256_set1_epi32(254), lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
      __m256i r[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 rest = _mm256_fnmadd_ps(vd2, _mm256_cvtepi32_ps(_mm256_mullo_epi32(q[i], k254)), v[i]);
        r[i] = _mm256_max_epi32(nlim, _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_mul_ps(rest, id2))));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + 32 * b), pack32(r[0], r[1], r[2], r[3]));
      t2 = hsum8i(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
      dx = d2;
    }
    d[b] = dx;
    s1[b] = t1;
    s2[b] = t2;
    fs[b] = dx * (float)(x2 ? 254 * t1 + t2 : t1);
  }
}

inline __m256 scales8(const float* s) { return _mm256_loadu_ps(s); }
inline __m256 scales8(const uint16_t* s) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}

inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// 8 sums (an 8-column group's, n of them real columns) to out: added to out (accumulate: a later K block) or to the
// bias (null: none); out16 (the last K block of a bf16-output call): rounded to bf16 there instead.
inline void store8(__m256 v, float* out, bool accumulate, const float* bias, uint16_t* out16, int n) {
  if (n <= 0) return;
  alignas(32) float buf[8];
  if (n == 8) {
    if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(out));
    else if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias));
  } else {
    _mm256_store_ps(buf, v);
    for (int i = 0; i < n; ++i) buf[i] += accumulate ? out[i] : bias ? bias[i] : 0.0f;
    v = _mm256_load_ps(buf);
  }
  if (out16) {
    const __m256i b = _mm256_srli_epi32(hk::bf16_high8(v), 16);
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    if (n == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out16), h);
    } else {
      alignas(16) uint16_t hb[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(hb), h);
      for (int i = 0; i < n; ++i) out16[i] = hb[i];
    }
  } else if (n == 8) {
    _mm256_storeu_ps(out, v);
  } else {
    _mm256_store_ps(buf, v);
    for (int i = 0; i < n; ++i) out[i] = buf[i];
  }
}

// Column of a panel where 32-byte slice s (0..3) of a quad starts (vector s / 2, half s % 2): its low nibbles hold
// columns c0 .. c0 + 7, its high ones c0 + 16 .. c0 + 23.
constexpr int slice_col(int s) { return 32 * (s / 2) + 8 * (s % 2); }

// R x rows [m0, m0 + R) against NS slices [s0, s0 + NS) of one int4 panel (2 NS 8-column groups) over blocks
// [b0, b1). A block's 16-bit sums stay in registers (2 NS R of them, twice for int8x2) beside a slice's two unpacked
// vectors; the float sums are added to once per block.
template <int R, int NS, bool X2, bool MINS, class S, bool PF>
void slices(const XQ& xq, int64_t m0, const uint8_t* wp, int s0, const S* sp, const S* mp, int64_t b0, int64_t b1,
            int64_t spg, float* out, int64_t ldo, bool accumulate, const float* bias, int nvalid, uint16_t* out16) {
  constexpr int32_t kOff = MINS ? 0 : 8;
  constexpr int64_t kQuadBytes = 128;
  constexpr int G = 2 * NS;  // 8-column groups
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const int64_t K = xq.K, nb = xq.nb;
  int col[G];  // each group's first column in the panel
  for (int s = 0; s < NS; ++s) col[2 * s] = slice_col(s0 + s), col[2 * s + 1] = slice_col(s0 + s) + 16;
  __m256 f[R][G];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c) f[r][c] = _mm256_setzero_ps();
  int64_t g = b0 / spg, in_group = b0 % spg;  // the block's scale group, kept without a division per block
  for (int64_t b = b0; b < b1; ++b, in_group = in_group + 1 == spg ? (++g, 0) : in_group + 1) {
    __m256i a1[R][G], a2[X2 ? R : 1][G];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < G; ++c) {
        a1[r][c] = _mm256_setzero_si256();
        if constexpr (X2) a2[r][c] = _mm256_setzero_si256();
      }
    const uint8_t* wb = wp + b * kQuads * kQuadBytes + 32 * s0;
    const int8_t* x1p = xq.q1 + m0 * K + 32 * b;
    const int8_t* x2p = xq.q2 + m0 * K + 32 * b;
    // (unrolled by 2, not 8: fully unrolled, GCC computed every quad's products first and spilled them all)
#pragma GCC unroll 2
    for (int qd = 0; qd < kQuads; ++qd) {
      // PF (the first pass of the first row tile over a K block): every line of the quad kPrefetchBytes ahead, as
      // the passes of one slice each touch a line in 2-4 would leave the hardware prefetcher strided, partial reads
      if constexpr (PF)
        for (int64_t l = 0; l < kQuadBytes; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(wb - 32 * s0 + qd * kQuadBytes + l) + kPrefetchBytes,
                       _MM_HINT_T0);
      __m256i x1[R], x2[X2 ? R : 1];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        x1[r] = bcast32(x1p + r * K + 4 * qd);
        if constexpr (X2) x2[r] = bcast32(x2p + r * K + 4 * qd);
      }
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) {
        const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + qd * kQuadBytes + 32 * s));
        const __m256i lo = _mm256_and_si256(l, nib), hi = _mm256_and_si256(_mm256_srli_epi16(l, 4), nib);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          a1[r][2 * s] = _mm256_add_epi16(a1[r][2 * s], _mm256_maddubs_epi16(lo, x1[r]));
          a1[r][2 * s + 1] = _mm256_add_epi16(a1[r][2 * s + 1], _mm256_maddubs_epi16(hi, x1[r]));
          if constexpr (X2) {
            a2[r][2 * s] = _mm256_add_epi16(a2[r][2 * s], _mm256_maddubs_epi16(lo, x2[r]));
            a2[r][2 * s + 1] = _mm256_add_epi16(a2[r][2 * s + 1], _mm256_maddubs_epi16(hi, x2[r]));
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t at = (m0 + r) * nb + b;
      const __m256 dx = _mm256_set1_ps(xq.d[at]);
      const __m256i c1 = _mm256_set1_epi32(-kOff * xq.s1[at]);
#pragma GCC unroll 8
      for (int c = 0; c < G; ++c) {  // (the group's exact sum u q - off sum q, to float)
        __m256 v = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(a1[r][c], ones), c1));
        if constexpr (X2) {
          const __m256i c2 = _mm256_set1_epi32(-kOff * xq.s2[at]);
          v = _mm256_fmadd_ps(v, _mm256_set1_ps(254.0f),
                              _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(a2[r][c], ones), c2)));
        }
        f[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(v, scales8(sp + g * kCols + col[c])), dx, f[r][c]);
        if constexpr (MINS)
          f[r][c] = _mm256_fmadd_ps(scales8(mp + g * kCols + col[c]), _mm256_set1_ps(xq.fs[at]), f[r][c]);
      }
    }
  }
  const bool last = b1 == nb;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < G; ++c)
      store8(f[r][c], out + r * ldo + col[c], accumulate, bias ? bias + col[c] : nullptr,
             out16 && last ? out16 + r * ldo + col[c] : nullptr, std::clamp(nvalid - col[c], 0, 8));
}

// R x rows against one panel (64 columns) over blocks [b0, b1), quant_panel.cpp's tile() contract: the 4 slices of
// a quad NS at a time, so that 8 16-bit sums per chain are live (one row: all 4 at once, or 2 with two chains;
// several rows: one slice).
template <int R, bool X2, bool MINS, class S, bool PF>
void panel_tile(const XQ& xq, int64_t m0, const uint8_t* wp, const S* sp, const S* mp, int64_t b0, int64_t b1,
                int64_t spg, float* out, int64_t ldo, bool accumulate, const float* bias, int nvalid, uint16_t* out16) {
  constexpr int NS = R > 1 ? 1 : X2 ? 2 : 4;
  slices<R, NS, X2, MINS, S, PF>(xq, m0, wp, 0, sp, mp, b0, b1, spg, out, ldo, accumulate, bias, nvalid,
                                        out16);
  for (int s = NS; s < 4; s += NS)
    if (nvalid > slice_col(s))
      slices<R, NS, X2, MINS, S, false>(xq, m0, wp, s, sp, mp, b0, b1, spg, out, ldo, accumulate, bias,
                                               nvalid, out16);
}

template <bool X2, bool MINS, class S, bool PF>
void tile_r(int r, const XQ& xq, int64_t m0, const uint8_t* wp, const S* sp, const S* mp, int64_t b0, int64_t b1,
            int64_t spg, float* out, int64_t ldo, bool accumulate, const float* bias, int nvalid, uint16_t* out16) {
#define HQ_TILE(R) \
  panel_tile<R, X2, MINS, S, PF>(xq, m0, wp, sp, mp, b0, b1, spg, out, ldo, accumulate, bias, nvalid, out16)
  if (r == 1) return HQ_TILE(1);
  if constexpr (X2) return HQ_TILE(2);  // two chains: 2 rows fill the registers
  if (r == 2) return HQ_TILE(2);
  if (r == 3) return HQ_TILE(3);
  HQ_TILE(kRows);
#undef HQ_TILE
}

#pragma GCC pop_options

}  // namespace avx2
