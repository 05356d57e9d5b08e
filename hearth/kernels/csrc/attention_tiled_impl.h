// ISA-generic body of the tiled (prefill) attention path, included once per ISA by attention.cpp after
// attention_impl.h, inside the same namespace (it uses T, L and the KV* loaders from there). T also provides
// keep_if_le (s where a <= b, else -inf), kDV (head-dim vectors per P.V micro-tile) and kRegs (vector registers).
//
// A work item with several query tokens (R = tokens x G rows) is a small GEMM problem, which the row-at-a-time
// path of attention_impl.h runs at ~25% of the FMA peak (two loads per FMA, horizontal sums per key). Here the keys
// go in chunks of KC: each chunk's K and V rows are converted once into fp32 scratch, scores are computed
// transposed (S^T [key][row], the item's q transposed once into qt [d][row]), so the online softmax is vertical
// vector math over rows (no horizontal max/sum), then O [row][d] += P^T[key][row] * V[key][d] with accumulators
// held in registers over the chunk. Rows are padded to Rp (a multiple of L): padded rows have q = 0, never masked.

constexpr int64_t KC = 64;  // keys per chunk
constexpr int RT = 4;       // rows per P.V micro-tile
// Query rows per tiled work item (four row vectors): more rows per pass over the context's K/V, which come from
// L3 or memory for long prompts.
constexpr int64_t kTiledRows = 4 * L;

// Floats of scratch the tiled path needs for an item of up to `rows` query rows.
static inline int64_t tiled_scratch_floats(int64_t rows, int64_t head_dim) {
  const int64_t rp = (rows + L - 1) / L * L;
  // qt [D][Rp], kp / vp [KC][D], st [KC][Rp], acc [Rp][D], 6 row vectors (max, sum, corr, pos, lo, slope), and
  // (bf16 dot form) pt2 [KC / 2][Rp] probability pairs
  return head_dim * rp + 2 * KC * head_dim + KC * rp + rp * head_dim + 6 * rp + L + KC / 2 * rp;
}

// The micro-kernels' operands: fp32 values multiplied in FMAs, or (T::kDot) bf16 pairs as 32-bit values
// multiplied in vdpbf16ps, each pair doing two FMAs' work. madd(a, x, y) = a + x . y.
struct F32Ops {
  using E = float;
  using Q = typename T::V;
  static inline Q load(const E* p) { return T::load(p); }
  static inline Q bcast(E x) { return T::set1(x); }
  static inline typename T::V madd(typename T::V a, Q x, Q y) { return T::fma(x, y, a); }
};
struct PairOps {
  using E = uint32_t;
  using Q = typename T::VI;
  static inline Q load(const E* p) { return T::load_pairs(p); }
  static inline Q bcast(E x) { return T::set1_pair(x); }
  static inline typename T::V madd(typename T::V a, Q x, Q y) { return T::dot(a, x, y); }
};

// st[j][0 : NV*L] = sum_i krow(j)[i] . qt[i][0 : NV*L] over DK elements i, for j in [0, kn): JT keys at a time,
// NV*JT accumulators. F32Ops: DK = D values (kp rows); PairOps: DK = D / 2 pairs (cache rows read in place).
template <int NV, int JT, class Ops, class KeyRow>
static inline void tiled_scores(const typename Ops::E* __restrict qt, KeyRow krow, int64_t DK, int64_t rp,
                                int64_t kn, float* __restrict st) {
  int64_t j = 0;
  for (; j + JT <= kn; j += JT) {
    typename T::V a[JT][NV];
    for (int u = 0; u < JT; ++u)
      for (int v = 0; v < NV; ++v) a[u][v] = T::zero();
    for (int64_t i = 0; i < DK; ++i) {
      typename Ops::Q qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = Ops::load(qt + i * rp + v * L);
      for (int u = 0; u < JT; ++u) {
        const typename Ops::Q kv = Ops::bcast(krow(j + u)[i]);
        for (int v = 0; v < NV; ++v) a[u][v] = Ops::madd(a[u][v], kv, qv[v]);
      }
    }
    for (int u = 0; u < JT; ++u)
      for (int v = 0; v < NV; ++v) T::store(st + (j + u) * rp + v * L, a[u][v]);
  }
  for (; j < kn; ++j) {
    typename T::V a[NV];
    for (int v = 0; v < NV; ++v) a[v] = T::zero();
    for (int64_t i = 0; i < DK; ++i) {
      const typename Ops::Q kv = Ops::bcast(krow(j)[i]);
      for (int v = 0; v < NV; ++v) a[v] = Ops::madd(a[v], kv, Ops::load(qt + i * rp + v * L));
    }
    for (int v = 0; v < NV; ++v) T::store(st + j * rp + v * L, a[v]);
  }
}

// Keys per score micro-tile for NV row vectors: accumulators + row vectors + one broadcast fit the register file.
template <int NV>
constexpr int score_keys() {
  return std::min(8, (T::kRegs - NV - 1) / NV);
}

template <class Ops, class KeyRow>
static inline void scores_dispatch(const typename Ops::E* qt, KeyRow krow, int64_t DK, int64_t rp, int64_t kn,
                                   float* st) {
  switch (rp / L) {  // rp <= kTiledRows = 4 L
    case 1: return tiled_scores<1, score_keys<1>(), Ops>(qt, krow, DK, rp, kn, st);
    case 2: return tiled_scores<2, score_keys<2>(), Ops>(qt, krow, DK, rp, kn, st);
    case 3: return tiled_scores<3, score_keys<3>(), Ops>(qt, krow, DK, rp, kn, st);
    default: return tiled_scores<4, score_keys<4>(), Ops>(qt, krow, DK, rp, kn, st);
  }
}

// acc[r][d0 : d0 + DV*L] = acc * corr[r] + sum_j pt[j][r] . vp[j][d0 : ...] for RT rows r0.., j in [0, kn).
// F32Ops: pt = st [kn][rp] probabilities, vp [kn][D] values. PairOps: j runs over key pairs, pt [kn][rp] each row's
// probabilities of keys (2j, 2j + 1) as bf16 pairs, vp [kn][D] the matching V pairs per dim.
template <int DV, class Ops>
static inline void tiled_pv(float* __restrict acc, const typename Ops::E* __restrict pt,
                            const typename Ops::E* __restrict vp, const float* __restrict corr, int64_t D, int64_t rp,
                            int64_t kn, int64_t r0, int64_t d0) {
  typename T::V a[RT][DV];
  for (int r = 0; r < RT; ++r) {
    const typename T::V c = T::set1(corr[r0 + r]);
    for (int v = 0; v < DV; ++v) a[r][v] = T::mul(T::load(acc + (r0 + r) * D + d0 + v * L), c);
  }
  for (int64_t j = 0; j < kn; ++j) {
    typename Ops::Q vv[DV];
    for (int v = 0; v < DV; ++v) vv[v] = Ops::load(vp + j * D + d0 + v * L);
    for (int r = 0; r < RT; ++r) {
      const typename Ops::Q p = Ops::bcast(pt[j * rp + r0 + r]);
      for (int v = 0; v < DV; ++v) a[r][v] = Ops::madd(a[r][v], p, vv[v]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int v = 0; v < DV; ++v) T::store(acc + (r0 + r) * D + d0 + v * L, a[r][v]);
}

// tiled_pv over all rows and head dims (DV vectors per micro-tile, then single vectors for the rest).
template <class Ops>
static inline void pv_all(float* acc, const typename Ops::E* pt, const typename Ops::E* vp, const float* corr,
                          int64_t D, int64_t rp, int64_t kn) {
  for (int64_t r0 = 0; r0 < rp; r0 += RT) {
    int64_t d0 = 0;
    for (; d0 + T::kDV * L <= D; d0 += T::kDV * L) tiled_pv<T::kDV, Ops>(acc, pt, vp, corr, D, rp, kn, r0, d0);
    for (; d0 < D; d0 += L) tiled_pv<1, Ops>(acc, pt, vp, corr, D, rp, kn, r0, d0);
  }
}

// One key / value row of this head (D elements) into fp32 (int8: times its per-token scale).
template <class KV>
static inline void pack_row(const typename KV::E* src, const float* scale_row, int64_t D, float* dst) {
  if constexpr (KV::kScaled) {
    const typename T::V s = T::set1(*scale_row);
    for (int64_t d = 0; d < D; d += L) T::store(dst + d, T::mul(KV::load(src + d), s));
  } else {
    for (int64_t d = 0; d < D; d += L) T::store(dst + d, KV::load(src + d));
  }
}

template <class KV>
static void attend_tiled(const AttnParams& p, int64_t s, int64_t h, int64_t t0, int64_t nt, float* scratch) {
  using E = typename KV::E;
  // vdpbf16ps (bf16 cache, AVX512-BF16): scores with q rounded to bf16 and left unscaled (the scale multiplies each
  // score instead: exact for any scale), keys read in place; P.V with probabilities rounded to bf16 pairs.
  constexpr bool dot = T::kDot && std::is_same_v<KV, KVBF16>;
  const int64_t D = p.head_dim, G = p.num_heads / p.num_kv_heads, bs = p.block_size;
  const int64_t R = nt * G, rp = (R + L - 1) / L * L;
  const int64_t qs = p.query_start[s], ql = p.query_start[s + 1] - qs, ctx = p.context_lens[s];
  const int64_t pos0 = ctx - ql + t0;
  float* qt = scratch;         // [D][rp]
  float* kp = qt + D * rp;     // [KC][D]
  float* vp = kp + KC * D;     // [KC][D]
  float* st = vp + KC * D;     // [KC][rp] scores, then probabilities
  float* acc = st + KC * rp;   // [rp][D]
  float* mx = acc + rp * D;    // [rp] running max (finite: -1e30 before any key, so no inf - inf)
  float* sum = mx + rp;        // [rp]
  float* corr = sum + rp;      // [rp]
  float* qpos = corr + rp;     // [rp] query position (padded rows: far ahead, never masked)
  float* klo = qpos + rp;      // [rp] first key position the row sees
  float* slope = klo + rp;     // [rp] ALiBi slope (0 without)
  uint32_t* pt2 = reinterpret_cast<uint32_t*>(slope + rp + L);  // (dot) [KC / 2][rp] probability pairs
  uint32_t* vp2 = reinterpret_cast<uint32_t*>(vp);               // (dot) [KC / 2][D] V pairs, in vp's place
  for (int64_t r = 0; r < rp; ++r) {
    const bool real = r < R;
    const int64_t pos = pos0 + r / G;
    qpos[r] = real ? (float)pos : 1e9f;
    klo[r] = real && p.window > 0 ? (float)(pos - p.window + 1) : -1e9f;
    slope[r] = real && p.alibi ? p.alibi[h * G + r % G] : 0.f;
    mx[r] = -1e30f;
    sum[r] = 0.f;
    const float* qr = p.q + (qs + t0 + r / G) * p.q_tok_stride + (h * G + r % G) * D;
    if constexpr (dot) {  // qt as [D / 2][rp] bf16 pairs
      uint32_t* qt2 = reinterpret_cast<uint32_t*>(qt);
      for (int64_t i = 0; i < D / 2; ++i)
        qt2[i * rp + r] = real ? uint32_t(hk::f32_to_bf16(qr[2 * i])) | uint32_t(hk::f32_to_bf16(qr[2 * i + 1])) << 16 : 0u;
    } else {  // (q pre-scaled: scores come out as scale * q.k)
      for (int64_t d = 0; d < D; ++d) qt[d * rp + r] = real ? qr[d] * p.scale : 0.f;
    }
  }
  const typename T::V score_scale = T::set1(p.scale);
  const uint32_t* krow[KC];  // (dot) this chunk's key rows in the cache
  const E* vrow[KC + 1];     // (dot) its value rows (an odd chunk's last pairs with a zero row)
  alignas(64) static constexpr E kZeroRow[512] = {};
  for (int64_t i = 0; i < rp * D; ++i) acc[i] = 0.f;

  const int64_t hi = std::min<int64_t>(pos0 + nt - 1, ctx - 1);
  const int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos0 - p.window + 1) : 0;
  const int32_t* table = p.block_tables + s * p.bt_stride;
  const E* kbase = static_cast<const E*>(p.k) + h * D;
  const E* vbase = static_cast<const E*>(p.v) + h * D;
  const int64_t ts = p.kv_tok_stride;
  for (int64_t c0 = lo; c0 <= hi; c0 += KC) {
    const int64_t kn = std::min<int64_t>(KC, hi + 1 - c0);
    for (int64_t j = 0, b = c0 / bs, o = c0 % bs; j < kn; ++b, o = 0) {  // block by block
      const int64_t blk = table[b];
      for (; o < bs && j < kn; ++o, ++j) {
        const int64_t off = blk * p.block_stride + o * ts, slot = blk * bs + o;
        const float* ks = KV::kScaled ? p.k_scale + slot * p.num_kv_heads + h : nullptr;
        const float* vs = KV::kScaled ? p.v_scale + slot * p.num_kv_heads + h : nullptr;
        if constexpr (dot) {
          krow[j] = reinterpret_cast<const uint32_t*>(kbase + off);
          vrow[j] = vbase + off;
        } else {
          pack_row<KV>(kbase + off, ks, D, kp + j * D);
          pack_row<KV>(vbase + off, vs, D, vp + j * D);
        }
      }
    }
    if constexpr (dot) {
      scores_dispatch<PairOps>(reinterpret_cast<const uint32_t*>(qt), [&](int64_t j) { return krow[j]; }, D / 2, rp,
                               kn, st);
      vrow[kn] = kZeroRow;
      for (int64_t j = 0; j < kn; j += 2)
        for (int64_t d = 0; d < D; d += L) T::store_pairs(vp2 + (j / 2) * D + d, T::pair_rows(vrow[j] + d, vrow[j + 1] + d));
    } else {
      scores_dispatch<F32Ops>(qt, [kp, D](int64_t j) { return kp + j * D; }, D, rp, kn, st);
    }
    // Masks are needed only where the chunk crosses some row's causal edge or window start.
    const bool edge = c0 + kn - 1 > pos0 || (p.window > 0 && c0 < hi - p.window + 1);
    for (int64_t v = 0; v < rp; v += L) {
      const typename T::V qp = T::load(qpos + v), kl = T::load(klo + v), sl = T::load(slope + v);
      typename T::V m = T::load(mx + v);
      for (int64_t j = 0; j < kn; ++j) {
        float* row = st + j * rp + v;
        typename T::V x = T::load(row);
        if constexpr (dot) x = T::mul(x, score_scale);
        if (p.softcap > 0.f) {
          alignas(64) float tmp[L];
          T::store(tmp, x);
          for (int l = 0; l < L; ++l) tmp[l] = p.softcap * std::tanh(tmp[l] / p.softcap);
          x = T::load(tmp);
        }
        const typename T::V kv = T::set1((float)(c0 + j));
        if (p.alibi) x = T::fma(sl, T::sub(kv, qp), x);  // slope * (key_pos - query_pos) <= 0
        if (edge) x = T::keep_if_le(T::keep_if_le(x, kv, qp), kl, kv);
        T::store(row, x);
        m = T::max(m, x);
      }
      const typename T::V m_old = T::load(mx + v);
      T::store(corr + v, T::exp(T::sub(m_old, m)));  // ~0 on the row's first chunk (m_old = -1e30)
      typename T::V ssum = T::zero();
      for (int64_t j = 0; j < kn; ++j) {
        float* row = st + j * rp + v;
        const typename T::V e = T::exp(T::sub(T::load(row), m));  // masked (-inf): ~1e-38, never counted
        T::store(row, e);
        ssum = T::add(ssum, e);
      }
      T::store(sum + v, T::fma(T::load(sum + v), T::load(corr + v), ssum));
      T::store(mx + v, m);
    }
    if constexpr (dot) {
      const int64_t kpn = (kn + 1) / 2;
      for (int64_t jp = 0; jp < kpn; ++jp) {
        const float* lo = st + 2 * jp * rp;
        for (int64_t v = 0; v < rp; v += L)
          T::store_pairs(pt2 + jp * rp + v, T::pair_round(T::load(lo + v), 2 * jp + 1 < kn ? T::load(lo + rp + v)
                                                                                         : T::zero()));
      }
      pv_all<PairOps>(acc, pt2, vp2, corr, D, rp, kpn);
    } else {
      pv_all<F32Ops>(acc, st, vp, corr, D, rp, kn);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* o = p.out + (qs + t0 + r / G) * p.out_tok_stride + (h * G + r % G) * D;
    const typename T::V inv = T::set1(1.f / sum[r]);
    for (int64_t d = 0; d < D; d += L) T::store(o + d, T::mul(T::load(acc + r * D + d), inv));
  }
}

static void run_item_tiled(const AttnParams& p, const WorkItem& w, float* scratch) {
  with_kv(p.kv_dtype, [&](auto kv) { attend_tiled<decltype(kv)>(p, w.seq, w.kv_head, w.t0, w.nt, scratch); });
}
