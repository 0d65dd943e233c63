#include "common/threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

namespace specloop {

void SetComputeThreads(int n) {
  at::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    f(n);
  }
}

}  // namespace specloop
