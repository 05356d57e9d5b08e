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

// hk_linear's kernel argument (hearth/kernels/weight.py KERNELS): how x meets a quantized weight in rows or tiles.
enum QuantKernel { kQuantDotFloat = 0, kQuantDotInt8 = 1, kQuantDotInt8x2 = 2, kQuantGemm = 3, kQuantGemmBcast = 4 };

// The kernel of a projection in the decode program, per row count (HkLinearDesc::kernel_at): hearth.weights.dispatch
// .plan's Kernel names, as hearth/kernels/decoder.py PLAN_KERNELS numbers them. 0: a row count the program never
// runs for that weight.
enum PlanKernel { kPlanNone = 0, kPlanDot = 1, kPlanGemm = 2, kPlanBcast = 3, kPlanPanels = 4, kPlanDense = 5,
                  kPlanDensePanels = 6 };
constexpr int kPlanRows = 64;  // rows the table covers; more rows (prompt steps) take its last entry

// A packed weight as every linear kernel reads it: one descriptor per weight, built once when the weight is prepared
// (hearth/kernels/weight.py HkWeight, the same fields) and passed by pointer, instead of 6-10 loose arguments.
constexpr int kCodebook4 = 7;  // quantized: 4-bit codebook indices (bitsandbytes NF4 / FP4, nf4.cpp)
constexpr int kWeightMaxParts = 8;
struct hk_weight {
  const void* data;   // rows / tiles / panels (dense in parts: part_w[0])
  int32_t format;     // layouts.TABLE's code: a QWeight format (quantized), else a dense dtype / bf16 panel code
  int32_t quantized;  // layouts.TABLE's `quantized` column: which of the two code spaces `format` is in
  int64_t N, K;
  int64_t ldw;        // data's row stride: elements (dense rows), bytes (quantized rows and tiles)
  const void* scales; // quantized: [N][ldg] fp32, or fp16 when scale_f16 (panels: per panel); codebook: fp32 absmax
  const void* mins;   // int4 with mins, like scales; else null
  int64_t ldg, group;  // scales' row stride; weights per scale along K
  int32_t scale_f16;
  int32_t nparts;      // dense: the weight's row blocks (q/k/v as loaded), part_w[p] [part_n[p]][ldw]; else 1
  const float* codebook;  // codebook layout: its 16 fp32 values; else null
  int64_t kblock;      // dense rows: K block in elements, 0 = auto (fit L1/L2)
  const void* part_w[kWeightMaxParts];
  int64_t part_n[kWeightMaxParts];
};

// The per-family bodies hk_linear switches over (C++ linkage: not part of the ctypes API).
namespace hk_family {
int dense_rows(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts, const void* const* w,
               const int64_t* n, int w_dtype, int64_t ldw, const float* bias, float* out, int isa, int64_t kblock,
               int nthreads);
int dense_dot_panels_bf16(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, int64_t nparts,
                          const void* const* w, const int64_t* n, const float* bias, uint16_t* out, int nthreads);
int quant_rows(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int format, int64_t N,
               int64_t ldw, const void* scales, const void* mins, int64_t ldg, int64_t group, const float* bias,
               float* out, int kernel, int isa, int nthreads, int scale_f16);
int quant_panels(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const void* w, int code, int64_t N,
                 const void* scales, const void* mins, int64_t group, const float* bias, float* partial,
                 uint16_t* out16, int nthreads, int scale_f16, int x2);
int codebook(const void* x, int x_dtype, int64_t M, int64_t K, int64_t ldx, const uint8_t* w, int64_t N, int64_t ldw,
             const float* absmax, int64_t ldg, int64_t group, const float* codebook, const float* bias, float* out,
             int isa, int nthreads);
}  // namespace hk_family

extern "C" {
// out [M][N] fp32 = x [M][w->K] (row stride ldx, dtype x_dtype) . W^T + bias, for every weight family (linear_weight
// .cpp). kernel: a QuantKernel for quantized rows / tiles (VNNI panels: kQuantDotInt8x2 for two int8 terms, else
// one; dense and codebook weights ignore it). out16: bf16 [M][N] straight from the tiles (VNNI panels and bf16 dot
// panels only; out is then their fp32 scratch), else null.
int hk_linear(const void* x, int x_dtype, int64_t M, int64_t ldx, const hk_weight* w, const float* bias, float* out,
              uint16_t* out16, int kernel, int isa, int nthreads);
int hq_pack_panels(const void* w, int bits, int64_t N, int64_t K, int64_t ldw, uint8_t* dst, int nthreads);
int hq_pack_panels_blocks(const void* w, int bits, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes,
                          int64_t header, uint8_t* dst, int nthreads);
int hq_pack_panel_scales_blocks(const void* w, int64_t N, int64_t K, int64_t ldw, int64_t block_bytes,
                                int64_t offset, uint16_t* dst, int nthreads);
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
