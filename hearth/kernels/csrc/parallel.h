// Splitting [0, n) over an OpenMP team: evenly (parallel) or in chunks taken as threads free up (parallel_dynamic).
// Shared by linear.cpp and quant.cpp.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace hk_par {

template <class F>
void parallel(int64_t n, int nthreads, const F& f) {
  int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, n));
  if (nt == 1) return f(0, n);
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t b = n * t / T, e = n * (t + 1) / T;
    if (b < e) f(b, e);
  }
}

// [0, n) in chunks of `chunk` handed out in order as threads free up. For the M = 1 kernels: with an even split the
// thread that got less memory bandwidth held the other at every region's end (perf, TinyLlama Q4_0 decode: the
// main thread spent 6.3% of its time in libgomp's barrier, 1.3% with these chunks; kernel samples 34/37% -> 39/39%).
template <class F>
void parallel_dynamic(int64_t n, int64_t chunk, int nthreads, const F& f) {
  const int64_t nc = (n + chunk - 1) / chunk;
  int nt = (int)std::max<int64_t>(1, std::min<int64_t>(nthreads, nc));
  if (nt == 1) return f(0, n);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t c = 0; c < nc; ++c) f(c * chunk, std::min(n, (c + 1) * chunk));
}

}  // namespace hk_par
