#include "common/base/malloc_policy.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace specloop {

namespace {

#if defined(__GLIBC__)
// Whether the operator set this malloc parameter in the environment, as a MALLOC_*_ variable
// or a glibc.malloc.NAME tunable.
bool SetByEnvironment(const char* env, const char* tunable) {
  if (std::getenv(env) != nullptr) return true;
  const char* t = std::getenv("GLIBC_TUNABLES");
  return t != nullptr && std::strstr(t, tunable) != nullptr;
}
#endif

}  // namespace

bool ApplyMallocPolicy() {
#if defined(__GLIBC__)
  bool ok = true;
  if (!SetByEnvironment("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold")) {
    ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThreshold)) == 1 && ok;
  }
  if (!SetByEnvironment("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold")) {
    ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThreshold)) == 1 && ok;
  }
  return ok;
#else
  return false;
#endif
}

}  // namespace specloop
