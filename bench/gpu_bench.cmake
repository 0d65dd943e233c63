# gpu_bench (issue 48 item 5; bench/gpu_bench.cc): the widened target-6m on a device, plain and
# speculative decoding against the device's memory bandwidth. Included by bench/CMakeLists.txt
# and by cmake/gpu_harness.cmake (scripts/gpu/run.sh builds and runs it on a lent GPU), so it
# links the engine's libraries alone: no RocksDB, ZeroMQ or httplib. In build/bench/ in both.
add_executable(gpu_bench ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
target_link_libraries(gpu_bench PRIVATE specloop_engine ${CMAKE_DL_LIBS})
target_compile_definitions(gpu_bench PRIVATE SPECLOOP_SHARED_DIR="${SPECLOOP_SHARED_DIR}")
set_target_properties(gpu_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
