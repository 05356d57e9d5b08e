// hearth decode program: a stack of pre-norm Llama-style decoder layers in ONE C call for a decode step.
//
// Per layer: rmsnorm(x + residual) -> qkv -> rope -> KV-cache write -> paged attention -> o -> rmsnorm(x + residual)
// -> gate_up -> act(gate) * up -> down (and Qwen3's per-head q/k RMSNorm before rope; Gemma 2/3's sandwich norms of
// the attention and MLP outputs, and attention softcap), by the same C entry points (and the same rounding points) the Python layers
// call one at a time: each projection's fp32 result is rounded to the model dtype, q is widened to fp32 for the
// attention kernel and its output rounded back. So the result equals the layer-by-layer path bit for bit; what goes
// away is Python per layer (module calls, torch allocations, ctypes calls), which is most of a small model's
// decode step.
// Layouts are described once per model (HkLayerDesc, built by hearth/kernels/decoder.py) and per step (HkStepDesc).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "scalar.h"

#pragma GCC target("avx2,fma,f16c")

#include "hk_api.h"

namespace {

using hk::elem_size, hk::kBF16, hk::kF16, hk::kF32;
enum LinearKind { kFloat = 0, kQuantFloat = 1, kQuantInt8 = 2, kQuantInt8x2 = 3 };

// One projection: its weight's descriptor (hk_api.h hk_weight, the one every linear export reads: dense rows, bf16
// panels, quantized rows / tiles / VNNI panels), the activation rounding of a quantized weight and the bias.
struct HkLinearDesc {
  hk_weight w;
  int32_t kind;  // LinearKind
  int32_t pad;
  const float* bias;  // fp32 [N] or null
  // The kernel for a step of T rows: kernel_at[min(T, kPlanRows)] (a PlanKernel), hearth.weights.dispatch.plan's
  // choice written here when the program is built, so the program and the layer path run the same kernel.
  int8_t kernel_at[kPlanRows + 1];
};

struct HkLayerDesc {
  HkLinearDesc qkv, o, gate_up, down;
  const float* norm1;  // fp32 [hidden]
  const float* norm2;
  float norm_offset, eps;
  int64_t num_heads, num_kv_heads, head_dim, rot_dim;
  const float* cos;  // fp32 [rows][rot_dim / 2]
  const float* sin;
  void* k_cache;  // [num_slots][Hkv][D] in kv_dtype (0 f32 / 1 bf16 / 2 f16)
  void* v_cache;
  int32_t kv_dtype, act;  // act: 0 silu, 1 gelu-tanh
  int32_t attn_isa, pad;  // the attention kernel's ISA (AVX2 for head sizes AVX-512 lanes do not divide)
  int64_t num_slots, block_size, window;  // window 0 = none
  float scale;
  float qk_offset;  // per-head q/k RMSNorm (Qwen3): fp32 [head_dim] weights, or null for none
  const float* q_norm;
  const float* k_norm;
  float qk_eps;
  const float* post_norm1;  // Gemma 2/3 sandwich: RMSNorm of the attention output / of the MLP output, or null
  const float* post_norm2;
  float softcap;  // attention logit softcap (Gemma 2), 0 = none
};

struct HkStepDesc {
  int64_t T;  // tokens (the sequences' new tokens, in flat-batch order)
  const int64_t* positions;  // [T] rows of the cos/sin table
  const int64_t* slots;      // [T]
  const int32_t* block_tables;
  int64_t bt_stride;
  const int32_t* query_start;  // [num_seqs + 1]
  const int32_t* context_lens;  // [num_seqs]
  int64_t num_seqs;
  // Rows from this one on (a step's prompt tokens, after its generated ones) take single-term int8 activations on
  // int8x2 VNNI panels (quant.prompt_rows); T = none.
  int64_t int8_from;
};


// v holds at least n elements. Buffers only grow: resize() to a larger size after a smaller step would zero the new
// part each time (steps alternate between prompt chunks and decodes; ~1% of a prefill in memset).
template <class V>
void grow(V& v, int64_t n) {
  if ((int64_t)v.size() < n) v.resize(n);
}

// fp32 [n] -> dtype (torch's .to(dtype) rounding).
void narrow(const float* src, int dtype, int64_t n, void* dst) {
  if (dtype == kF32) {
    std::memcpy(dst, src, n * 4);
  } else if (dtype == kBF16) {
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = hk::f32_to_bf16(src[i]);
  } else {
    auto* d = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
    for (; i < n; ++i) d[i] = _cvtss_sh(src[i], 0);
  }
}

// dtype rows [T][D] at row stride ld (elements) -> fp32 [T][D] contiguous.
void widen_rows(const void* src, int dtype, int64_t T, int64_t D, int64_t ld, float* dst) {
  for (int64_t t = 0; t < T; ++t) {
    float* d = dst + t * D;
    if (dtype == kF32) {
      std::memcpy(d, static_cast<const float*>(src) + t * ld, D * 4);
      continue;
    }
    const uint16_t* s = static_cast<const uint16_t*>(src) + t * ld;
    for (int64_t i = 0; i < D; ++i) {
      if (dtype == kBF16) {
        d[i] = hk::bf16_to_f32(s[i]);
      } else {
        d[i] = hk::f16_to_f32(s[i]);
      }
    }
  }
}

// y (dtype) [T][N] = x (dtype) [T][K] . W^T (+ bias), through fp32 like the Python layer, by the kernel the
// descriptor names for T rows.
int project(const HkLinearDesc& l, const void* x, int64_t T, int dtype, std::vector<float>& f32, void* y, int isa,
            int threads, int64_t int8_from) {
  int rc;
  const int kernel = l.kernel_at[std::min<int64_t>(T, kPlanRows)];
  const int64_t K = l.w.K, N = l.w.N;
  if (kernel == kPlanDense || kernel == kPlanDensePanels) {
    if (l.w.format == kBF16DotPanels && dtype == kBF16)  // bf16 from the tiles (same rounding)
      return hk_linear(x, dtype, T, K, &l.w, l.bias, nullptr, static_cast<uint16_t*>(y), 0, isa, threads);
    grow(f32, T * N);
    rc = hk_linear(x, dtype, T, K, &l.w, l.bias, f32.data(), nullptr, 0, isa, threads);
  } else if (kernel == kPlanPanels) {  // VNNI panels: every row count
    grow(f32, T * N);
    // Rows [0, split) in the linear's rounding, the rest (prompt rows, int8x2 linears only) in single-term int8:
    // per-row sums do not depend on the other rows, so two calls give each row what it would get alone.
    const int64_t split = l.kind == kQuantInt8 ? 0 : std::min(T, std::max<int64_t>(int8_from, 0));
    // A bf16 model's rows are rounded in the tiles' last K block (the same rounding as narrow's), others land in f32.
    const char* xb = static_cast<const char*>(x);
    uint16_t* y16 = dtype == kBF16 ? static_cast<uint16_t*>(y) : nullptr;
    auto rows = [&](int64_t r0, int64_t r1, int qk) {
      return r1 <= r0 ? 0 : hk_linear(xb + r0 * K * elem_size(dtype), dtype, r1 - r0, K, &l.w, l.bias,
                                      f32.data() + r0 * N, y16 ? y16 + r0 * N : nullptr, qk, isa, threads);
    };
    if ((rc = rows(0, split, kQuantDotInt8x2)) || (rc = rows(split, T, kQuantDotInt8)) || y16) return rc;
  } else if (kernel == kPlanDot || kernel == kPlanGemm || kernel == kPlanBcast) {
    grow(f32, T * N);
    const int qk = kernel == kPlanGemm    ? kQuantGemm
                   : kernel == kPlanBcast ? kQuantGemmBcast
                   : l.kind == kQuantFloat ? kQuantDotFloat
                   : l.kind == kQuantInt8  ? kQuantDotInt8
                                           : kQuantDotInt8x2;
    rc = hk_linear(x, dtype, T, K, &l.w, l.bias, f32.data(), nullptr, qk, isa, threads);
  } else {
    return -100;  // a row count the builder did not plan for (DecodeProgram.build refuses such weights)
  }
  if (rc) return rc;
  narrow(f32.data(), dtype, T * N, y);
  return 0;
}

struct Buffers {
  std::vector<uint8_t> h, qkv, att, gu, act;
  std::vector<float> f32, q32, att32;
};

}  // namespace

extern "C" {

// Runs layers [0, n) on x [T][hidden] (dtype), in place: on return x is the last layer's MLP output and residual
// the running sum. has_residual = 0 for the first layer of the model (its input is the embedding: residual = x).
// final_norm (fp32 [hidden], or null): the model's final RMSNorm of x + residual, written to out (residual then
// holds the sum), while x is still in cache. Returns 0, or the failing kernel's code.
int hk_decoder_layers(const HkLayerDesc* layers, int64_t n, const HkStepDesc* st, void* x, void* residual,
                      int has_residual, int64_t hidden, int dtype, int isa, int threads, const float* final_norm,
                      float final_offset, float final_eps, void* out) {
  thread_local Buffers b;
  const int64_t T = st->T, es = elem_size(dtype);
  grow(b.h, T * hidden * es);
  for (int64_t li = 0; li < n; ++li) {
    const HkLayerDesc& L = layers[li];
    const int64_t H = L.num_heads, Hkv = L.num_kv_heads, D = L.head_dim;
    const int64_t nq = H * D, nkv = Hkv * D, nqkv = L.qkv.w.N;
    int rc;
    // attention block
    if (li == 0 && !has_residual) {
      std::memcpy(residual, x, T * hidden * es);
      rc = hk_rms_norm(x, hidden, nullptr, 0, L.norm1, L.norm_offset, L.eps, b.h.data(), nullptr, T, hidden, dtype,
                       threads);
    } else {
      rc = hk_rms_norm(x, hidden, residual, hidden, L.norm1, L.norm_offset, L.eps, b.h.data(), residual, T, hidden,
                       dtype, threads);
    }
    if (rc) return rc;
    grow(b.qkv, T * nqkv * es);
    if ((rc = project(L.qkv, b.h.data(), T, dtype, b.f32, b.qkv.data(), isa, threads, st->int8_from))) return rc;
    uint8_t* q = b.qkv.data();
    uint8_t* k = q + nq * es;
    uint8_t* v = k + nkv * es;
    for (int64_t t = 0; L.q_norm && t < T; ++t) {  // each head's D values of token t, normalized in place
      const int64_t o = t * nqkv * es;
      if ((rc = hk_rms_norm(q + o, D, nullptr, 0, L.q_norm, L.qk_offset, L.qk_eps, q + o, nullptr, H, D, dtype, 1)))
        return rc;
      if ((rc = hk_rms_norm(k + o, D, nullptr, 0, L.k_norm, L.qk_offset, L.qk_eps, k + o, nullptr, Hkv, D, dtype, 1)))
        return rc;
    }
    if ((rc = hk_rope_neox(q, nqkv, H, k, nqkv, Hkv, D, L.rot_dim, L.cos, L.sin, st->positions, T, dtype, threads)))
      return rc;
    if (L.kv_dtype != dtype) return -100;  // (the builder only takes caches in the model dtype)
    if ((rc = hk_kv_write(k, nqkv * es, v, nqkv * es, L.k_cache, L.v_cache, st->slots, T, nkv * es, L.num_slots)))
      return rc;
    grow(b.q32, T * nq);
    grow(b.att32, T * nq);
    widen_rows(q, dtype, T, nq, nqkv, b.q32.data());
    rc = hk_paged_attention(b.q32.data(), nq, L.k_cache, L.v_cache, L.kv_dtype, nullptr, nullptr,
                            L.block_size * nkv, nkv, st->block_tables, st->bt_stride, st->query_start,
                            st->context_lens, nullptr, st->num_seqs, b.att32.data(), nq, L.block_size, H, Hkv, D,
                            L.scale, L.softcap, L.window, nullptr, dtype == kBF16, L.attn_isa, threads);
    if (rc) return rc;
    grow(b.att, T * nq * es);
    narrow(b.att32.data(), dtype, T * nq, b.att.data());
    if ((rc = project(L.o, b.att.data(), T, dtype, b.f32, x, isa, threads, st->int8_from))) return rc;
    if (L.post_norm1 && (rc = hk_rms_norm(x, hidden, nullptr, 0, L.post_norm1, L.norm_offset, L.eps, x, nullptr, T,
                                          hidden, dtype, threads)))
      return rc;
    // MLP block
    if ((rc = hk_rms_norm(x, hidden, residual, hidden, L.norm2, L.norm_offset, L.eps, b.h.data(), residual, T,
                          hidden, dtype, threads)))
      return rc;
    const int64_t inter = L.gate_up.w.N / 2;
    grow(b.gu, T * L.gate_up.w.N * es);
    if ((rc = project(L.gate_up, b.h.data(), T, dtype, b.f32, b.gu.data(), isa, threads, st->int8_from))) return rc;
    grow(b.act, T * inter * es);
    if ((rc = hk_act_and_mul(b.gu.data(), L.gate_up.w.N, b.act.data(), T, inter, L.act, dtype, threads))) return rc;
    if ((rc = project(L.down, b.act.data(), T, dtype, b.f32, x, isa, threads, st->int8_from))) return rc;
    if (L.post_norm2 && (rc = hk_rms_norm(x, hidden, nullptr, 0, L.post_norm2, L.norm_offset, L.eps, x, nullptr, T,
                                          hidden, dtype, threads)))
      return rc;
  }
  if (final_norm)
    return hk_rms_norm(x, hidden, residual, hidden, final_norm, final_offset, final_eps, out, residual, T, hidden,
                       dtype, threads);
  return 0;
}

}  // extern "C"
