# specloop_test(NAME LABEL area [TIMEOUT s] [SERIAL] SOURCES a.cc ... LIBS lib ...)
# One gtest binary per source area; every test case is registered with ctest and carries the
# area's LABEL so `ctest -L area` runs that area alone.
include(GoogleTest)
find_package(GTest REQUIRED)

function(specloop_test name)
  cmake_parse_arguments(T "SERIAL" "LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LABEL)
    message(FATAL_ERROR "specloop_test(${name}) needs a LABEL")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  # specloop_base: tests/testing/temp_dir.h removes its directory with RemoveTree.
  target_link_libraries(${name} PRIVATE ${T_LIBS} specloop_base GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    SPECLOOP_SHARED_DIR="${SPECLOOP_SHARED_DIR}"
    SPECLOOP_BINARY="$<TARGET_FILE:specloop>")
  # SERIAL: the test compares timings, which another test on the same cores would skew.
  set(serial FALSE)
  if(T_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT} RUN_SERIAL ${serial})
endfunction()
