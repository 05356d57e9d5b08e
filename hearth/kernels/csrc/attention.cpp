// hearth paged attention: causal / sliding-window / ALiBi attention of a flat batch of query tokens against a paged KV
// cache [num_blocks, block_size, num_kv_heads, head_dim] (fp32, bf16, f16 or int8 with per-token, per-head scales), read in place through each
// sequence's block table: no gather of the context. Decodes (one query token), chunked-prefill chunks and
// prefix-cache hits (queries after cached context) all take the same path. fp32 math, fp32 output.
// Same conventions as linear.cpp: no torch headers, C ABI for ctypes, per-ISA `#pragma GCC target` bodies chosen
// at run time by the caller, OpenMP on torch's libgomp with the caller's thread count.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "scalar.h"
#include "simd_avx2.h"
#include "simd_avx512.h"
#include "hk_api.h"

namespace {
using hk::kBF16, hk::kF16, hk::kF32, hk::kI8;  // the cache dtypes (kI8: int8 with per-token scales)

struct AttnParams {
  const float* q;  // [T][H][D] fp32, head stride D
  int64_t q_tok_stride;
  const void* k;  // cache base pointers, [num_blocks][block_size][Hkv][D]
  const void* v;
  int kv_dtype;
  const float* k_scale;  // int8 caches: [num_blocks][block_size][Hkv] per-token, per-head scales (else null)
  const float* v_scale;
  int64_t block_stride;   // elements between blocks (block_size * Hkv * D)
  int64_t kv_tok_stride;  // elements between tokens of a block (Hkv * D)
  const int32_t* block_tables;  // [S][bt_stride]
  int64_t bt_stride;
  const int32_t* query_start;   // [S + 1] flat-batch offsets of each sequence's query tokens
  const int32_t* context_lens;  // [S] tokens in cache after this step (the queries are its last ones)
  float* out;  // [T][H][D] fp32, head stride D
  int64_t out_tok_stride;
  int64_t block_size, num_heads, num_kv_heads, head_dim;
  float scale, softcap;  // softcap <= 0: none
  int64_t window;        // > 0: a query at position p sees keys in (p - window, p]
  const float* alibi;    // [H] ALiBi slopes (else null): score += slope * (key_pos - query_pos)
};

struct WorkItem {
  int64_t seq, kv_head, t0, nt;
  bool tiled;  // several query tokens: the tiled (GEMM-shaped) path of attention_tiled_impl.h
};
}  // namespace

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace hk_attn_avx2 {
struct T {
  using V = __m256;
  static constexpr int L = 8;
  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V set1(float x) { return _mm256_set1_ps(x); }
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static inline V add(V a, V b) { return _mm256_add_ps(a, b); }
  static inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline V max(V a, V b) { return _mm256_max_ps(a, b); }
  static constexpr int kRegs = 16;
  static constexpr int kDV = 2;  // head-dim vectors per P.V micro-tile (4 rows x 2 + 2 loads + 1 of 16 ymm)
  // bf16 pair dot products (vdpbf16ps): none here (kDot false: dot is never called).
  static constexpr bool kDot = false;
  using VI = __m256i;
  static inline VI set1_pair(uint32_t x) { return _mm256_set1_epi32(int(x)); }
  static inline VI load_pairs(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static inline void store_pairs(uint32_t* p, VI v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static inline V dot(V acc, VI, VI) { return acc; }
  static inline VI pair_rows(const uint16_t*, const uint16_t*) { return _mm256_setzero_si256(); }
  static inline VI pair_round(V, V) { return _mm256_setzero_si256(); }
  // s where a <= b, else -inf
  static inline V keep_if_le(V s, V a, V b) {
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, _mm256_cmp_ps(a, b, _CMP_LE_OQ));
  }
  static inline float hsum(V v) { return hk::hsum8(v); }
  static inline float hmax(V v) { return hk::hmax8(v); }
  // out[0..4) = horizontal sums of a, b, c, d.
  static inline void hsum4(V a, V b, V c, V d, float* out) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  static inline V load_bf16(const uint16_t* p) { return hk::load_bf16x8(p); }
  static inline V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static inline V load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline V exp(V x) { return hk::exp8(x); }  // (simd_avx2.h: the one exp)
};
#include "attention_impl.h"
#include "attention_tiled_impl.h"
}  // namespace hk_attn_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")
namespace hk_attn_avx512 {
struct T {
  using V = __m512;
  static constexpr int L = 16;
  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V set1(float x) { return _mm512_set1_ps(x); }
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static inline V add(V a, V b) { return _mm512_add_ps(a, b); }
  static inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V max(V a, V b) { return _mm512_max_ps(a, b); }
  static constexpr int kRegs = 32;
  static constexpr int kDV = 4;  // head-dim vectors per P.V micro-tile (4 rows x 4 of 32 zmm)
  // bf16 pair dot products: none in this body (kDot false: dot is never called); hk_attn_avx512bf16 has them.
  static constexpr bool kDot = false;
  using VI = __m512i;
  static inline VI set1_pair(uint32_t x) { return _mm512_set1_epi32(int(x)); }
  static inline VI load_pairs(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static inline void store_pairs(uint32_t* p, VI v) { _mm512_storeu_si512(p, v); }
  static inline V dot(V acc, VI, VI) { return acc; }
  // Lane i = (a[i], b[i]): 16 values of two bf16 rows as the pairs vdpbf16ps reads.
  static inline VI pair_rows(const uint16_t* a, const uint16_t* b) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return _mm512_permutex2var_epi16(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                                     idx,
                                     _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))));
  }
  // Lane i = (bf16(lo[i]), bf16(hi[i])), each rounded to nearest even.
  static inline VI pair_round(V lo, V hi) {
    return _mm512_or_si512(_mm512_srli_epi32(hk::bf16_high16(lo), 16), hk::bf16_high16(hi));
  }
  static inline V keep_if_le(V s, V a, V b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LE_OQ), _mm512_set1_ps(-INFINITY), s);
  }
  static inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static inline float hmax(V v) { return _mm512_reduce_max_ps(v); }
  static inline __m256 half_sum(V v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  static inline void hsum4(V a, V b, V c, V d, float* out) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(half_sum(a), half_sum(b)), _mm256_hadd_ps(half_sum(c), half_sum(d)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  static inline V load_bf16(const uint16_t* p) { return hk::load_bf16x16(p); }
  static inline V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static inline V load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static inline V exp(V x) { return hk::exp16(x); }
};
#include "attention_impl.h"
#include "attention_tiled_impl.h"
}  // namespace hk_attn_avx512
#pragma GCC pop_options

// The AVX-512 body again with AVX512-BF16: a prompt's tiles against a bf16 cache in vdpbf16ps (scores: q rounded to
// bf16, exact for a bf16 model's q, K pairs read from the cache as they lie; P.V: probabilities rounded to bf16
// pairs, V rows paired). Chosen at run time.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")
namespace hk_attn_avx512bf16 {
struct T : hk_attn_avx512::T {
  static constexpr bool kDot = true;
  static inline V dot(V acc, VI a, VI b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
};
#include "attention_impl.h"
#include "attention_tiled_impl.h"
}  // namespace hk_attn_avx512bf16
#pragma GCC pop_options

namespace {
constexpr int kAttnISA_AVX2 = 1, kAttnISA_AVX512 = 2;
// Query rows (tokens x GQA group) per work item: the accumulators (rows x head_dim floats) stay in L1/L2.
constexpr int64_t kMaxRows = 32;
// Items with at least this many query rows (and more than one token) take the tiled path.
constexpr int64_t kTiledMinRows = 8;

bool g_attn_bf16_dot = true;  // hk_attention_set_bf16_dot
bool bf16_dot_here() { return hk::cpu_has_bf16_dot() && g_attn_bf16_dot; }
}  // namespace

extern "C" {

// Whether prompt tiles against a bf16 cache use vdpbf16ps where the CPU has AVX512-BF16 (1, default) or fp32 FMAs
// on converted keys (0: HEARTH_BF16_DOT=0). Returns 1 if the dot form runs here after the call.
int hk_attention_set_bf16_dot(int on) {
  g_attn_bf16_dot = on != 0;
  return bf16_dot_here() ? 1 : 0;
}

// out[t][head][:] = softmax(scale * q[t][head] . K^T (softcapped, causal, windowed)) V for every query token t of
// the selected sequences (seq_ids[0..num_seqs), or 0..num_seqs-1 when seq_ids is null). Sequence s owns flat
// tokens [query_start[s], query_start[s+1]); they are the last of its context_lens[s] tokens, whose K/V already sit
// in the cache at block_tables[s][pos / block_size], offset pos % block_size. Rows of other sequences in `out` are
// left untouched. int8 caches (kv_dtype 3) hold round(x / scale) with one fp32 scale per (slot, kv head) in
// k_scale / v_scale. alibi_slopes (null: none): [num_heads] fp32, adds slope[head] * (key_pos - query_pos) to every
// score after the scale and softcap. q_bf16: q's values are bf16 (a bf16 model's), so prompt tiles against a bf16
// cache may take the vdpbf16ps form, which rounds q to bf16. Returns 0, or a negative error code for bad arguments.
int hk_paged_attention(const float* q, int64_t q_tok_stride, const void* k_cache, const void* v_cache,
                       int kv_dtype, const float* k_scale, const float* v_scale, int64_t block_stride, int64_t kv_tok_stride, const int32_t* block_tables,
                       int64_t bt_stride, const int32_t* query_start, const int32_t* context_lens,
                       const int32_t* seq_ids, int64_t num_seqs, float* out, int64_t out_tok_stride,
                       int64_t block_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale,
                       float softcap, int64_t window, const float* alibi_slopes, int q_bf16, int isa,
                       int nthreads) {
  if (isa != kAttnISA_AVX2 && isa != kAttnISA_AVX512) return -1;
  if (kv_dtype < 0 || kv_dtype > 3) return -2;
  if (kv_dtype == kI8 && (!k_scale || !v_scale)) return -5;
  const int64_t lanes = isa == kAttnISA_AVX512 ? 16 : 8;
  if (head_dim <= 0 || head_dim % lanes) return -3;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads || block_size <= 0) return -4;
  const AttnParams p{q, q_tok_stride, k_cache, v_cache, kv_dtype, k_scale, v_scale, block_stride, kv_tok_stride, block_tables,
                     bt_stride, query_start, context_lens, out, out_tok_stride, block_size, num_heads,
                     num_kv_heads, head_dim, scale, softcap, window, alibi_slopes};
  const int64_t G = num_heads / num_kv_heads;
  const int64_t qt_row = std::max<int64_t>(1, kMaxRows / G);  // query tokens per work item
  const int64_t tiled_rows = isa == kAttnISA_AVX512 ? hk_attn_avx512::kTiledRows : hk_attn_avx2::kTiledRows;
  const int64_t qt_tiled = std::max<int64_t>(1, tiled_rows / G);
  std::vector<WorkItem> items;
  items.reserve(num_seqs * num_kv_heads);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t s = seq_ids ? seq_ids[i] : i;
    const int64_t ql = query_start[s + 1] - query_start[s];
    if (ql <= 0 || context_lens[s] < ql) continue;
    const int64_t qt = ql > 1 && std::min(ql, qt_tiled) * G >= kTiledMinRows ? qt_tiled : qt_row;
    // Tiles from the last (longest context) first, so the dynamic schedule ends on cheap items. One token (a
    // decode, or a prompt's last lone token) takes the row path, which reads each K/V row once with no conversion.
    for (int64_t t0 = ((ql - 1) / qt) * qt; t0 >= 0; t0 -= qt) {
      const int64_t nt = std::min(qt, ql - t0);
      const bool tiled = nt > 1 && nt * G >= kTiledMinRows && nt * G <= tiled_rows;
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, t0, nt, tiled});
    }
  }
  const int64_t n = (int64_t)items.size();
  if (n == 0) return 0;
  const int64_t rows = std::max(qt_row, qt_tiled) * G;
  const int64_t sf =
      isa == kAttnISA_AVX512
          ? std::max(hk_attn_avx512::scratch_floats(rows, head_dim, block_size),
                     hk_attn_avx512::tiled_scratch_floats(rows, head_dim))
          : std::max(hk_attn_avx2::scratch_floats(rows, head_dim, block_size),
                     hk_attn_avx2::tiled_scratch_floats(rows, head_dim));
  const int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, n));
  // bf16 cache: prompt tiles in vdpbf16ps where the CPU has it (scores and P.V; the row path is the same code).
  // (head_dim <= 512: an odd chunk's last V row pairs with a static zero row of that length)
  const bool dot = q_bf16 && isa == kAttnISA_AVX512 && kv_dtype == kBF16 && head_dim <= 512 && bf16_dot_here();
  auto body = [&](float* scratch, int64_t i) {
    const WorkItem& w = items[i];
    if (dot)
      w.tiled ? hk_attn_avx512bf16::run_item_tiled(p, w, scratch) : hk_attn_avx512::run_item(p, w, scratch);
    else if (isa == kAttnISA_AVX512)
      w.tiled ? hk_attn_avx512::run_item_tiled(p, w, scratch) : hk_attn_avx512::run_item(p, w, scratch);
    else
      w.tiled ? hk_attn_avx2::run_item_tiled(p, w, scratch) : hk_attn_avx2::run_item(p, w, scratch);
  };
  if (nt == 1) {
    std::vector<float> scratch(sf);
    for (int64_t i = 0; i < n; ++i) body(scratch.data(), i);
    return 0;
  }
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> scratch(sf);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) body(scratch.data(), i);
  }
  return 0;
}

}  // extern "C"
