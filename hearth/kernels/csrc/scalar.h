// What every kernel file shares at the baseline ISA: the element-type codes of the C ABI, scalar bf16 / f16 <-> fp32
// with torch's rounding, and the CPU feature checks the run-time dispatch asks. The vector forms are in
// simd_avx2.h and simd_avx512.h.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace hk {

// Element type of an activation, a cache or a dense weight, as hearth.kernels passes it (torch dtype -> code).
// kI8: the int8 KV cache only (with per-token scales).
enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2, kI8 = 3 };

inline int64_t elem_size(int dtype) { return dtype == kF32 ? 4 : dtype == kI8 ? 1 : 2; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; a NaN stays a quiet NaN (torch's rounding).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// F16C: every caller runs under an AVX2 target or more, which always comes with it here.
__attribute__((target("f16c"))) inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) inline uint16_t f32_to_f16(float f) { return _cvtss_sh(f, 0); }  // nearest even

// The same without F16C, for code built at the baseline ISA (quant.cpp's generic scale reads; not hot).
inline float f16_to_f32_baseline(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t u;
  if (exp == 0x1F) {
    u = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {
    float f = float(man) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Set by hk_limit_isa (isa.cpp) when HEARTH_KERNELS_ISA=avx2: every AVX-512 check below then answers no, so the
// whole library behaves as on an AVX2-only CPU (one flag for the process; hearth.platform.cpu_info hides the same
// features from Python).
inline bool g_avx2_only = false;

// Whether this CPU runs vdpbf16ps (AVX512-BF16 with AVX512BW), the only reader of the bf16 dot-product kernels.
inline bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has && !g_avx2_only;
}

// AVX-512 VNNI (with BW and VL): vpdpbusd, the integer dot of the quantized kernels.
inline bool cpu_has_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has && !g_avx2_only;
}

// AVX-512 F/BW/DQ/VL: the 16-lane bodies of the element-wise kernels.
inline bool cpu_has_avx512bw() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return has && !g_avx2_only;
}

}  // namespace hk
