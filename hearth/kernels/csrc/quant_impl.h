// ISA-generic body of the weight-only quantized decode GEMM (y[M,N] = x[M,K] . deq(w)[N,K]^T), included once per
// ISA by quant.cpp inside `namespace <isa> { struct T {...}; #include "quant_impl.h" }` under a matching
// `#pragma GCC target`. T provides: V (L floats), L, NV = 32 / L, zero/load/store/fma/set1/hsum and
//   deq_i8(const int8_t* p, V s, V out[NV])           32 int8 weights -> floats q * s
//   deq_u4(const uint8_t* p, V s, V mn, V out[NV])    16 bytes (32 nibbles) -> floats fma(q, s, mn)
//
// Weights are dequantized in registers to exactly the floats the reference dequantization produces (q * s for int8;
// fma(q, s, mn) for int4, which equals GGUF's d * q + m because d * q is exact in fp32), then multiplied with fp32 x
// and accumulated in fp32: the same math as a float model with dequantized weights, up to summation order.
// The unit along K is a sub-block of 32 weights (int8: 32 bytes; int4: 16 bytes, low nibbles = elements 0..15,
// high nibbles = 16..31, GGUF Q4_0's order); scales (and mins) are per group of G weights, G a multiple of 32 (or,
// int8 only, 16: sb_per_group == 0).
//
// Blocking as in linear_impl.h: a task is a chunk of NC = NR * 16 output rows; K is blocked so the chunk's weights
// stay in L2 while every MR-row tile of x sweeps it; partial sums stay unreduced in a per-thread scratch.

constexpr int L = T::L;
constexpr int NV = T::NV;

struct WI8 {
  using E = int8_t;
  static constexpr int64_t kSubBytes = 32;
  static inline void deq(const Problem& a, int64_t n, int64_t sb, typename T::V out[NV]) {
    const int8_t* p = static_cast<const int8_t*>(a.w) + n * a.ldw + sb * kSubBytes;
    if (a.sb_per_group == 0) {  // 16-weight groups: two scales per sub-block
      const int64_t i = n * a.ldg + 2 * sb;
      return T::deq_i8(p, T::set1(scale_at(a, i)), T::set1(scale_at(a, i + 1)), out);
    }
    const typename T::V s = T::set1(scale_at(a, n * a.ldg + sb / a.sb_per_group));
    T::deq_i8(p, s, s, out);
  }
};

struct WU4 {
  using E = uint8_t;
  static constexpr int64_t kSubBytes = 16;
  static inline void deq(const Problem& a, int64_t n, int64_t sb, typename T::V out[NV]) {
    const int64_t g = sb / a.sb_per_group;
    const float s = scale_at(a, n * a.ldg + g);
    T::deq_u4(static_cast<const uint8_t*>(a.w) + n * a.ldw + sb * kSubBytes, T::set1(s),
              T::set1(a.mins ? min_at(a, n * a.ldg + g) : -8.0f * s), out);
  }
};

// acc[m][r] += sum over sub-blocks [s0, s0 + cnt) of x[m, :] * deq(w)[n0 + r, :]; acc in scratch (m stride acc_ld).
template <class W, int MR, int NR>
static inline void micro(const Problem& a, const float* __restrict x, int64_t n0, int64_t s0, int64_t cnt,
                         float* __restrict acc_mem, int64_t acc_ld) {
  typename T::V acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = T::load(acc_mem + m * acc_ld + r * L);
  for (int64_t s = s0; s < s0 + cnt; ++s) {
    for (int r = 0; r < NR; ++r) {
      typename T::V w[NV];
      W::deq(a, n0 + r, s, w);
      for (int m = 0; m < MR; ++m)
        for (int v = 0; v < NV; ++v) acc[m][r] = T::fma(w[v], T::load(x + m * a.K + s * 32 + v * L), acc[m][r]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) T::store(acc_mem + m * acc_ld + r * L, acc[m][r]);
}

template <class W, int MR, int NR>
static inline void micro_nr(int nr, const Problem& a, const float* x, int64_t n0, int64_t s0, int64_t cnt, float* acc,
                            int64_t acc_ld) {
  if constexpr (NR >= 1) {
    if (nr == NR) return micro<W, MR, NR>(a, x, n0, s0, cnt, acc, acc_ld);
    micro_nr<W, MR, NR - 1>(nr, a, x, n0, s0, cnt, acc, acc_ld);
  }
}

template <class W, int MR, int NR>
static inline void micro_mr(int mr, int nr, const Problem& a, const float* x, int64_t n0, int64_t s0, int64_t cnt,
                            float* acc, int64_t acc_ld) {
  if constexpr (MR >= 1) {
    if (mr == MR) return micro_nr<W, MR, NR>(nr, a, x, n0, s0, cnt, acc, acc_ld);
    micro_mr<W, MR - 1, NR>(mr, nr, a, x, n0, s0, cnt, acc, acc_ld);
  }
}

// Output-row chunks [c0, c1) of the problem in `a`.
template <class W, int MR, int NR>
static void run_chunks(const Problem& a, int64_t c0, int64_t c1) {
  constexpr int64_t NC = NR * 16;
  const int64_t M = a.M, N = a.N, K = a.K;
  const int64_t ns = K / 32;  // sub-blocks per row
  int64_t kb;
  if (M <= MR) {
    kb = ns;  // one x tile: weights are used once, stream whole rows
  } else {
    // The chunk's weights (NC x kb sub-blocks) within ~192 KiB of L2, the x tile (MR x kb x 32 fp32) within 16 KiB.
    const int64_t limit = std::max<int64_t>(1, std::min<int64_t>((192 << 10) / (NC * W::kSubBytes),
                                                                 (16 << 10) / (MR * 32 * sizeof(float))));
    const int64_t nblocks = std::max<int64_t>(1, (ns + limit - 1) / limit);
    kb = std::max<int64_t>(1, (ns + nblocks - 1) / nblocks);
  }
  constexpr int64_t MB = 32;  // x rows per pass over a chunk: bounds the scratch (MB x NC x L floats)
  thread_local std::vector<float> scratch_buf;
  const int64_t scratch_size = std::min(MB, M) * NC * L;
  if ((int64_t)scratch_buf.size() < scratch_size) scratch_buf.resize(scratch_size);
  float* scratch = scratch_buf.data();
  const int64_t acc_ld = NC * L;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t n0 = c * NC;
    const int64_t nc = std::min(NC, N - n0);
    for (int64_t mb0 = 0; mb0 < M; mb0 += MB) {
      const int64_t mb = std::min(MB, M - mb0);
      std::fill(scratch, scratch + mb * acc_ld, 0.0f);
      for (int64_t s0 = 0; s0 < ns; s0 += kb) {
        const int64_t cnt = std::min(kb, ns - s0);
        for (int64_t m0 = 0; m0 < mb; m0 += MR) {
          const int mr = (int)std::min<int64_t>(MR, mb - m0);
          for (int64_t j = 0; j < nc; j += NR) {
            const int nr = (int)std::min<int64_t>(NR, nc - j);
            micro_mr<W, MR, NR>(mr, nr, a, a.x + (mb0 + m0) * K, n0 + j, s0, cnt, scratch + m0 * acc_ld + j * L,
                                acc_ld);
          }
        }
      }
      for (int64_t m = 0; m < mb; ++m)
        for (int64_t j = 0; j < nc; ++j) {
          float s = T::hsum(T::load(scratch + m * acc_ld + j * L));
          if (a.bias) s += a.bias[n0 + j];
          a.out[(mb0 + m) * ldo_of(a) + n0 + j] = s;
        }
    }
  }
}

template <class W>
static void run_w(const Problem& a, int64_t c0, int64_t c1) {
  if (a.M == 1)
    run_chunks<W, 1, T::kNR1>(a, c0, c1);
  else
    run_chunks<W, T::kMR, T::kNR>(a, c0, c1);
}

static int64_t rows_per_chunk(int64_t M) { return 16 * (M == 1 ? T::kNR1 : T::kNR); }

static void run(const Problem& a, int64_t c0, int64_t c1) {
  if (a.int4)
    run_w<WU4>(a, c0, c1);
  else
    run_w<WI8>(a, c0, c1);
}

// Rows [n0, n1) of deq(w) -> out [n1 - n0][K] fp32 (prefill: then a float GEMM).
static void dequant_rows(const Problem& a, int64_t n0, int64_t n1, float* out) {
  const int64_t ns = a.K / 32;
  for (int64_t n = n0; n < n1; ++n) {
    float* o = out + (n - n0) * a.K;
    for (int64_t s = 0; s < ns; ++s) {
      typename T::V w[NV];
      if (a.int4)
        WU4::deq(a, n, s, w);
      else
        WI8::deq(a, n, s, w);
      for (int v = 0; v < NV; ++v) T::store(o + s * 32 + v * L, w[v]);
    }
  }
}
