// Helpers for the fuzz targets in this folder. Each target defines
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// which must never crash, whatever `data` holds. FUZZ_CHECK states a property of the parser
// under test; a violation aborts, so libFuzzer (and the replay) report it like a crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                       \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

namespace specloop {
namespace fuzz {

// The shared fixtures: $SPECLOOP_SHARED, else the SPECLOOP_SHARED_DIR compile definition.
inline std::string SharedDir() {
  const char* env = std::getenv("SPECLOOP_SHARED");
  return env && *env ? env : SPECLOOP_SHARED_DIR;
}

}  // namespace fuzz
}  // namespace specloop
