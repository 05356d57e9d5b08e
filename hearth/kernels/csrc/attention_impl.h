// ISA-generic body of paged attention, included once per ISA by attention.cpp inside
// `namespace <isa> { struct T {...}; #include "attention_impl.h" }` under a matching `#pragma GCC target`.
// T provides: V (vector of L floats), L, zero/set1/load/store/fma/mul/max/hsum/hmax, exp (vector, clamped so it
// never returns inf/denormals), and load_bf16 / load_f16 (L 16-bit values in natural order -> one float vector).
//
// One work item = (sequence, kv head, tile of up to QT query tokens). Its R = tokens x G query rows (the G query
// heads sharing the kv head, GQA) walk the sequence's block table and read K/V where they lie in the cache; each
// row keeps an online softmax (running max, running sum, fp32 accumulator of D floats, flash-decoding style).
// Blocks wholly outside every row's causal / sliding window range are never touched.

struct KVF32 {
  using E = float;
  static constexpr bool kScaled = false;
  static inline T::V load(const E* p) { return T::load(p); }
};
struct KVBF16 {
  using E = uint16_t;
  static constexpr bool kScaled = false;
  static inline T::V load(const E* p) { return T::load_bf16(p); }
};
struct KVF16 {
  using E = uint16_t;
  static constexpr bool kScaled = false;
  static inline T::V load(const E* p) { return T::load_f16(p); }
};
// int8: values are loaded unscaled; a key's scale multiplies its score, a value's scale its probability.
struct KVI8 {
  using E = int8_t;
  static constexpr bool kScaled = true;
  static inline T::V load(const E* p) { return T::load_i8(p); }
};

constexpr int L = T::L;

// Floats of scratch one work item needs (per thread).
static inline int64_t scratch_floats(int64_t rows, int64_t head_dim, int64_t block_size) {
  // sc: per row, block_size scores + a vector of padding
  return rows * head_dim + 2 * rows + rows * (block_size + L) + 2 * L;
}

// Blocks sit anywhere in the cache (and one head's rows are strided by Hkv * D), which the hardware prefetcher
// cannot follow: ask for the next block's K/V rows of this head while the current block is computed.
template <class E>
static inline void prefetch_block(const E* k, const E* v, int64_t bs, int64_t ts, int64_t D) {
  const int64_t bytes = D * (int64_t)sizeof(E);
  for (int64_t j = 0; j < bs; ++j) {
    const char* kj = reinterpret_cast<const char*>(k + j * ts);
    const char* vj = reinterpret_cast<const char*>(v + j * ts);
    for (int64_t o = 0; o < bytes; o += 64) {
      _mm_prefetch(kj + o, _MM_HINT_T0);
      _mm_prefetch(vj + o, _MM_HINT_T0);
    }
  }
}

// sc[j] = q . k_j (unscaled) for j in [j0, j1): four keys at a time, so four independent FMA chains are in flight
// and one transposing reduction replaces four horizontal sums.
template <class KV>
static inline void block_scores(const float* __restrict qr, const typename KV::E* kb, int64_t ts, int64_t D,
                                int64_t j0, int64_t j1, float* __restrict sc) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const typename KV::E* k0 = kb + j * ts;
    typename T::V a0 = T::zero(), a1 = T::zero(), a2 = T::zero(), a3 = T::zero();
    for (int64_t d = 0; d < D; d += L) {
      const typename T::V qv = T::load(qr + d);
      a0 = T::fma(qv, KV::load(k0 + d), a0);
      a1 = T::fma(qv, KV::load(k0 + ts + d), a1);
      a2 = T::fma(qv, KV::load(k0 + 2 * ts + d), a2);
      a3 = T::fma(qv, KV::load(k0 + 3 * ts + d), a3);
    }
    T::hsum4(a0, a1, a2, a3, sc + j);
  }
  for (; j < j1; ++j) {
    const typename KV::E* kj = kb + j * ts;
    typename T::V a = T::zero();
    for (int64_t d = 0; d < D; d += L) a = T::fma(T::load(qr + d), KV::load(kj + d), a);
    sc[j] = T::hsum(a);
  }
}

// As block_scores for RG query rows that see the same keys (one query token's GQA group): each key chunk is loaded
// (and converted) once for the group instead of once per row. Same sums in the same order as block_scores, per row.
// sc + g * ld: row g's scores.
template <class KV, int RG>
static inline void group_scores(const float* const* qr, const typename KV::E* kb, int64_t ts, int64_t D, int64_t j0,
                                int64_t j1, float* __restrict sc, int64_t ld) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const typename KV::E* k0 = kb + j * ts;
    typename T::V a[RG][4];
    for (int g = 0; g < RG; ++g)
      for (int u = 0; u < 4; ++u) a[g][u] = T::zero();
    for (int64_t d = 0; d < D; d += L) {
      const typename T::V k_0 = KV::load(k0 + d), k_1 = KV::load(k0 + ts + d), k_2 = KV::load(k0 + 2 * ts + d),
                          k_3 = KV::load(k0 + 3 * ts + d);
      for (int g = 0; g < RG; ++g) {
        const typename T::V qv = T::load(qr[g] + d);
        a[g][0] = T::fma(qv, k_0, a[g][0]);
        a[g][1] = T::fma(qv, k_1, a[g][1]);
        a[g][2] = T::fma(qv, k_2, a[g][2]);
        a[g][3] = T::fma(qv, k_3, a[g][3]);
      }
    }
    for (int g = 0; g < RG; ++g) T::hsum4(a[g][0], a[g][1], a[g][2], a[g][3], sc + g * ld + j);
  }
  if (j < j1)
    for (int g = 0; g < RG; ++g) block_scores<KV>(qr[g], kb, ts, D, j, j1, sc + g * ld);
}

// Scores of R rows sharing one position, in groups of up to 4 rows.
template <class KV>
static inline void shared_scores(const float* const* qr, int64_t R, const typename KV::E* kb, int64_t ts, int64_t D,
                                 int64_t j0, int64_t j1, float* sc, int64_t ld) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) group_scores<KV, 4>(qr + r, kb, ts, D, j0, j1, sc + r * ld, ld);
  switch (R - r) {
    case 3: return group_scores<KV, 3>(qr + r, kb, ts, D, j0, j1, sc + r * ld, ld);
    case 2: return group_scores<KV, 2>(qr + r, kb, ts, D, j0, j1, sc + r * ld, ld);
    case 1: return group_scores<KV, 1>(qr + r, kb, ts, D, j0, j1, sc + r * ld, ld);
    default: return;
  }
}

// acc[0 : U*L] = acc * corr + sum_j p_j v_j[0 : U*L]: U independent accumulators held in registers over the keys.
template <class KV, int U>
static inline void accumulate_v(float* __restrict acc, const typename KV::E* vb, int64_t ts,
                                const float* __restrict pj, int64_t j0, int64_t j1, float corr) {
  typename T::V a[U];
  const typename T::V vc = T::set1(corr);
  for (int u = 0; u < U; ++u) a[u] = T::mul(T::load(acc + u * L), vc);
  for (int64_t j = j0; j < j1; ++j) {
    const typename T::V pv = T::set1(pj[j]);
    const typename KV::E* vj = vb + j * ts;
    for (int u = 0; u < U; ++u) a[u] = T::fma(pv, KV::load(vj + u * L), a[u]);
  }
  for (int u = 0; u < U; ++u) T::store(acc + u * L, a[u]);
}

// The same as accumulate_v<KV, U> for RG rows that share keys [j0, j1) (a decode's query heads of one kv head):
// each V vector is loaded (and widened) once for the RG rows instead of once per row. Per row the same operations
// in the same order, so the same bits.
template <class KV, int RG, int U>
static inline void accumulate_v_rows(float* __restrict acc, int64_t D, const typename KV::E* vb, int64_t ts,
                                     const float* __restrict sc, int64_t ld, const float* corr, int64_t j0,
                                     int64_t j1) {
  typename T::V a[RG][U];
  for (int g = 0; g < RG; ++g) {
    const typename T::V vc = T::set1(corr[g]);
    for (int u = 0; u < U; ++u) a[g][u] = T::mul(T::load(acc + g * D + u * L), vc);
  }
  for (int64_t j = j0; j < j1; ++j) {
    const typename KV::E* vj = vb + j * ts;
    typename T::V v[U];
    for (int u = 0; u < U; ++u) v[u] = KV::load(vj + u * L);
    for (int g = 0; g < RG; ++g) {
      const typename T::V pv = T::set1(sc[g * ld + j]);
      for (int u = 0; u < U; ++u) a[g][u] = T::fma(pv, v[u], a[g][u]);
    }
  }
  for (int g = 0; g < RG; ++g)
    for (int u = 0; u < U; ++u) T::store(acc + g * D + u * L, a[g][u]);
}

// accumulate_v_rows over all of D for RG rows (row r's acc at acc + r * D, probabilities at sc + r * ld).
template <class KV, int RG>
static inline void accumulate_v_group(float* acc, int64_t D, const typename KV::E* vb, int64_t ts, const float* sc,
                                      int64_t ld, const float* corr, int64_t j0, int64_t j1) {
  int64_t d = 0;
  for (; d + 4 * L <= D; d += 4 * L) accumulate_v_rows<KV, RG, 4>(acc + d, D, vb + d, ts, sc, ld, corr, j0, j1);
  for (; d + 2 * L <= D; d += 2 * L) accumulate_v_rows<KV, RG, 2>(acc + d, D, vb + d, ts, sc, ld, corr, j0, j1);
  for (; d < D; d += L) accumulate_v_rows<KV, RG, 1>(acc + d, D, vb + d, ts, sc, ld, corr, j0, j1);
}

// The V pass of R rows sharing one position (shared_scores' counterpart): 4 rows x 4 vectors of accumulators in
// the 32 zmm registers, 2 x 4 in the 16 of AVX2.
template <class KV>
static inline void shared_v(float* acc, int64_t R, int64_t D, const typename KV::E* vb, int64_t ts, const float* sc,
                            int64_t ld, const float* corr, int64_t j0, int64_t j1) {
  constexpr int RG = L >= 16 ? 4 : 2;
  int64_t r = 0;
  for (; r + RG <= R; r += RG) accumulate_v_group<KV, RG>(acc + r * D, D, vb, ts, sc + r * ld, ld, corr + r, j0, j1);
  switch (R - r) {
    case 3: return accumulate_v_group<KV, 3>(acc + r * D, D, vb, ts, sc + r * ld, ld, corr + r, j0, j1);
    case 2: return accumulate_v_group<KV, 2>(acc + r * D, D, vb, ts, sc + r * ld, ld, corr + r, j0, j1);
    case 1: return accumulate_v_group<KV, 1>(acc + r * D, D, vb, ts, sc + r * ld, ld, corr + r, j0, j1);
    default: return;
  }
}

template <class KV>
static void attend(const AttnParams& p, int64_t s, int64_t h, int64_t t0, int64_t nt, float* scratch) {
  using E = typename KV::E;
  const int64_t D = p.head_dim, G = p.num_heads / p.num_kv_heads, bs = p.block_size;
  const int64_t R = nt * G;
  const int64_t qs = p.query_start[s], ql = p.query_start[s + 1] - qs, ctx = p.context_lens[s];
  const int64_t pos0 = ctx - ql + t0;  // position of the tile's first query token
  float* acc = scratch;                // [R][D]
  float* mx = acc + R * D;             // [R] running max
  float* sum = mx + R;                 // [R] running sum of exp
  const int64_t ld = bs + L;
  float* sc_rows = sum + R;            // [R][bs + L] scores, then probabilities, of one block, per row
  for (int64_t i = 0; i < R * D; ++i) acc[i] = 0.f;
  for (int64_t r = 0; r < R; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.f;
  }
  const int64_t hi = std::min<int64_t>(pos0 + nt - 1, ctx - 1);  // last key any row needs (inclusive)
  const int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos0 - p.window + 1) : 0;
  const int32_t* table = p.block_tables + s * p.bt_stride;
  const E* kbase = static_cast<const E*>(p.k) + h * D;
  const E* vbase = static_cast<const E*>(p.v) + h * D;
  const int64_t ts = p.kv_tok_stride;
  const int64_t b_end = hi / bs;
  // One query token (a decode): every row sees the same keys, so their scores are computed together per block.
  const bool shared = nt == 1 && R <= 32;
  const float* qrow[32];
  float corr_rows[32];  // shared: each row's rescale of its accumulator for this block, for the joint V pass
  if (shared)
    for (int64_t r = 0; r < R; ++r) qrow[r] = p.q + (qs + t0) * p.q_tok_stride + (h * G + r) * D;
  for (int64_t b = lo / bs; b <= b_end; ++b) {
    const int64_t blk = table[b];
    const E* kb = kbase + blk * p.block_stride;
    const E* vb = vbase + blk * p.block_stride;
    if (b < b_end) prefetch_block(kbase + table[b + 1] * p.block_stride, vbase + table[b + 1] * p.block_stride,
                                  bs, ts, D);
    const int64_t kp0 = b * bs;
    // shared: every row's keys of this block, [sj0, sj1)
    const int64_t sj0 = p.window > 0 ? std::max<int64_t>(0, pos0 - p.window + 1 - kp0) : 0;
    const int64_t sj1 = std::min<int64_t>(bs, pos0 - kp0 + 1);
    if (shared && sj0 < sj1) shared_scores<KV>(qrow, R, kb, ts, D, sj0, sj1, sc_rows, ld);
    for (int64_t r = 0; r < R; ++r) {
      float* sc = sc_rows + r * ld;
      const int64_t t = r / G, pos = pos0 + t;
      const int64_t j0 = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1 - kp0) : 0;
      const int64_t j1 = std::min<int64_t>(bs, pos - kp0 + 1);
      if (j0 >= j1) continue;
      if (!shared) {
        const float* qr = p.q + (qs + t0 + t) * p.q_tok_stride + (h * G + r % G) * D;
        block_scores<KV>(qr, kb, ts, D, j0, j1, sc);
      }
      if constexpr (KV::kScaled) {
        const float* ks = p.k_scale + (blk * bs) * p.num_kv_heads + h;
        for (int64_t j = j0; j < j1; ++j) sc[j] *= ks[j * p.num_kv_heads];
      }
      // Scale (and softcap), then pad to whole vectors with -inf: max/exp/sum run on full vectors; padded lanes
      // come out of exp as ~1e-38 (never read by the V pass, and far below the sum's rounding).
      const int64_t jv = j0 + ((j1 - j0 + L - 1) / L) * L;
      const typename T::V vs = T::set1(p.scale);
      for (int64_t j = j0; j < j1; j += L) T::store(sc + j, T::mul(T::load(sc + j), vs));
      if (p.softcap > 0.f)
        for (int64_t j = j0; j < j1; ++j) sc[j] = p.softcap * std::tanh(sc[j] / p.softcap);
      if (p.alibi) {  // bias relative to the query (<= 0), so the running max stays near the raw scores
        const float slope = p.alibi[h * G + r % G];
        const float rel0 = (float)(kp0 - pos);
        for (int64_t j = j0; j < j1; ++j) sc[j] += slope * (rel0 + (float)j);
      }
      for (int64_t j = j1; j < jv; ++j) sc[j] = -INFINITY;
      typename T::V vmax = T::load(sc + j0);
      for (int64_t j = j0 + L; j < jv; j += L) vmax = T::max(vmax, T::load(sc + j));
      const float m_old = mx[r], m_new = std::max(m_old, T::hmax(vmax));
      const float corr = std::exp(m_old - m_new);  // 0 on the row's first block (m_old = -inf)
      const typename T::V vm = T::set1(m_new);
      typename T::V vsum = T::zero();
      for (int64_t j = j0; j < jv; j += L) {
        const typename T::V e = T::exp(T::sub(T::load(sc + j), vm));
        T::store(sc + j, e);
        vsum = T::add(vsum, e);
      }
      sum[r] = sum[r] * corr + T::hsum(vsum);
      mx[r] = m_new;
      if constexpr (KV::kScaled) {
        const float* vsc = p.v_scale + (blk * bs) * p.num_kv_heads + h;
        for (int64_t j = j0; j < j1; ++j) sc[j] *= vsc[j * p.num_kv_heads];
      }
      if (shared) {  // (the V pass after the loop)
        corr_rows[r] = corr;
        continue;
      }
      float* ar = acc + r * D;
      int64_t d = 0;
      for (; d + 8 * L <= D; d += 8 * L) accumulate_v<KV, 8>(ar + d, vb + d, ts, sc, j0, j1, corr);
      for (; d + 4 * L <= D; d += 4 * L) accumulate_v<KV, 4>(ar + d, vb + d, ts, sc, j0, j1, corr);
      for (; d + 2 * L <= D; d += 2 * L) accumulate_v<KV, 2>(ar + d, vb + d, ts, sc, j0, j1, corr);
      for (; d < D; d += L) accumulate_v<KV, 1>(ar + d, vb + d, ts, sc, j0, j1, corr);
    }
    if (shared && sj0 < sj1) shared_v<KV>(acc, R, D, vb, ts, sc_rows, ld, corr_rows, sj0, sj1);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = r / G;
    float* o = p.out + (qs + t0 + t) * p.out_tok_stride + (h * G + r % G) * D;
    // NOTE: sum > 0: every row sees at least its own key (window >= 1), whose probability after rescaling is > 0.
    const typename T::V inv = T::set1(1.f / sum[r]);
    for (int64_t d = 0; d < D; d += L) T::store(o + d, T::mul(T::load(acc + r * D + d), inv));
  }
}

// f(KV{}) with the loader of this cache dtype.
template <class F>
static inline void with_kv(int kv_dtype, F&& f) {
  switch (kv_dtype) {
    case kBF16: return f(KVBF16{});
    case kF16: return f(KVF16{});
    case kI8: return f(KVI8{});
    default: return f(KVF32{});
  }
}

static void run_item(const AttnParams& p, const WorkItem& w, float* scratch) {
  with_kv(p.kv_dtype, [&](auto kv) { attend<decltype(kv)>(p, w.seq, w.kv_head, w.t0, w.nt, scratch); });
}
