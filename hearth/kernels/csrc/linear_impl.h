// ISA-generic body of the decode GEMM (y[M,N] = x[M,K] . w[N,K]^T), included once per ISA by linear.cpp inside
// `namespace <isa> { struct T {...}; #include "linear_impl.h" }` under a matching `#pragma GCC target`.
// T provides: V (vector of L floats), L, zero/load/store/fma/hsum, and load_{bf16,f16,f32}(ptr, lo, hi), which
// turn one chunk of CH = 2*L weights into two float vectors.
//
// Layout trick for bf16: a chunk of 16 (AVX2) / 32 (AVX-512) bf16 weights is loaded as one integer vector;
// `<< 16` gives the even-indexed weights as fp32 and `& 0xFFFF0000` the odd-indexed ones. x is repacked per call
// (fp32, per chunk: even elements then odd elements) so the weights never need a repacked copy. f16/f32 weights
// load in natural order (x chunks not deinterleaved).
//
// Blocking: a task is a chunk of NC = NR * 16 output rows. For each block of K (kblock chunks) and each tile of MR
// rows of x, the NR-row microkernel sweeps the chunk: the x tile (MR x kblock floats) stays in L1 and the weight
// block (NC x kblock) in L2, so weights are read from memory once per call whatever M is. Partial sums stay
// unreduced (L floats per (m, n)) in a per-thread scratch and are reduced once at the end of the chunk.

struct WBF16 {
  using E = uint16_t;
  static constexpr bool kDeinterleave = true;
  static inline void load(const E* p, T::V& lo, T::V& hi) { T::load_bf16(p, lo, hi); }
  static inline float scalar(E e) {
    uint32_t u = uint32_t(e) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct WF16 {
  using E = uint16_t;
  static constexpr bool kDeinterleave = false;
  static inline void load(const E* p, T::V& lo, T::V& hi) { T::load_f16(p, lo, hi); }
  static inline float scalar(E e) { return _cvtsh_ss(e); }
};

struct WF32 {
  using E = float;
  static constexpr bool kDeinterleave = false;
  static inline void load(const E* p, T::V& lo, T::V& hi) { T::load_f32(p, lo, hi); }
  static inline float scalar(E e) { return e; }
};

constexpr int L = T::L;
constexpr int CH = 2 * L;

// acc[m][r] += sum over `chunks` chunks of x[m, :] * w[r, :]; acc lives in scratch (m stride acc_ld, r stride L).
template <class W, int MR, int NR>
static inline void micro(const float* __restrict x, int64_t ldx, const typename W::E* __restrict w, int64_t ldw,
                         int64_t chunks, float* __restrict acc_mem, int64_t acc_ld) {
  typename T::V acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = T::load(acc_mem + m * acc_ld + r * L);
  for (int64_t c = 0; c < chunks; ++c) {
    typename T::V xe[MR], xo[MR];  // this chunk of the MR x rows stays in registers for all NR weight rows
    for (int m = 0; m < MR; ++m) {
      xe[m] = T::load(x + m * ldx + c * CH);
      xo[m] = T::load(x + m * ldx + c * CH + L);
    }
    for (int r = 0; r < NR; ++r) {
      typename T::V lo, hi;
      W::load(w + r * ldw + c * CH, lo, hi);
      for (int m = 0; m < MR; ++m) {
        acc[m][r] = T::fma(lo, xe[m], acc[m][r]);
        acc[m][r] = T::fma(hi, xo[m], acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) T::store(acc_mem + m * acc_ld + r * L, acc[m][r]);
}

template <class W, int MR, int NR>
static inline void micro_nr(int nr, const float* x, int64_t ldx, const typename W::E* w, int64_t ldw, int64_t chunks,
                            float* acc, int64_t acc_ld) {
  if constexpr (NR >= 1) {
    if (nr == NR) return micro<W, MR, NR>(x, ldx, w, ldw, chunks, acc, acc_ld);
    micro_nr<W, MR, NR - 1>(nr, x, ldx, w, ldw, chunks, acc, acc_ld);
  }
}

template <class W, int MR, int NR>
static inline void micro_mr(int mr, int nr, const float* x, int64_t ldx, const typename W::E* w, int64_t ldw,
                            int64_t chunks, float* acc, int64_t acc_ld) {
  if constexpr (MR >= 1) {
    if (mr == MR) return micro_nr<W, MR, NR>(nr, x, ldx, w, ldw, chunks, acc, acc_ld);
    micro_mr<W, MR - 1, NR>(mr, nr, x, ldx, w, ldw, chunks, acc, acc_ld);
  }
}

// Output-row chunks [c0, c1) of the problem in `a`.
// Weight rows per parallel chunk. One x row: 2 tiles, so small N still splits evenly between threads (with 16
// tiles, Qwen2.5-0.5B's N = 896 / 1152 projections were 7 / 9 chunks: one thread did 4 / 5 while the other
// waited at the region's end). More x rows: 16 tiles, whose K blocks are reused across the x tile.
template <int MR, int NR>
constexpr int64_t chunk_rows() { return NR * (MR == 1 ? 2 : 16); }

template <class W, int MR, int NR>
static void run_chunks(const Problem& a, int64_t c0, int64_t c1) {
  constexpr int64_t NC = chunk_rows<MR, NR>();
  const int64_t M = a.M, N = a.N, K = a.K;
  const int64_t kc = K / CH;
  int64_t kb = a.kblock_chunks;
  if (kb <= 0 && M <= MR) {
    kb = std::max<int64_t>(kc, 1);  // a single x tile: weights are used once, stream whole rows
  } else if (kb <= 0) {
    // K block: the chunk's weights (NC x kb) within ~192 KiB of L2 and the x tile (MR x kb fp32) within 16 KiB
    // of L1; blocks of equal size.
    const int64_t limit = std::max<int64_t>(1, std::min<int64_t>((192 << 10) / (NC * sizeof(typename W::E)),
                                                                 (16 << 10) / (MR * sizeof(float))) / CH);
    const int64_t nblocks = std::max<int64_t>(1, (kc + limit - 1) / limit);
    kb = std::max<int64_t>(1, (kc + nblocks - 1) / nblocks);
  }
  const auto* w = static_cast<const typename W::E*>(a.w);
  constexpr int64_t MB = 32;  // x rows per pass over a chunk: bounds the scratch (MB x NC x L floats) to 64 KiB
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
      for (int64_t k0 = 0; k0 < kc; k0 += kb) {
        const int64_t cnt = std::min(kb, kc - k0);
        for (int64_t m0 = 0; m0 < mb; m0 += MR) {
          const int mr = (int)std::min<int64_t>(MR, mb - m0);
          for (int64_t j = 0; j < nc; j += NR) {
            const int nr = (int)std::min<int64_t>(NR, nc - j);
            micro_mr<W, MR, NR>(mr, nr, a.x + (mb0 + m0) * K + k0 * CH, K, w + (n0 + j) * a.ldw + k0 * CH, a.ldw,
                                cnt, scratch + m0 * acc_ld + j * L, acc_ld);
          }
        }
      }
      for (int64_t m = 0; m < mb; ++m) {
        const float* xm = a.x + (mb0 + m) * K;
        for (int64_t j = 0; j < nc; ++j) {
          float s = T::hsum(T::load(scratch + m * acc_ld + j * L));
          const typename W::E* wr = w + (n0 + j) * a.ldw;
          for (int64_t k = kc * CH; k < K; ++k) s += xm[k] * W::scalar(wr[k]);
          if (a.bias) s += a.bias[n0 + j];
          a.out[(mb0 + m) * N + n0 + j] = s;
        }
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

static int64_t rows_per_chunk(int64_t M) {
  return M == 1 ? chunk_rows<1, T::kNR1>() : chunk_rows<T::kMR, T::kNR>();
}

static void run(const Problem& a, int64_t c0, int64_t c1) {
  switch (a.wkind) {
    case WKind::kBF16: return run_w<WBF16>(a, c0, c1);
    case WKind::kF16: return run_w<WF16>(a, c0, c1);
    case WKind::kF32: return run_w<WF32>(a, c0, c1);
  }
}

// x (f32 / bf16 / f16, row stride ldx) -> fp32 [M][K]; full chunks deinterleaved (evens, then odds) if asked.
static void pack_x(const void* x, int dtype, int64_t M, int64_t K, int64_t ldx, bool deinterleave, float* dst) {
  const int64_t kc = K / CH;
  std::vector<float> row(K);
  for (int64_t m = 0; m < M; ++m) {
    float* r = row.data();
    if (dtype == kF32) {
      std::memcpy(r, static_cast<const float*>(x) + m * ldx, K * sizeof(float));
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(x) + m * ldx;
      for (int64_t k = 0; k < K; ++k) r[k] = dtype == kBF16 ? WBF16::scalar(s[k]) : WF16::scalar(s[k]);
    }
    float* d = dst + m * K;
    if (!deinterleave) {
      std::memcpy(d, r, K * sizeof(float));
      continue;
    }
    for (int64_t c = 0; c < kc; ++c)
      for (int i = 0; i < L; ++i) {
        d[c * CH + i] = r[c * CH + 2 * i];
        d[c * CH + L + i] = r[c * CH + 2 * i + 1];
      }
    for (int64_t k = kc * CH; k < K; ++k) d[k] = r[k];
  }
}

static double sum_blocks(const float* p, int64_t b, int64_t e) {
  typename T::V a0 = T::zero(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = b; i < e; ++i) {
    const float* q = p + i * 32;
    a0 = T::add(a0, T::load(q));
    a1 = T::add(a1, T::load(q + L));
    if (L == 8) {
      a2 = T::add(a2, T::load(q + 16));
      a3 = T::add(a3, T::load(q + 24));
    }
  }
  return (double)T::hsum(T::add(T::add(a0, a1), T::add(a2, a3)));
}
