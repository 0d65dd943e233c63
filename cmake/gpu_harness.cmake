# The CUDA checks' build: -DSPECLOOP_GPU_HARNESS=ON (scripts/gpu/run.sh on a lent GPU machine;
# scripts/gpu/README.md). Included by the top-level CMakeLists.txt in place of its folders.
#
# Builds only the engine's libraries, a `specloop` with the engine's commands (generate,
# convert, tokenize) and the test binaries that hold the *OnCuda tests: engine_test,
# spec_engine_test and trainer_test (tests/trainer/CMakeLists.txt gives it the training step
# alone here). Dependencies: LibTorch, nlohmann-json, CLI11, GoogleTest, PCRE2, utf8proc and
# OpenMP; no RocksDB, ZeroMQ, hiredis, OpenSSL, cpp-httplib or sentencepiece. Other targets of
# the folders added here may be defined but are not meant to build (run.sh names its targets).

# common/: the engine's libraries and chat templates (pure C++), lowest layer first
# (common/CMakeLists.txt's order without observe and channel).
foreach(dir base tokenizer chat kernels spec model engine)
  add_subdirectory(common/${dir})
endforeach()

# `specloop` with the commands that need the engine alone; in build/serve/ as in the full build.
add_executable(specloop
  cli/engine_commands_main.cc
  cli/generate_command.cc
  cli/convert_command.cc
  cli/tokenize_command.cc)
# The serving sources `generate` shares with `serve` (request parameters, log-probs), none of
# which needs HTTP; those the tree does not have are not needed by its generate_command.cc.
foreach(src completion_params.cc token_logprobs.cc step_logprobs.cc logprobs_json.cc)
  if(EXISTS ${PROJECT_SOURCE_DIR}/serve/${src})
    target_sources(specloop PRIVATE serve/${src})
  endif()
endforeach()
target_link_libraries(specloop PRIVATE specloop_engine specloop_chat CLI11::CLI11)
set_target_properties(specloop PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/serve)

# gpu_bench (bench/gpu_bench.cmake): the engine's libraries alone; run.sh runs it last.
include(${PROJECT_SOURCE_DIR}/bench/gpu_bench.cmake)

# The test folders that hold the CUDA tests.
foreach(dir common spec trainer)
  add_subdirectory(tests/${dir})
endforeach()
