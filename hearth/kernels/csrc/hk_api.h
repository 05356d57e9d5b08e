// The C entry points one kernel file calls in another (decoder.cpp's program calls them all). Each defining file
// includes this header too, so a signature that drifts from its callers is a compile error, not a call with
// shifted arguments.
#pragma once
#include <cstdint>

// Weight-format codes (hearth/weights/layouts.py's `code` column) that more than one file reads.
// Dense weights (hk_linear's w_dtype): hk::DType's kF32 / kBF16 / kF16 as rows, then bf16 panels (panel.cpp) and
// bf16 pair panels (panel_dot.cpp).
constexpr int kBF16Panels = 3, kBF16DotPanels = 4;
// Quantized weights past the plain / tiled ones: VNNI panels (quant_panel.cpp).
constexpr int kPanelsInt8 = 5, kPanelsInt4 = 6;

// hq_linear's kernel argument (hearth/kernels/quant.py LINEAR_KERNELS): how x meets a quantized weight in rows or tiles.
enum QuantKernel { kQuantDotFloat = 0, kQuantDotInt8 = 1, kQuantDotInt8x2 = 2, kQuantGemm = 3, kQuantGemmBcast = 4 };

// The kernel of a projection in the decode program, per row count (HkLinearDesc::kernel_at): hearth.weights.dispatch
// .plan's Kernel names, as hearth/kernels/decoder.py PLAN_KERNELS numbers them. 0: a row count the program never
// runs for that weight.
enum PlanKernel { kPlanNone = 0, kPlanDot = 1, kPlanGemm = 2, kPlanBcast = 3, kPlanPanels = 4, kPlanDense = 5,
                  kPlanDensePanels = 6 };
constexpr int kPlanRows = 64;  // rows the table covers; more rows (prompt steps) take its last entry

extern "C" {
int hk_linear(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int w_dtype, int64_t N,
              int64_t ldw, const float* bias, float* out, int isa, int64_t kblock, int nthreads);
int hk_linear_parts(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                    const void* const* w, const int64_t* n, int w_dtype, int64_t ldw, const float* bias, float* out,
                    int isa, int64_t kblock, int nthreads);
int hk_linear_dot_panels_bf16(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                              const void* const* w, const int64_t* n, const float* bias, uint16_t* out, int nthreads);
int hq_linear(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int format, int64_t N,
              int64_t ldw, const void* scales, const void* mins, int64_t ldg, int64_t group, const float* bias,
              float* out, int kernel, int isa, int nthreads, int scale_f16);
int hq_linear_panels_out(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int code,
                         int64_t N, const void* scales, const void* mins, int64_t group, const float* bias,
                         float* partial, uint16_t* out16, int nthreads, int scale_f16, int x2);
int hq_pack_panels(const void* w, int bits, int64_t N, int64_t K, int64_t ldw, uint8_t* dst, int nthreads);
int hq_pack_panels_blocks(const void* w, int bits, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes,
                          int64_t header, uint8_t* dst, int nthreads);
int hk_rms_norm(const void* x, int64_t ldx, const void* residual, int64_t ldr, const float* weight, float offset,
                float eps, void* out, void* sum_out, int64_t T, int64_t H, int dtype, int threads);
int hk_rope_neox(void* q, int64_t ldq, int64_t Hq, void* k, int64_t ldk, int64_t Hk, int64_t head_dim, int64_t rot,
                 const float* cos, const float* sin, const int64_t* rows, int64_t T, int dtype, int threads);
int hk_kv_write(const void* k, int64_t ldk, const void* v, int64_t ldv, void* k_cache, void* v_cache,
                const int64_t* slots, int64_t T, int64_t row_bytes, int64_t num_slots);
int hk_act_and_mul(const void* x, int64_t ldx, void* out, int64_t T, int64_t d, int act, int dtype, int threads);
int hk_paged_attention(const float* q, int64_t q_tok_stride, const void* k_cache, const void* v_cache, int kv_dtype,
                       const float* k_scale, const float* v_scale, int64_t block_stride, int64_t kv_tok_stride,
                       const int32_t* block_tables, int64_t bt_stride, const int32_t* query_start,
                       const int32_t* context_lens, const int32_t* seq_ids, int64_t num_seqs, float* out,
                       int64_t out_tok_stride, int64_t block_size, int64_t num_heads, int64_t num_kv_heads,
                       int64_t head_dim, float scale, float softcap, int64_t window, const float* alibi_slopes,
                       int q_bf16, int isa, int nthreads);
}
