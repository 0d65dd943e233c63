// Host-to-device copies that do not wait for the device. A plain `host.to(cuda)` from pageable
// memory is cudaMemcpyAsync followed by cudaStreamSynchronize: the host waits for every kernel
// queued before it, so a step of many small uploads (a forward's indices, the sampling and
// verification controls) cannot queue its next forward while the device runs the last one.
// These stage the values in pinned memory (LibTorch's caching host allocator, which keeps the
// block until the copy has run) and copy on the current stream without waiting. Elsewhere (the
// CPU) they are plain copies. The host tensor may be changed or freed as soon as they return.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace specloop {
namespace spec {

// A copy of `host` (a CPU tensor, any layout) on `device`, contiguous.
at::Tensor ToDeviceAsync(const at::Tensor& host, at::Device device);

// Copies `host` into `dst` (same shape), a tensor on any device.
void CopyToDeviceAsync(const at::Tensor& dst, const at::Tensor& host);

}  // namespace spec
}  // namespace specloop
