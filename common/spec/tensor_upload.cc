#include "common/spec/tensor_upload.h"

#include <ATen/ATen.h>

namespace specloop {
namespace spec {
namespace {

// `host`'s values in pinned memory, from which a CUDA copy need not wait.
at::Tensor Pinned(const at::Tensor& host) {
  TORCH_CHECK(host.device().is_cpu(), "an upload from ", host.device().str());
  at::Tensor pinned = at::empty(
      host.sizes(), at::TensorOptions().dtype(host.scalar_type()).pinned_memory(true));
  pinned.copy_(host);
  return pinned;
}

}  // namespace

at::Tensor ToDeviceAsync(const at::Tensor& host, at::Device device) {
  if (!device.is_cuda()) {  // one copy, contiguous whatever the host's layout
    return host.to(device, host.scalar_type(), /*non_blocking=*/false, /*copy=*/true,
                   at::MemoryFormat::Contiguous);
  }
  return Pinned(host).to(device, /*non_blocking=*/true);
}

void CopyToDeviceAsync(const at::Tensor& dst, const at::Tensor& host) {
  if (!dst.is_cuda()) {
    dst.copy_(host);
    return;
  }
  dst.copy_(Pinned(host), /*non_blocking=*/true);
}

}  // namespace spec
}  // namespace specloop
