// Scalar bfloat16 <-> fp32 with torch's rounding (round to nearest even; a NaN stays a quiet NaN). Baseline ISA only.
#pragma once
#include <cstdint>
#include <cstring>

namespace hk {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Whether this CPU runs vdpbf16ps (AVX512-BF16 with AVX512BW), the only reader of the bf16 dot-product kernels.
inline bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  return has;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace hk
