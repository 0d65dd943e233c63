# Sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh).
#
#   -DSPECLOOP_SANITIZE=address,undefined   AddressSanitizer + UndefinedBehaviorSanitizer
#   -DSPECLOOP_SANITIZE=thread              ThreadSanitizer
#   -DSPECLOOP_FUZZ=ON                      libFuzzer fuzzers in tests/fuzz (clang only); adds
#                                           coverage instrumentation and, unless SPECLOOP_SANITIZE
#                                           says otherwise, address,undefined
#
# The flags apply to everything built in that build folder. Prebuilt libraries (LibTorch,
# RocksDB, libzmq) are not instrumented: ASan and UBSan work beside them, TSan may report
# races inside them (scripts/tsan.supp). Sanitizer errors abort the test (no recovery).
set(SPECLOOP_SANITIZE "" CACHE STRING "sanitizers: address,undefined | thread | empty")
option(SPECLOOP_FUZZ "build tests/fuzz as libFuzzer fuzzers (clang only)" OFF)

if(SPECLOOP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SPECLOOP_FUZZ needs clang (-DCMAKE_CXX_COMPILER=clang++)")
  endif()
  if(NOT SPECLOOP_SANITIZE)
    set(SPECLOOP_SANITIZE "address,undefined")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(SPECLOOP_SANITIZE)
  add_compile_options(-fsanitize=${SPECLOOP_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${SPECLOOP_SANITIZE})
endif()
