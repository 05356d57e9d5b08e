// hk_linear: the one linear export. It reads the weight's descriptor (hk_api.h hk_weight) and switches on its
// format to the family's body (linear.cpp, panel_dot.cpp, quant.cpp, quant_panel.cpp, nf4.cpp); which kernel runs
// for a row count stays hearth.weights.dispatch.plan's choice, passed in `kernel`.
#include <cstdint>

#include "hk_api.h"

extern "C" {

int hk_linear(const void* x, int x_dtype, int64_t M, int64_t ldx, const hk_weight* w, const float* bias, float* out,
              uint16_t* out16, int kernel, int isa, int nthreads) {
  if (w == nullptr) return -20;
  const int64_t K = w->K;
  if (!w->quantized) {
    if (w->nparts < 1 || w->nparts > kWeightMaxParts) return -3;
    if (out16 != nullptr) {
      if (w->format != kBF16DotPanels) return -21;
      return hk_family::dense_dot_panels_bf16(x, x_dtype, M, K, ldx, w->nparts, w->part_w, w->part_n, bias, out16,
                                              nthreads);
    }
    return hk_family::dense_rows(x, x_dtype, M, K, ldx, w->nparts, w->part_w, w->part_n, w->format, w->ldw, bias,
                                 out, isa, w->kblock, nthreads);
  }
  switch (w->format) {
    case kPanelsInt8:
    case kPanelsInt4:
      return hk_family::quant_panels(x, x_dtype, M, K, ldx, w->data, w->format, w->N, w->scales, w->mins, w->group,
                                     bias, out, out16, nthreads, w->scale_f16, kernel == kQuantDotInt8x2);
    case kCodebook4:
      if (out16 != nullptr) return -21;
      return hk_family::codebook(x, x_dtype, M, K, ldx, static_cast<const uint8_t*>(w->data), w->N, w->ldw,
                                 static_cast<const float*>(w->scales), w->ldg, w->group, w->codebook, bias, out,
                                 isa, nthreads);
    default:
      if (out16 != nullptr) return -21;
      return hk_family::quant_rows(x, x_dtype, M, K, ldx, w->data, w->format, w->N, w->ldw, w->scales, w->mins,
                                   w->ldg, w->group, bias, out, kernel, isa, nthreads, w->scale_f16);
  }
}

}  // extern "C"
