// Uploads that do not wait for the device (common/spec/tensor_upload.h): a contiguous copy the
// host tensor no longer reaches, on the CPU and (scripts/gpu/run.sh) on CUDA, where many
// uploads from one host buffer rewritten at once after each must each deliver its own values.
#include "common/spec/tensor_upload.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace specloop {
namespace spec {
namespace {

void ExpectCopies(at::Device device) {
  // A transposed (non-contiguous) host tensor comes back contiguous, with its values.
  const at::Tensor host = at::arange(12, at::kLong).view({3, 4}).t();
  const at::Tensor up = ToDeviceAsync(host, device);
  EXPECT_EQ(up.device(), device);
  EXPECT_TRUE(up.is_contiguous());
  EXPECT_TRUE(at::equal(up.cpu(), host));
  // Changing the host tensor afterwards leaves the copy as it was.
  const at::Tensor want = host.clone();
  host.fill_(-1);
  EXPECT_TRUE(at::equal(up.cpu(), want));

  const at::Tensor dst = at::zeros({4, 3}, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor src = at::arange(12, at::kLong).view({4, 3});
  CopyToDeviceAsync(dst, src);
  src.zero_();
  EXPECT_TRUE(at::equal(dst.cpu(), at::arange(12, at::kLong).view({4, 3})));

  // Uploads queued back to back from one host buffer, rewritten right after each returns.
  at::Tensor buffer = at::empty({1 << 16}, at::kFloat);
  std::vector<at::Tensor> sums;
  for (int i = 0; i < 64; ++i) {
    buffer.fill_(static_cast<float>(i));
    sums.push_back(ToDeviceAsync(buffer, device).sum());
  }
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(sums[i].item<double>(), static_cast<double>(i) * (1 << 16)) << "upload " << i;
  }
}

TEST(TensorUpload, CopiesOnTheCpu) { ExpectCopies(at::Device(at::kCPU)); }

TEST(TensorUpload, CopiesOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  ExpectCopies(at::Device(at::kCUDA, 0));
}

}  // namespace
}  // namespace spec
}  // namespace specloop
