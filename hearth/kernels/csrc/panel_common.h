// What panel.cpp (fp32 FMA tiles) and panel_dot.cpp (vdpbf16ps tiles) share: the panel pairs a GEMM walks, the
// blocked loop order (blocked_loop.h), and the 16 x 16 transpose of 32-bit values their packers use. Included inside each file's
// anonymous namespace, under its `#pragma GCC target` (AVX-512F at least), so each gets its own copy.

#include "blocked_loop.h"

// Lanes of one 16-row half (0: panel rows 0-15, 1: rows 16-31) that hold real rows, for a panel with nvalid of 32.
inline __mmask16 half_mask(int nvalid, int half) {
  const int n = nvalid - 16 * half;
  return n >= 16 ? 0xFFFF : n <= 0 ? 0 : __mmask16((1u << n) - 1);
}

// A tile's R x NV accumulators (NV / 2 panels, two 16-row halves each) into out (row stride ldo), masked to the
// valid columns nv[panel]: added to out (accumulate: a later K block), else to the bias (first block; null: none).
template <int R, int NV>
inline void store_tile(__m512 (&a)[R][NV], float* out, int64_t ldo, bool accumulate, const float* bias,
                       const int* nv) {
  __mmask16 mask[NV];
  for (int c = 0; c < NV; ++c) mask[c] = half_mask(nv[c / 2], c % 2);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) {
      float* o = out + r * ldo + c * 16;
      const float* add = accumulate ? o : bias ? bias + c * 16 : nullptr;
      if (add) a[r][c] = _mm512_add_ps(a[r][c], _mm512_maskz_loadu_ps(mask[c], add));
      _mm512_mask_storeu_ps(o, mask[c], a[r][c]);
    }
}

// store_tile's sums rounded to bf16 (hk::bf16_high16: nearest even, a NaN stays a quiet NaN) into out16
// (row stride ldo16): the last K block of a GEMM whose caller wants the model dtype, so no fp32 output and no
// conversion pass. partial: the earlier K blocks' fp32 sums (row stride ldp), added first; else the bias (or none).
template <int R, int NV>
inline void store_tile_bf16(__m512 (&a)[R][NV], uint16_t* out16, int64_t ldo16, const float* partial, int64_t ldp,
                            const float* bias, const int* nv) {
  __mmask16 mask[NV];
  for (int c = 0; c < NV; ++c) mask[c] = half_mask(nv[c / 2], c % 2);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) {
      const float* add = partial ? partial + r * ldp + c * 16 : bias ? bias + c * 16 : nullptr;
      const __m512 v = add ? _mm512_add_ps(a[r][c], _mm512_maskz_loadu_ps(mask[c], add)) : a[r][c];
      const __m512i b = _mm512_srli_epi32(hk::bf16_high16(v), 16);
      _mm256_mask_storeu_epi16(out16 + r * ldo16 + c * 16, mask[c], _mm512_cvtepi32_epi16(b));
    }
}

// A run of one or two panels of one part: the unit the tiled GEMM hands to tile().
struct PanelPair {
  const uint16_t* w;   // first panel
  int64_t col;         // its first output column
  const float* bias;   // bias at col, or null
  int nv[2];           // valid columns per panel (nv[1] = 0: one panel)
};

// The pairs of cat(parts) (part i: n[i] rows as 32-row panels of panel_elems bf16 each, consecutive).
inline std::vector<PanelPair> panel_pairs(int64_t nparts, const void* const* w, const int64_t* n, const float* bias,
                                          int64_t panel_elems) {
  constexpr int64_t kRows = 32;
  std::vector<PanelPair> pairs;
  for (int64_t i = 0, col = 0; i < nparts; col += n[i], ++i) {
    const int64_t P = (n[i] + kRows - 1) / kRows;
    for (int64_t p = 0; p < P; p += 2) {
      const int64_t c = col + p * kRows;
      pairs.push_back({static_cast<const uint16_t*>(w[i]) + p * panel_elems, c, bias ? bias + c : nullptr,
                       {(int)std::min<int64_t>(kRows, n[i] - p * kRows),
                        p + 1 < P ? (int)std::min<int64_t>(kRows, n[i] - (p + 1) * kRows) : 0}});
    }
  }
  return pairs;
}

// c[j] = the 16 values r[0..15][j] (r: 16 rows of 16 32-bit values): unpacks within 128-bit lanes, then a 4 x 4
// transpose of the lanes.
inline void transpose16_epi32(__m512i r[16], __m512i c[16]) {
  __m512i t[16];
  for (int j = 0; j < 8; ++j) {
    t[2 * j] = _mm512_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
    t[2 * j + 1] = _mm512_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
  }
  for (int j = 0; j < 4; ++j) {  // r[4j + q], 128-bit lane L: column 4L + q of rows 4j .. 4j + 3
    r[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
    r[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
    r[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
    r[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x44), v1 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xEE);
    c[q] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    c[4 + q] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    c[8 + q] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    c[12 + q] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}
