#include "common/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>

#include <ATen/Parallel.h>

namespace specloop {

int AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void SetComputeThreads(int n) {
  if (n <= 0) n = AvailableCores();
  at::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    f(n);
  }
}

}  // namespace specloop
