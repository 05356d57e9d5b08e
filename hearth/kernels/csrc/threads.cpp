// Pin the calling thread's OpenMP team to cores: thread i of the team -> cores[i % n].
//
// Lives in C (not a Python callback run by each OpenMP worker): measured in a non-main Python thread, the
// callback route left torch's later parallel regions on a fresh worker that inherited the master's one-core
// mask (two threads on one core, decode steps much slower); this region is an ordinary team of the calling
// thread's pool, the one torch's and hearth's kernels reuse.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <omp.h>
#include <sched.h>

#include <cstdint>

extern "C" {

// Returns how many team threads could not be pinned (0 = all pinned).
int hk_bind_threads(const int32_t* cores, int n) {
  if (n < 1) return 1;
  int failed = 0;
#pragma omp parallel num_threads(n) reduction(+ : failed)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cores[omp_get_thread_num() % n], &set);
    failed += sched_setaffinity(0, sizeof(set), &set) != 0;
  }
  return failed;
}

}  // extern "C"
