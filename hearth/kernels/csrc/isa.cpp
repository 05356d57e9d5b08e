// The widest ISA the library may use in this process: HEARTH_KERNELS_ISA=avx2 (hearth.kernels._build.load calls
// hk_limit_isa once) makes every run-time feature check in scalar.h answer as an AVX2-only CPU would, so no kernel
// picks an AVX-512 body behind the ISA code Python passes.
#include "scalar.h"

extern "C" {

// avx2_only: 1 hides AVX-512 (and VNNI, AVX512-BF16) from every kernel, 0 shows what the CPU has. Returns 1 if
// AVX-512 bodies may run after the call.
int hk_limit_isa(int avx2_only) {
  hk::g_avx2_only = avx2_only != 0;
  return hk::cpu_has_avx512bw() ? 1 : 0;
}

}  // extern "C"
