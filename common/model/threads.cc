#include "common/model/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

#include <ATen/Parallel.h>

namespace specloop {

int AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

void SetComputeThreads(int n) {
  if (n <= 0) {
    const char* env = std::getenv("OMP_NUM_THREADS");
    n = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : AvailableCores();
  }
  at::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    f(n);
  }
}

}  // namespace specloop
