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
// bf16 dot products (AVX512-BF16, namespace hk_avx512bf16 only; x and weights both bf16): vdpbf16ps multiplies a
// chunk of 32 bf16 x values by 32 bf16 weights into 16 fp32 lanes in one instruction (products exact, as the FMAs'),
// so the weights need no widening and a chunk costs one instruction instead of two FMAs and two shifts. For this
// kind x is packed in bf16: each chunk's 32 x values (natural order) fill the first 64 bytes of the chunk's 32-float
// slot of the fp32 buffer, so T::load of the slot yields them; the K tail stays fp32.
//
// Blocking: a task is a chunk of NC = NR * 16 output rows. For each block of K (kblock chunks) and each tile of MR
// rows of x, the NR-row microkernel sweeps the chunk: the x tile (MR x kblock floats) stays in L1 and the weight
// block (NC x kblock) in L2, so weights are read from memory once per call whatever M is. Partial sums stay
// unreduced (L floats per (m, n)) in a per-thread scratch and are reduced once at the end of the chunk.

struct WBF16 {
  using E = uint16_t;
  static constexpr bool kDeinterleave = true, kDot = false;
  static inline void load(const E* p, T::V& lo, T::V& hi) { T::load_bf16(p, lo, hi); }
  static inline float scalar(E e) { return hk::bf16_to_f32(e); }
};

struct WF16 {
  using E = uint16_t;
  static constexpr bool kDeinterleave = false, kDot = false;
  static inline void load(const E* p, T::V& lo, T::V& hi) { T::load_f16(p, lo, hi); }
  static inline float scalar(E e) { return hk::f16_to_f32(e); }
};

struct WF32 {
  using E = float;
  static constexpr bool kDeinterleave = false, kDot = false;
  static inline void load(const E* p, T::V& lo, T::V& hi) { T::load_f32(p, lo, hi); }
  static inline float scalar(E e) { return e; }
};

#ifdef HK_LINEAR_BF16_DOT
struct WBF16Dot {  // bf16 weights against bf16 x in vdpbf16ps (see the header comment)
  using E = uint16_t;
  static constexpr bool kDeinterleave = false, kDot = true;
  // the 32 weights at p as T::V bits; acc + the chunk's x (32 bf16, as T::V bits) . those weights
  static inline typename T::V raw(const E* p) { return T::load(reinterpret_cast<const float*>(p)); }
  static inline typename T::V dot_raw(typename T::V acc, typename T::V x, typename T::V w) { return T::dot_bf16(acc, x, w); }
  static inline float scalar(E e) { return hk::bf16_to_f32(e); }
};
#endif

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
    if constexpr (W::kDot) {
      typename T::V xb[MR];  // this chunk of the MR x rows (32 bf16 each) stays in registers for all NR rows
      for (int m = 0; m < MR; ++m) xb[m] = T::load(x + m * ldx + c * CH);
      for (int r = 0; r < NR; ++r) {
        const typename T::V wv = W::raw(w + r * ldw + c * CH);
        for (int m = 0; m < MR; ++m) acc[m][r] = W::dot_raw(acc[m][r], xb[m], wv);
      }
    } else {
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

// Software prefetch into L2 of the weight tile the microkernels will read next, a slice after each microkernel
// call. Read by the microkernel alone, a tile's NR adjacent short rows in lockstep are scattered offsets in the same
// pages, which the hardware prefetcher follows poorly (see run_rows); prefetching them ahead keeps the tiles fed.
// (M <= kRowStreamMaxM no longer comes here: run_rows.)
struct TilePrefetch {
  const char* p = nullptr;  // the current row's next line
  const char* row_end = nullptr;
  int64_t rows_left = 0, ld = 0, width = 0, step = 0;
  // rows x width bytes (row stride ld), spread over `calls` calls of run().
  void start(const char* first_row, int64_t rows, int64_t ld_bytes, int64_t width_bytes, int64_t calls) {
    p = first_row, row_end = first_row + width_bytes, rows_left = rows, ld = ld_bytes, width = width_bytes;
    step = (rows * ((width_bytes + 63) / 64) + calls - 1) / std::max<int64_t>(calls, 1);
  }
  void run() {
    for (int64_t i = 0; i < step && rows_left > 0; ++i) {
      _mm_prefetch(p, _MM_HINT_T1);
      p += 64;
      if (p >= row_end) {
        p = row_end - width + ld, row_end += ld;
        --rows_left;
      }
    }
  }
};

// Weight-row tiles per parallel chunk (more than one x row): the chunk's K blocks are reused across the x tiles.
constexpr int64_t kChunkTiles = 16;

// Output-row chunks [c0, c1) of the problem in `a`.
template <class W, int MR, int NR>
static void run_chunks(const Problem& a, int64_t c0, int64_t c1) {
  constexpr int64_t NC = NR * kChunkTiles;
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
  TilePrefetch pf;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t n0 = c * NC;
    const int64_t nc = std::min(NC, N - n0);
    for (int64_t mb0 = 0; mb0 < M; mb0 += MB) {
      const int64_t mb = std::min(MB, M - mb0);
      std::fill(scratch, scratch + mb * acc_ld, 0.0f);
      for (int64_t k0 = 0; k0 < kc; k0 += kb) {
        const int64_t cnt = std::min(kb, kc - k0);
        {  // the next tile: the next K block of these rows, else the next chunk's first K block
          const bool same = k0 + kb < kc;
          const int64_t pk = same ? k0 + kb : 0, pn0 = same ? n0 : n0 + NC;
          const int64_t rows = same ? nc : std::max<int64_t>(0, std::min(NC, N - pn0));
          const int64_t esz = sizeof(typename W::E);
          pf.start(reinterpret_cast<const char*>(w + pn0 * a.ldw + pk * CH), rows, a.ldw * esz,
                   std::min(kb, kc - pk) * CH * esz, ((mb + MR - 1) / MR) * ((nc + NR - 1) / NR));
        }
        for (int64_t m0 = 0; m0 < mb; m0 += MR) {
          const int mr = (int)std::min<int64_t>(MR, mb - m0);
          for (int64_t j = 0; j < nc; j += NR) {
            const int nr = (int)std::min<int64_t>(NR, nc - j);
            micro_mr<W, MR, NR>(mr, nr, a.x + (mb0 + m0) * K + k0 * CH, K, w + (n0 + j) * a.ldw + k0 * CH, a.ldw,
                                cnt, scratch + m0 * acc_ld + j * L, acc_ld);
            pf.run();
          }
        }
      }
      for (int64_t m = 0; m < mb; ++m) {
        const float* xm = a.x + (mb0 + m) * K;
        int64_t j = 0;
        if (kc * CH == K)  // no K tail: L outputs at a time by a transpose-add of their partial sums
          for (; j + L <= nc; j += L) {
            alignas(64) float s[L];
            T::store(s, T::reduce_rows(scratch + m * acc_ld + j * L));
            for (int i = 0; i < L; ++i)
              a.out[(mb0 + m) * a.ldo + n0 + j + i] = a.bias ? s[i] + a.bias[n0 + j + i] : s[i];
          }
        for (; j < nc; ++j) {
          float s = T::hsum(T::load(scratch + m * acc_ld + j * L));
          const typename W::E* wr = w + (n0 + j) * a.ldw;
          for (int64_t k = kc * CH; k < K; ++k) s += xm[k] * W::scalar(wr[k]);
          if (a.bias) s += a.bias[n0 + j];
          a.out[(mb0 + m) * a.ldo + n0 + j] = s;
        }
      }
    }
  }
}

// MR (1-4) x rows, weight rows [r0, r1): S streams in lockstep, stream s walking its own contiguous run of rows
// (r0 + s * len + i), so every stream reads memory strictly sequentially and the S streams lie far apart.
// Far-apart sequential streams keep the hardware prefetcher on every stream: S adjacent rows in lockstep on short
// rows share a 4 KiB page at scattered offsets, which it does not follow, and one row at a time leaves bandwidth
// unused. A few x rows are still memory-bound, so they take the same path. (M = 4 spills x vectors to L1 loads;
// fine.)
template <class W, int S, int MR>
static void run_rows(const Problem& a, int64_t r0, int64_t r1) {
  const int64_t K = a.K, kc = K / CH;
  const auto* w = static_cast<const typename W::E*>(a.w);
  const int64_t len = (r1 - r0) / S;
  auto finish = [&](int64_t r, int m, typename T::V acc) {
    float s = T::hsum(acc);
    const typename W::E* wr = w + r * a.ldw;
    const float* xm = a.x + m * K;
    for (int64_t k = kc * CH; k < K; ++k) s += xm[k] * W::scalar(wr[k]);
    a.out[m * a.ldo + r] = a.bias ? s + a.bias[r] : s;
  };
  for (int64_t i = 0; i < len; ++i) {
    typename T::V acc[S][MR];
    const typename W::E* wr[S];
    for (int s = 0; s < S; ++s) {
      for (int m = 0; m < MR; ++m) acc[s][m] = T::zero();
      wr[s] = w + (r0 + s * len + i) * a.ldw;
    }
    for (int64_t c = 0; c < kc; ++c) {
      if constexpr (W::kDot) {
        typename T::V xb[MR];
        for (int m = 0; m < MR; ++m) xb[m] = T::load(a.x + m * K + c * CH);
        for (int s = 0; s < S; ++s) {
          const typename T::V wv = W::raw(wr[s] + c * CH);
          for (int m = 0; m < MR; ++m) acc[s][m] = W::dot_raw(acc[s][m], xb[m], wv);
        }
      } else {
        typename T::V xe[MR], xo[MR];
        for (int m = 0; m < MR; ++m) xe[m] = T::load(a.x + m * K + c * CH), xo[m] = T::load(a.x + m * K + c * CH + L);
        for (int s = 0; s < S; ++s) {
          typename T::V lo, hi;
          W::load(wr[s] + c * CH, lo, hi);
          for (int m = 0; m < MR; ++m) acc[s][m] = T::fma(hi, xo[m], T::fma(lo, xe[m], acc[s][m]));
        }
      }
    }
    for (int s = 0; s < S; ++s)
      for (int m = 0; m < MR; ++m) finish(r0 + s * len + i, m, acc[s][m]);
  }
  for (int64_t r = r0 + S * len; r < r1; ++r) {  // the last < S rows, one at a time
    const typename W::E* wr = w + r * a.ldw;
    for (int m = 0; m < MR; ++m) {
      typename T::V acc0 = T::zero(), acc1 = T::zero();
      for (int64_t c = 0; c < kc; ++c) {
        if constexpr (W::kDot) {
          acc0 = W::dot_raw(acc0, T::load(a.x + m * K + c * CH), W::raw(wr + c * CH));
        } else {
          typename T::V lo, hi;
          W::load(wr + c * CH, lo, hi);
          acc0 = T::fma(lo, T::load(a.x + m * K + c * CH), acc0);
          acc1 = T::fma(hi, T::load(a.x + m * K + c * CH + L), acc1);
        }
      }
      finish(r, m, T::add(acc0, acc1));
    }
  }
}

// Up to this many x rows take the row-stream path (run_rows); more use run_chunks' register tiles.
constexpr int64_t kRowStreamMaxM = 4;

// [c0, c1): chunks of rows_per_chunk(M) output rows.
template <class W>
static void run_w(const Problem& a, int64_t c0, int64_t c1) {
  if (a.M == 1)
    run_rows<W, T::kNR1, 1>(a, c0, std::min(c1, a.N));
  else if (a.M == 2)
    run_rows<W, T::kNR1 / 2, 2>(a, c0, std::min(c1, a.N));
  else if (a.M == 3)
    run_rows<W, T::kNR1 / 4, 3>(a, c0, std::min(c1, a.N));
  else if (a.M == 4)
    run_rows<W, T::kNR1 / 4, 4>(a, c0, std::min(c1, a.N));
  else
    run_chunks<W, T::kMR, T::kNR>(a, c0, c1);
}

// Row streams (M <= kRowStreamMaxM): a chunk is one weight row (each thread gets one contiguous run of rows).
static int64_t rows_per_chunk(int64_t M) { return M <= kRowStreamMaxM ? 1 : T::kNR * kChunkTiles; }

static void run(const Problem& a, int64_t c0, int64_t c1) {
  switch (a.wkind) {
    case WKind::kBF16: return run_w<WBF16>(a, c0, c1);
    case WKind::kF16: return run_w<WF16>(a, c0, c1);
    case WKind::kF32: return run_w<WF32>(a, c0, c1);
#ifdef HK_LINEAR_BF16_DOT
    case WKind::kBF16Dot: return run_w<WBF16Dot>(a, c0, c1);
#else
    case WKind::kBF16Dot: return;  // only hk_avx512bf16 runs this kind (hk_family::dense_rows)
#endif
  }
}

// x (f32 / bf16 / f16, row stride ldx) -> fp32 [M][K]; full chunks deinterleaved (evens, then odds) if asked, or
// (bf16_chunks, for WBF16Dot) each full chunk's values as bf16 in the first half of its slot.
static void pack_x(const void* x, int dtype, int64_t M, int64_t K, int64_t ldx, bool deinterleave, float* dst,
                   bool bf16_chunks = false) {
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
    if (bf16_chunks) {  // exact: x is bf16 whenever this kind runs
      for (int64_t c = 0; c < kc; ++c) {
        uint16_t* b = reinterpret_cast<uint16_t*>(d + c * CH);
        for (int i = 0; i < CH; ++i) b[i] = hk::f32_to_bf16(r[c * CH + i]);
      }
      for (int64_t k = kc * CH; k < K; ++k) d[k] = r[k];
      continue;
    }
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

