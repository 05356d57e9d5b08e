// The blocked GEMM's loop order that every panel GEMM walks (panel.cpp, panel_dot.cpp, quant_panel.cpp's AVX-512
// and AVX2 bodies): plain C++ and OpenMP, no vector code, so one copy serves every ISA's namespace.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

// The blocked GEMM's loop order over G panel pairs, ntiles row tiles and KU k units (k or k pairs): on nt threads,
// each takes a range of pairs (or, with fewer than 4 pairs per thread, of row tiles) and walks it in blocks of
// pairs_per_block pairs x kc units, so that weight block stays in L2 while the row tiles (mc at a time: their x
// stays in L2 too) run against it. tile(t, g, k0, kc): row tile t against pair g over units [k0, k0 + kc).
template <class F>
inline void blocked_loop(int64_t G, int64_t ntiles, int64_t KU, int64_t KC, int64_t pairs_per_block, int64_t mc,
                         int nt, F&& tile) {
  const bool split_pairs = G >= 4 * nt;  // else the threads split the row tiles
#pragma omp parallel num_threads(nt)
  {
    const int64_t th = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t gb = split_pairs ? G * th / T : 0, ge = split_pairs ? G * (th + 1) / T : G;
    const int64_t tb = split_pairs ? 0 : ntiles * th / T, te = split_pairs ? ntiles : ntiles * (th + 1) / T;
    for (int64_t tb0 = tb; tb0 < te; tb0 += mc) {
      const int64_t te0 = std::min(te, tb0 + mc);
      for (int64_t g0 = gb; g0 < ge; g0 += pairs_per_block) {
        const int64_t g1 = std::min(ge, g0 + pairs_per_block);
        for (int64_t k0 = 0; k0 < KU; k0 += KC)
          for (int64_t t = tb0; t < te0; ++t)
            for (int64_t g = g0; g < g1; ++g) tile(t, g, k0, std::min(KC, KU - k0));
      }
    }
  }
}
