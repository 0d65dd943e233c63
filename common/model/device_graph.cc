#include "common/model/device_graph.h"

#ifdef SPECLOOP_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace specloop {

#ifdef SPECLOOP_CUDA_GRAPHS

struct DeviceGraph::Impl {
  at::cuda::CUDAGraph graph;
};

bool DeviceGraph::Supported() { return true; }

DeviceGraph::Pool DeviceGraph::NewPool() {
  const auto id = at::cuda::graph_pool_handle();
  return {id.first, id.second};
}

std::unique_ptr<DeviceGraph> DeviceGraph::Capture(at::Device device, const Pool& pool,
                                                  const std::function<void()>& fn) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "a CUDA graph on ", device.str());
  c10::cuda::CUDAGuard device_guard(device);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  // The inputs were written on the current stream.
  c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
  std::unique_ptr<DeviceGraph> g(new DeviceGraph());
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    fn();
    side.synchronize();
    // Thread-local: another thread's CUDA calls (a draft loading beside the scheduler) neither
    // invalidate this capture nor are refused while it runs.
    g->impl_->graph.capture_begin({pool.first, pool.second}, cudaStreamCaptureModeThreadLocal);
    try {
      fn();
    } catch (...) {
      try {
        g->impl_->graph.capture_end();
      } catch (...) {  // the capture was invalidated: the first error is the one to report
      }
      throw;
    }
    g->impl_->graph.capture_end();
  }
  side.synchronize();
  return g;
}

void DeviceGraph::Replay() { impl_->graph.replay(); }

#else  // LibTorch without CUDA

struct DeviceGraph::Impl {};

bool DeviceGraph::Supported() { return false; }

DeviceGraph::Pool DeviceGraph::NewPool() { return {0, 0}; }

std::unique_ptr<DeviceGraph> DeviceGraph::Capture(at::Device device, const Pool&,
                                                  const std::function<void()>&) {
  TORCH_CHECK(false, "CUDA graphs on ", device.str(), ": this build's LibTorch has no CUDA");
}

void DeviceGraph::Replay() { TORCH_CHECK(false, "CUDA graphs: this build's LibTorch has no CUDA"); }

#endif

DeviceGraph::DeviceGraph() : impl_(std::make_unique<Impl>()) {}
DeviceGraph::~DeviceGraph() = default;

}  // namespace specloop
