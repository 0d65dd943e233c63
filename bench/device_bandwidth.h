// What a memory-bound decode step on a CUDA device is measured against: the device's peak
// memory bandwidth from its memory clock and bus width, and a measured device-to-device copy.
// The peak is read through the CUDA driver API, opened at run time (libcuda.so.1), so this
// builds and links without CUDA headers or libraries (a CPU-only LibTorch included).
// Header-only; LibTorch (ATen) for the copy.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <string>

#include <ATen/ATen.h>

#include "common/base/status.h"

namespace specloop::bench {

struct CudaDeviceInfo {
  std::string name;
  int memory_clock_khz = 0;  // peak memory clock (CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
  int bus_width_bits = 0;    // CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH
  // 2 (double data rate) x clock x bus width / 8, as CUDA's bandwidthTest sample computes it.
  double peak_bytes_per_second() const {
    return 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8.0;
  }
};

// Fills *out for CUDA device `index` (as CUDA_VISIBLE_DEVICES numbers them). NotSupported when
// there is no driver (libcuda.so.1) or it lacks a symbol; IOError when a call fails (its CUresult
// in the message) or an attribute is not positive.
inline Status QueryCudaDevice(int index, CudaDeviceInfo* out) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return Status::NotSupported(std::string("no CUDA driver: ") + (why ? why : "libcuda.so.1"));
  }
  using Init = int (*)(unsigned);
  using DeviceGet = int (*)(int*, int);
  using GetAttribute = int (*)(int*, int, int);
  using GetName = int (*)(char*, int, int);
  const auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  const auto device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
  const auto get_attribute = reinterpret_cast<GetAttribute>(dlsym(lib, "cuDeviceGetAttribute"));
  const auto get_name = reinterpret_cast<GetName>(dlsym(lib, "cuDeviceGetName"));
  if (!init || !device_get || !get_attribute || !get_name) {
    return Status::NotSupported("libcuda.so.1 lacks cuInit / cuDeviceGet / cuDeviceGetAttribute");
  }
  constexpr int kMemoryClockRate = 36, kGlobalMemoryBusWidth = 37;  // CUdevice_attribute
  int device = 0, rc = init(0);
  if (rc == 0) rc = device_get(&device, index);
  char name[256] = {};
  if (rc == 0) rc = get_name(name, sizeof(name), device);
  if (rc == 0) rc = get_attribute(&out->memory_clock_khz, kMemoryClockRate, device);
  if (rc == 0) rc = get_attribute(&out->bus_width_bits, kGlobalMemoryBusWidth, device);
  if (rc != 0) return Status::IOError("CUDA driver call failed: CUresult " + std::to_string(rc));
  out->name = name;
  if (out->memory_clock_khz <= 0 || out->bus_width_bits <= 0) {
    return Status::IOError("CUDA device " + std::to_string(index) +
                           " reports no memory clock or bus width");
  }
  return Status::OK();
}

// Bytes read plus bytes written per second by the fastest of `reps` copies of a `bytes`-sized
// tensor into another on `device` (after one untimed copy). Each copy is timed to a one-element
// read back to the host, which waits for it on the device's stream.
inline double CopyBandwidth(const at::Device& device, int64_t bytes = int64_t{1} << 30,
                            int reps = 10) {
  const at::Tensor src = at::ones({bytes / 4}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor dst = at::empty_like(src);
  dst.copy_(src);
  (void)dst[0].item<float>();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    dst.copy_(src);
    (void)dst[0].item<float>();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(src.numel() * 4) / best;
}

}  // namespace specloop::bench
