// hearth weight-only quantized linear kernels: y = x deq(w)^T (+ b) for int8 (symmetric, per-group or per-channel
// scale) and int4 (per-group scale and min) weights; x fp32 / bf16 / f16, fp32 accumulate. See quant_impl.h for the
// layout. Same build rules as linear.cpp: per-ISA `#pragma GCC target`, chosen at run time by the caller, C ABI.
//
// The small-M kernels, one body (hk_family::quant_rows, behind hk_linear) with a kernel argument (which one runs is hearth/weights/dispatch.py's
// choice):
//   kQuantDotFloat   x stays fp32 and weights are dequantized in registers (quant_impl.h): the dequantized float
//                    model's results up to summation order, but compute-bound (~4 vector ops per weight).
//   kQuantDotInt8    x quantized once per call to int8 blocks of 32 (llama.cpp's Q8 activations), integer dot
//                    products (maddubs / vpdpbusd), one float fma per 32 (int8) or 2 x 32 (int4) weights
//                    (quant_dot_impl.h): a fraction of the instructions, decode becomes memory-bound. Results are the
//                    dequantized weights times the int8-rounded x (relative error ~ 1/254 of each block's amax).
//   kQuantDotInt8x2  the same with two-term activations x ~ d2 * (254 * q1 + q2) per block (error <= d2 / 2 =
//                    amax / 64516): a second integer dot chain on the same unpacked weights, still one float fma per
//                    block (quant_dot_impl.h, kX2).
//   kQuantGemm, kQuantGemmBcast   the fp32-x GEMM for more rows (quant_gemm_impl.h).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"
#include "simd_avx2.h"
#include "parallel.h"
#include "hk_api.h"

namespace hq {

struct Problem {
  const float* x;  // [M][K] fp32, contiguous
  const void* w;   // [N][ldw bytes]: int8 [K] or packed int4 [K / 2]
  int64_t ldw;
  const void* scales;  // [N][ldg] fp32, or fp16 when sf16 (GGUF's own scale type: 2 bytes per block, not 4)
  const void* mins;    // [N][ldg] (int4 only), same type; nullptr: symmetric int4, min = -8 * scale (GGUF Q4_0)
  int64_t ldg;
  int64_t sb_per_group;  // G / 32; 0: 16-weight groups (int8 only), two scales per sub-block of 32
  const float* bias;     // [N] or nullptr
  float* out;            // [M][N]
  int64_t M, N, K;
  bool int4;
  bool sf16;
  bool tiled = false;  // int4 in 4-row tiles with scales / mins inline (TileGeo): w, ldw, tmins describe it
  bool tmins = false;  // tiled: the records hold mins (else symmetric, min = -8 * scale)
  bool q6 = false;     // GGUF Q6_K's 6-bit weights in 4-row tiles (kQ6Rec): w, ldw describe it; int8 semantics
  int64_t ldo = 0;     // out's row stride (0: N)
};

static inline int64_t ldo_of(const Problem& a) { return a.ldo ? a.ldo : a.N; }
static inline bool tiles_of(const Problem& a) { return a.tiled || a.q6; }  // (then TileScratch::view unpacks)

using hk::f16_to_f32_baseline;

// int4 with 32-weight groups in 4-row tiles (hearth.kernels.quant.tile_rows4; N % 4 == 0, K % 64 == 0): rows
// 4t .. 4t + 3 are 4 * ldw bytes at w + 4 t ldw (ldw = the plain row's bytes: K / 2 + scales (+ mins)), a run of
// records, each n = 4 pairs of blocks (256 weights; the last one K % 256 / 64 pairs):
//   [scales: 4 rows x 2n][mins: 4 rows x 2n, tmins only][quants: 4 rows x 32n bytes, pair by pair as in the plain row]
// So a decode tile of four rows is ONE sequential stream; the plain layout makes it four row streams plus four
// scale streams, which every chunk of rows restarts: the tiles are clearly faster (rows interleaved with the scales
// in their own array were not). The same tiles for int8 (Q8_0) measured slower than int8's four row streams, so int8
// keeps the plain layout.
struct TileGeo {
  int64_t S, c, np, nq, tail, rec;  // scale bytes, 1 + tmins, pairs per row, full records, pairs in the last, bytes
  TileGeo(const Problem& a) : S(a.sf16 ? 2 : 4), c(a.tmins ? 2 : 1), np(a.K / 64), nq(np / 4), tail(np % 4),
                              rec(4 * 4 * (2 * S * c + 32)) {}
  const uint8_t* tile(const Problem& a, int64_t t) const { return static_cast<const uint8_t*>(a.w) + t * 4 * a.ldw; }
};

// Tile t -> the plain layout: quants [4][K / 2], scales / mins [4][K / 32] (S bytes each).
static void unpack_tile(const Problem& a, const TileGeo& g, int64_t t, uint8_t* qs, uint8_t* sc, uint8_t* mn) {
  const uint8_t* rec = g.tile(a, t);
  const int64_t nb = a.K / 32;
  for (int64_t k = 0; k <= g.nq; ++k, rec += g.rec) {
    const int64_t n = k < g.nq ? 4 : g.tail;
    if (n == 0) break;
    const int64_t sb = 2 * n * g.S;  // one row's scales in this record
    for (int r = 0; r < 4; ++r) {
      std::memcpy(sc + (r * nb + 8 * k) * g.S, rec + r * sb, sb);
      if (g.c == 2) std::memcpy(mn + (r * nb + 8 * k) * g.S, rec + 4 * sb + r * sb, sb);
      std::memcpy(qs + r * (a.K / 2) + 128 * k, rec + 4 * sb * g.c + r * 32 * n, 32 * n);
    }
  }
}

// 6-bit weights (GGUF Q6_K, hearth.kernels.quant_gguf.repack_q6_tiles; K % 256 == 0, N % 4 == 0): per row and
// super-block of 256 weights the file's own block of kQ6Rec bytes, [ql: 128][qh: 64][16 scales: int8][d: fp16]; per
// half h (128 weights) element i < 64 is the low nibble of ql[64h + i] and 64 + i its high nibble, and element
// 32j + l's high two bits are bits 2j..2j+1 of qh[32h + l]; weight = d * scale[e / 16] * (6-bit value - 32). Rows
// 4t .. 4t + 3 are one run of blocks, super-block by super-block ([k][row]), so a decode tile streams from one place.
// 210 bytes per 256 weights, as the file: 35% fewer than the int8 + fp32 group-16 scales it becomes otherwise (82 ->
// 54 MB for a 32000 x 2048 LM head).
constexpr int64_t kQ6Rec = 210, kQ6Qh = 128, kQ6Sc = 192, kQ6D = 208;

// Tile t -> int8 [4][K] (value - 32) and fp32 scales [4][K / 16] (d * scale, exact): the int8 group-16 layout.
static void unpack_q6_tile(const Problem& a, int64_t t, int8_t* q, float* sc) {
  const int64_t nsb = a.K / 256;
  const uint8_t* rec = static_cast<const uint8_t*>(a.w) + t * 4 * a.ldw;
  for (int64_t k = 0; k < nsb; ++k)
    for (int r = 0; r < 4; ++r, rec += kQ6Rec) {
      const float d = f16_to_f32_baseline(uint16_t(rec[kQ6D] | rec[kQ6D + 1] << 8));
      for (int i = 0; i < 16; ++i) sc[r * (a.K / 16) + 16 * k + i] = d * float(int8_t(rec[kQ6Sc + i]));
      int8_t* o = q + r * a.K + 256 * k;
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, i = e % 128;
        const int nib = rec[64 * h + i % 64], lo = i < 64 ? nib & 0x0F : nib >> 4;
        const int hi = (rec[kQ6Qh + 32 * h + i % 32] >> (2 * (i / 32))) & 3;
        o[e] = int8_t((lo | hi << 4) - 32);
      }
    }
}

// A plain Problem over unpacked tiles [t0, t1) (rows 4 t0 .. 4 t1, in this scratch), writing a's outputs of those rows.
struct TileScratch {
  std::vector<uint8_t> qs, sc, mn;
  Problem view(const Problem& a, const TileGeo& g, int64_t t0, int64_t t1) {
    const int64_t nb = a.K / 32, rows = 4 * (t1 - t0);
    if (a.q6) {  // -> int8, 16-weight groups
      qs.resize(rows * a.K);
      sc.resize(rows * a.K / 16 * sizeof(float));
      for (int64_t t = t0; t < t1; ++t)
        unpack_q6_tile(a, t, reinterpret_cast<int8_t*>(qs.data()) + 4 * (t - t0) * a.K,
                       reinterpret_cast<float*>(sc.data()) + 4 * (t - t0) * (a.K / 16));
      Problem p = a;
      p.w = qs.data();
      p.ldw = a.K;
      p.scales = sc.data();
      p.mins = nullptr;
      p.ldg = a.K / 16;
      p.sf16 = false;
      p.bias = a.bias ? a.bias + 4 * t0 : nullptr;
      p.out = a.out ? a.out + 4 * t0 : nullptr;
      p.ldo = ldo_of(a);
      p.N = rows;
      p.q6 = false;
      return p;
    }
    qs.resize(rows * a.K / 2);
    sc.resize(rows * nb * g.S);
    mn.resize(g.c == 2 ? rows * nb * g.S : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = 4 * (t - t0);
      unpack_tile(a, g, t, qs.data() + r0 * a.K / 2, sc.data() + r0 * nb * g.S,
                  g.c == 2 ? mn.data() + r0 * nb * g.S : nullptr);
    }
    Problem p = a;
    p.w = qs.data();
    p.ldw = a.K / 2;
    p.scales = sc.data();
    p.mins = g.c == 2 ? mn.data() : nullptr;
    p.ldg = nb;
    p.bias = a.bias ? a.bias + 4 * t0 : nullptr;
    p.out = a.out ? a.out + 4 * t0 : nullptr;
    p.ldo = ldo_of(a);
    p.N = rows;
    p.tiled = p.tmins = false;
    return p;
  }
};

// x quantized for the integer-dot path (quant_dot_impl.h).
struct XQ {
  const int8_t* q;    // [M][K] (int4: pairs of blocks permuted, see quant_dot_impl.h)
  const float* d;     // int8: [M][nb] dx; int4: [M][npairs][8] = dxA x4, dxB x4 (+ [8] for an odd last block)
  const float* xs;    // int4: [M][K / G] per-group sums of the dequantized x; else nullptr
  int64_t ld_d, ld_xs;
  const int8_t* q2;   // two-term mode ("int8x2"): the residual's int8 [M][K], same layout as q; else nullptr
  const float* dn;    // int4: [M][nb] dx per block in natural order (the folded M = 1 loops); else nullptr
  const int16_t* x16; // int8 weights, q widened (int8x2: 254 q + q2): AVX-512, one-row chunks (not 16-weight groups),
                      // natural order; AVX2: [M][K], each block's even-indexed then odd-indexed values
};

// Scale / min i of a Problem (the float dequantizing paths; the integer-dot kernels read them vectorized).
static inline float scale_at(const Problem& a, int64_t i) {
  return a.sf16 ? f16_to_f32_baseline(static_cast<const uint16_t*>(a.scales)[i]) : static_cast<const float*>(a.scales)[i];
}
static inline float min_at(const Problem& a, int64_t i) {
  return a.sf16 ? f16_to_f32_baseline(static_cast<const uint16_t*>(a.mins)[i]) : static_cast<const float*>(a.mins)[i];
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
struct T {
  using V = __m256;
  static constexpr int L = 8, NV = 4;
  static constexpr int kMR = 2, kNR = 4;  // 8 accumulators + 4 dequantized weights + scale/min in 16 ymm
  static constexpr int kNR1 = 8;
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline V set1(float f) { return _mm256_set1_ps(f); }
  static inline float hsum(V v) { return hk::hsum8(v); }
  // s0 scales weights 0..15, s1 16..31 (equal unless 16-weight groups)
  static inline void deq_i8(const int8_t* p, V s0, V s1, V out[4]) {
    for (int i = 0; i < 4; ++i) {
      __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * i));
      out[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), i < 2 ? s0 : s1);
    }
  }
  static inline void deq_u4(const uint8_t* p, V s, V mn, V out[4]) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), s, mn);
    out[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), s, mn);
    out[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), s, mn);
    out[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), s, mn);
  }
};
#include "quant_impl.h"
struct D {
  static inline __m256i dot(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  static inline __m256i dot2(__m256i acc, __m256i u1, __m256i s1, __m256i u2, __m256i s2) {
    // (callers keep |u1.s1 pair| + |u2.s2 pair| < 2^15: int4 weights only)
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u1, s1), _mm256_maddubs_epi16(u2, s2));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  // Two-term activations (kX2): 254 * (u.s) + u.t per s32 lane, the factor 254 applied by madd's 16-bit weight
  // (exact: |pair sum| <= 2 * 128 * 127, times 2 * 254, fits int32).
  static inline __m256i dot_x2(__m256i u, __m256i s, __m256i t) {
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(254)),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(u, t), _mm256_set1_epi16(1)));
  }
  // 254 * (u1.s1 + u2.s2) + (u1.t1 + u2.t2) (int4 weights, as dot2)
  static inline __m256i dot2_x2(__m256i u1, __m256i s1, __m256i u2, __m256i s2, __m256i t1, __m256i t2) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u1, s1), _mm256_maddubs_epi16(u2, s2));
    const __m256i q = _mm256_add_epi16(_mm256_maddubs_epi16(u1, t1), _mm256_maddubs_epi16(u2, t2));
    return _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(254)), _mm256_madd_epi16(q, _mm256_set1_epi16(1)));
  }
};
#include "quant_dot_impl.h"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")
namespace avx512 {
struct T {
  using V = __m512;
  static constexpr int L = 16, NV = 2;
  static constexpr int kMR = 4, kNR = 4;  // 16 accumulators + 2 weights + scale/min in 32 zmm
  static constexpr int kNR1 = 8;
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V set1(float f) { return _mm512_set1_ps(f); }
  static inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static inline void deq_i8(const int8_t* p, V s0, V s1, V out[2]) {  // s0: weights 0..15, s1: 16..31
    for (int i = 0; i < 2; ++i) {
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i));
      out[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), i ? s1 : s0);
    }
  }
  static inline void deq_u4(const uint8_t* p, V s, V mn, V out[2]) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    out[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask))), s, mn);
    out[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask))),
                             s, mn);
  }
};
#include "quant_impl.h"
#include "quant_gemm_impl.h"
}  // namespace avx512
#pragma GCC pop_options

// AVX-512BW without VNNI: avx2's integer dots, plus 512-bit ones for the M = 1 int4 tiles
// (HQ_ZMM: tile_records_zmm, which has the measurements).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")
namespace avx512bw {
struct D : avx2::D {
  // (int4 weights: |u1.s1 pair| + |u2.s2 pair| < 2^15, as avx2::D::dot2)
  static inline __m512i dot2_zmm(__m512i u1, __m512i s1, __m512i u2, __m512i s2) {
    const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(u1, s1), _mm512_maddubs_epi16(u2, s2));
    return _mm512_madd_epi16(p, _mm512_set1_epi16(1));
  }
  static inline __m512i dot2_x2_zmm(__m512i u1, __m512i s1, __m512i u2, __m512i s2, __m512i t1, __m512i t2) {
    const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(u1, s1), _mm512_maddubs_epi16(u2, s2));
    const __m512i q = _mm512_add_epi16(_mm512_maddubs_epi16(u1, t1), _mm512_maddubs_epi16(u2, t2));
    return _mm512_add_epi32(_mm512_madd_epi16(p, _mm512_set1_epi16(254)), _mm512_madd_epi16(q, _mm512_set1_epi16(1)));
  }
};
#define HQ_ZMM 1
#include "quant_dot_impl.h"
#undef HQ_ZMM
}  // namespace avx512bw
#pragma GCC pop_options

// AVX-512 VNNI: the same integer-dot code with vpdpbusd (EVEX, needs VL), 512-bit for the M = 1 int4 tiles.
// Chosen at run time by __builtin_cpu_supports.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
namespace vnni {
struct D {
  static inline __m256i dot(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
  static inline __m256i dot2(__m256i acc, __m256i u1, __m256i s1, __m256i u2, __m256i s2) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u1, s1), u2, s2);
  }
  static inline __m256i times254(__m256i p) { return _mm256_sub_epi32(_mm256_slli_epi32(p, 8), _mm256_slli_epi32(p, 1)); }
  static inline __m256i dot_x2(__m256i u, __m256i s, __m256i t) {
    return dot(times254(dot(_mm256_setzero_si256(), u, s)), u, t);
  }
  static inline __m256i dot2_x2(__m256i u1, __m256i s1, __m256i u2, __m256i s2, __m256i t1, __m256i t2) {
    return dot2(times254(dot2(_mm256_setzero_si256(), u1, s1, u2, s2)), u1, t1, u2, t2);
  }
  static inline __m512i dot2_zmm(__m512i u1, __m512i s1, __m512i u2, __m512i s2) {
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, s1), u2, s2);
  }
  static inline __m512i dot2_x2_zmm(__m512i u1, __m512i s1, __m512i u2, __m512i s2, __m512i t1, __m512i t2) {
    const __m512i p = dot2_zmm(u1, s1, u2, s2);
    const __m512i p254 = _mm512_sub_epi32(_mm512_slli_epi32(p, 8), _mm512_slli_epi32(p, 1));
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p254, u1, t1), u2, t2);
  }
};
#define HQ_ZMM 1
#include "quant_dot_impl.h"
#undef HQ_ZMM
}  // namespace vnni
#pragma GCC pop_options

constexpr int kISA_AVX2 = 1, kISA_AVX512 = 2;
using hk::kBF16, hk::kF16, hk::kF32;

using hk_par::parallel;
using hk_par::parallel_dynamic;


// K a multiple of 32; the group a multiple of 32 dividing K, or (int8 weights) 16: GGUF Q6_K's sub-blocks, marked by
// sb_per_group = 0 in Problem.
static bool bad_group(int64_t K, int64_t group, int int4) {
  if (K % 32) return true;
  if (int4 == 4) return group != 16 || K % 256;  // 6-bit tiles
  if (int4 >= 2) return group != 32 || K % 64;   // int4 4-row tiles
  if (group == 16) return int4 != 0;
  return group % 32 || group <= 0 || K % group;
}

// x (row stride ldx, dtype) -> contiguous fp32 [M][K]; returns x itself when it already is.
static const float* pack_x(const void* x, int dtype, int64_t M, int64_t K, int64_t ldx, std::vector<float>& buf) {
  if (dtype == kF32 && (ldx == K || M == 1)) return static_cast<const float*>(x);
  buf.resize(M * K);
  for (int64_t m = 0; m < M; ++m) {
    float* d = buf.data() + m * K;
    if (dtype == kF32) {
      std::memcpy(d, static_cast<const float*>(x) + m * ldx, K * sizeof(float));
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(x) + m * ldx;
      for (int64_t k = 0; k < K; ++k) {
        if (dtype == kBF16) {
          d[k] = hk::bf16_to_f32(s[k]);
        } else {
          d[k] = f16_to_f32_baseline(s[k]);
        }
      }
    }
  }
  return buf.data();
}

// The Problem of a C entry point's arguments; int4: 0 int8, 1 int4, 2 / 3 int4 in 4-row tiles without / with mins
// (TileGeo: then scales and mins are inline and their pointers unused), 4 6-bit tiles (kQ6Rec; group 16).
static Problem make_problem(const float* x, const void* w, int64_t ldw, const void* scales, const void* mins,
                            int64_t ldg, int64_t group, const float* bias, float* out, int64_t M, int64_t N, int64_t K,
                            int int4, bool sf16) {
  const bool u4 = int4 >= 1 && int4 <= 3;
  Problem p{x, w, ldw, scales, int4 >= 2 ? nullptr : mins, ldg, group / 32, bias, out, M, N, K, u4, sf16};
  p.tiled = int4 == 2 || int4 == 3;
  p.tmins = int4 == 3;
  p.q6 = int4 == 4;
  return p;
}

}  // namespace hq

namespace hq {

// kQuantDotFloat: x in fp32 against weights dequantized in registers (quant_rows' other arguments).
static int linear_float(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int int4,
                        int64_t N, int64_t ldw, const void* scales, const void* mins, int64_t ldg, int64_t group,
                        const float* bias, float* out, int isa, int nthreads, int scale_f16) {
  if (isa != kISA_AVX2 && isa != kISA_AVX512) return -1;
  if (x_dtype < 0 || x_dtype > 2) return -2;
  if (bad_group(K, group, int4)) return -3;
  if (M <= 0 || N <= 0) return 0;
  std::vector<float> buf;
  const float* xp = pack_x(x, x_dtype, M, K, ldx, buf);
  if (int4 >= 2 && N % 4) return -5;
  const Problem p = make_problem(xp, w, ldw, scales, mins, ldg, group, bias, out, M, N, K, int4, scale_f16);
  const bool avx512 = isa == kISA_AVX512;
  const int64_t rows = avx512 ? avx512::rows_per_chunk(M) : avx2::rows_per_chunk(M);  // (a multiple of 4)
  parallel((N + rows - 1) / rows, nthreads, [&](int64_t c0, int64_t c1) {
    if (!tiles_of(p)) return avx512 ? avx512::run(p, c0, c1) : avx2::run(p, c0, c1);
    thread_local TileScratch scratch;  // tiles: each chunk's rows unpacked, then the plain kernel
    const TileGeo g(p);
    for (int64_t c = c0; c < c1; ++c) {
      const Problem v = scratch.view(p, g, c * rows / 4, std::min(N, (c + 1) * rows) / 4);
      avx512 ? avx512::run(v, 0, 1) : avx2::run(v, 0, 1);
    }
  });
  return 0;
}

}  // namespace hq

namespace hq {
static int linear_dot(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int int4, int64_t N,
                      int64_t ldw, const void* scales, const void* mins, int64_t ldg, int64_t group,
                      const float* bias, float* out, int isa, int nthreads, bool x2, bool sf16) {
  if (isa != kISA_AVX2 && isa != kISA_AVX512) return -1;
  if (x_dtype < 0 || x_dtype > 2) return -2;
  if (bad_group(K, group, int4)) return -3;
  if (M <= 0 || N <= 0) return 0;
  if (int4 >= 2 && N % 4) return -5;  // (tiles)
  const bool has_vnni = hk::cpu_has_vnni();
  const bool use_vnni = isa == kISA_AVX512 && has_vnni, use_bw = isa == kISA_AVX512 && !has_vnni;
  std::vector<float> buf;
  const float* xp = pack_x(x, x_dtype, M, K, ldx, buf);
  const int code = int4;
  int4 = int4 == 4 ? 0 : int4;  // 6-bit weights: int8 activations in natural order (as for int8 weights)
  const int64_t nb = K / 32, ld_d = int4 ? (nb / 2 + nb % 2) * 8 : nb, ld_xs = int4 ? K / group : 0;
  // x rows in chunks of MB: each chunk's int8 copy (MB x K bytes) stays in L2 while the weights stream past it.
  constexpr int64_t MB = 32;
  const int64_t mb_max = std::min(MB, M);
  std::vector<int8_t> q(mb_max * K), q2(x2 ? mb_max * K : 0);
  std::vector<float> d(mb_max * ld_d), xs(std::max<int64_t>(1, mb_max * ld_xs)), dn(int4 ? mb_max * nb + 8 : 0);
  const bool split16 = code == 0 && !use_vnni && !use_bw;  // AVX2's tile_i8_x16
  std::vector<int16_t> x16(code == 0 ? (split16 ? mb_max * K : K) : 0);
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t mb = std::min(MB, M - m0);
    for (int64_t m = 0; m < mb; ++m)
      avx2::quantize_x_row(xp + (m0 + m) * K, K, int4 != 0, group, q.data() + m * K, d.data() + m * ld_d,
                           int4 ? xs.data() + m * ld_xs : nullptr, x2 ? q2.data() + m * K : nullptr);
    const Problem p = make_problem(nullptr, w, ldw, scales, mins, ldg, group, bias, out + m0 * N, mb, N, K, code, sf16);
    // int4: dx per block in natural order as well (from the pair layout: dxA at 8j, dxB at 8j + 4), per row.
    if (int4)
      for (int64_t m = 0; m < mb; ++m)
        for (int64_t b = 0; b < nb; ++b) dn[m * nb + b] = d[m * ld_d + (b / 2) * 8 + (b % 2) * 4];
    // A one-row chunk, int8 weights, AVX-512: x as int16 for m1_i8_zmm (exact: |254 q + q2| <= 32385).
    const bool wide = M == 1 && code == 0 && group != 16 && (use_vnni || use_bw);
    if (wide)
      for (int64_t k = 0; k < K; ++k) x16[k] = int16_t(x2 ? 254 * q[k] + q2[k] : q[k]);
    if (split16)
      for (int64_t i = 0; i < mb * K; i += 32)
        for (int64_t j = 0; j < 32; ++j)
          x16[i + (j % 2) * 16 + j / 2] = int16_t(x2 ? 254 * q[i + j] + q2[i + j] : q[i + j]);
    const XQ xq{q.data(), d.data(), int4 ? xs.data() : nullptr, ld_d, ld_xs, x2 ? q2.data() : nullptr,
                int4 ? dn.data() : nullptr, wide || split16 ? x16.data() : nullptr};
    // Rows in units of 4 (the M = 1 tile): split evenly between threads, or for M = 1 in ~16 chunks per thread.
    auto rows = [&](int64_t c0, int64_t c1) {
      const int64_t n0 = c0 * 4, n1 = std::min(N, c1 * 4);
      if (use_vnni)
        vnni::run_dot(p, xq, n0, n1);
      else if (use_bw)
        avx512bw::run_dot(p, xq, n0, n1);
      else
        avx2::run_dot(p, xq, n0, n1);
    };
    const int64_t tiles = (N + 3) / 4;
    if (M == 1)
      parallel_dynamic(tiles, std::max<int64_t>(8, tiles / (16 * std::max(1, nthreads))), nthreads, rows);
    else
      parallel(tiles, nthreads, rows);
  }
  return 0;
}

// quant_rows' kQuantGemm / kQuantGemmBcast: the argument checks, x as fp32, then form(problem, nthreads) (AVX-512 only).
template <class Form>
static int gemm_call(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int int4, int64_t N,
                     int64_t ldw, const void* scales, const void* mins, int64_t ldg, int64_t group, const float* bias,
                     float* out, int isa, int nthreads, int scale_f16, Form form) {
  if (isa != kISA_AVX512 || int4 == 4 || group == 16) return -6;
  if (x_dtype < 0 || x_dtype > 2) return -2;
  if (bad_group(K, group, int4)) return -3;
  if (M <= 0 || N <= 0) return 0;
  if (int4 >= 2 && N % 4) return -5;
  std::vector<float> buf;
  const float* xp = pack_x(x, x_dtype, M, K, ldx, buf);
  form(make_problem(xp, w, ldw, scales, mins, ldg, group, bias, out, M, N, K, int4, scale_f16), nthreads);
  return 0;
}
}  // namespace hq


namespace hk_family {

// out[M][N] (fp32) = x[M][K] . deq(w)[N][K]^T + bias, by `kernel` (hk_api.h's QuantKernel; which one runs for a
// row count is hearth.weights.dispatch.plan's choice, never this library's):
//   kQuantDotFloat   x in fp32, weights dequantized in registers
//   kQuantDotInt8    x quantized to int8 blocks of 32 first (see the top of this file); kQuantDotInt8x2 in two terms
//   kQuantGemm       several rows on AVX-512 (quant_gemm_impl.h): each weight dequantized once per tile of up to 8
//                    rows; kQuantGemmBcast its broadcast form (gemm_bcast), for 32+ rows of a decode step. Both
//                    return -6 where they do not apply (AVX2, 6-bit tiles, int8 with 16-weight groups).
// w in weight format `format` (layouts.TABLE's code: 0 int8 rows, 1 int4 rows, 2 / 3 int4 tiles (with mins), 4 6-bit
// tiles) [N][ldw]; scales / mins [N][ldg], one per group of `group` weights (a multiple of 32 dividing K; K a
// multiple of 32): fp32, or fp16 when scale_f16 (GGUF Q8_0 / Q4_0 / Q4_1 keep their own fp16 scales).
// isa: 1 = AVX2+FMA+F16C, 2 = AVX-512F/BW. Returns 0 or a negative error (-7: an unknown kernel).
int quant_rows(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int format, int64_t N,
               int64_t ldw, const void* scales, const void* mins, int64_t ldg, int64_t group, const float* bias,
               float* out, int kernel, int isa, int nthreads, int scale_f16) {
  switch (kernel) {
    case kQuantDotFloat:
      return hq::linear_float(x, x_dtype, M, K, ldx, w, format, N, ldw, scales, mins, ldg, group, bias, out, isa,
                              nthreads, scale_f16);
    case kQuantDotInt8:
    case kQuantDotInt8x2:
      return hq::linear_dot(x, x_dtype, M, K, ldx, w, format, N, ldw, scales, mins, ldg, group, bias, out, isa,
                            nthreads, kernel == kQuantDotInt8x2, scale_f16 != 0);
    case kQuantGemm:
      return hq::gemm_call(x, x_dtype, M, K, ldx, w, format, N, ldw, scales, mins, ldg, group, bias, out, isa,
                           nthreads, scale_f16, hq::avx512::gemm);
    case kQuantGemmBcast:
      return hq::gemm_call(x, x_dtype, M, K, ldx, w, format, N, ldw, scales, mins, ldg, group, bias, out, isa,
                           nthreads, scale_f16, hq::avx512::gemm_bcast);
    default:
      return -7;
  }
}

}  // namespace hk_family

extern "C" {

// Rows [n0, n1) of the dequantized weight -> out [n1 - n0][K] fp32 (same weight arguments as quant_rows).
int hq_dequant(const void* w, int format, int64_t K, int64_t ldw, const void* scales, const void* mins, int64_t ldg,
               int64_t group, int64_t n0, int64_t n1, float* out, int isa, int nthreads, int scale_f16) {
  using namespace hq;
  if (isa != kISA_AVX2 && isa != kISA_AVX512) return -1;
  if (bad_group(K, group, format)) return -3;
  const Problem p = make_problem(nullptr, w, ldw, scales, mins, ldg, group, nullptr, nullptr, 0, n1, K, format,
                                 scale_f16);
  parallel(n1 - n0, nthreads, [&](int64_t b, int64_t e) {
    for (int64_t n = n0 + b; n < n0 + e;) {  // tiles: row by row of each unpacked tile
      thread_local TileScratch scratch;
      const bool tiles = tiles_of(p);
      const Problem v = tiles ? scratch.view(p, TileGeo(p), n / 4, n / 4 + 1) : p;
      const int64_t r0 = tiles ? n % 4 : n, r1 = tiles ? std::min<int64_t>(4, r0 + n0 + e - n) : n0 + e;
      if (isa == kISA_AVX512)
        avx512::dequant_rows(v, r0, r1, out + (n - n0) * K);
      else
        avx2::dequant_rows(v, r0, r1, out + (n - n0) * K);
      n += r1 - r0;
    }
  });
  return 0;
}

// Rows ids[0..n) of the dequantized [N][K] weight -> out [n][K] fp32: an embedding lookup in one call (no gathered
// copy of the rows first). Returns -4 if an id is outside [0, N). Parallel only for prefill-sized lookups.
int hq_dequant_gather(const void* w, int format, int64_t K, int64_t ldw, const void* scales, const void* mins,
                      int64_t ldg, int64_t group, int64_t N, const int64_t* ids, int64_t n, float* out, int isa,
                      int nthreads, int scale_f16) {
  using namespace hq;
  if (isa != kISA_AVX2 && isa != kISA_AVX512) return -1;
  if (bad_group(K, group, format)) return -3;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= N) return -4;
  if (format >= 2 && N % 4) return -5;
  const Problem p = make_problem(nullptr, w, ldw, scales, mins, ldg, group, nullptr, nullptr, 0, N, K, format,
                                 scale_f16);
  parallel(n, n * K >= (1 << 17) ? nthreads : 1, [&](int64_t b, int64_t e) {
    thread_local TileScratch scratch;
    for (int64_t i = b; i < e; ++i) {
      const bool tiles = tiles_of(p);
      const Problem v = tiles ? scratch.view(p, TileGeo(p), ids[i] / 4, ids[i] / 4 + 1) : p;
      const int64_t r = tiles ? ids[i] % 4 : ids[i];
      if (isa == kISA_AVX512)
        avx512::dequant_rows(v, r, r + 1, out + i * K);
      else
        avx2::dequant_rows(v, r, r + 1, out + i * K);
    }
  });
  return 0;
}

}  // extern "C"
