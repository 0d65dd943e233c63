// DeviceGraph: a CUDA graph of a function's device work (at::cuda::CUDAGraph), for forwards
// whose shapes and inputs' addresses stay fixed (LlamaModel's shape-static forward). Compiled
// with CUDA only where LibTorch was built with it (SPECLOOP_CUDA_GRAPHS); elsewhere Supported()
// is false and Capture() throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <ATen/ATen.h>

namespace specloop {

class DeviceGraph {
 public:
  // A memory pool graphs share (at::cuda::graph_pool_handle()): replays must not overlap.
  using Pool = std::pair<uint64_t, uint64_t>;

  // Whether this build can capture graphs at all.
  static bool Supported();
  static Pool NewPool();
  // Runs fn once on a side stream of `device` (lazy initialisations, such as cuBLAS's
  // workspaces, happen there and not in the graph), then captures a second call. fn must not
  // synchronize with the host nor copy from it; the tensors it allocates come from `pool` and
  // stay where they are for every replay. The device work of the capture is not run: Replay()
  // runs it. Throws c10::Error where capture fails (the graph is then dropped).
  static std::unique_ptr<DeviceGraph> Capture(at::Device device, const Pool& pool,
                                              const std::function<void()>& fn);
  ~DeviceGraph();
  // Launches the captured work on the device's current stream.
  void Replay();

 private:
  DeviceGraph();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specloop
