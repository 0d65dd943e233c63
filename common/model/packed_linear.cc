#include "common/model/packed_linear.h"

#include <algorithm>

#include <ATen/Parallel.h>

namespace specloop {

Status ParseWeightDtype(const std::string& name, at::ScalarType stored, bool cuda,
                        at::ScalarType* out) {
  if (name == "auto") {
    *out = cuda ? stored : at::kFloat;
  } else if (name == "float32") {
    *out = at::kFloat;
  } else if (name == "float16") {
    *out = at::kHalf;
  } else if (name == "bfloat16") {
    *out = at::kBFloat16;
  } else {
    return Status::InvalidArgument("unknown dtype " + name);
  }
  if (*out != at::kFloat && *out != at::kHalf && *out != at::kBFloat16) {
    return Status::NotSupported("weights must be float32, float16 or bfloat16");
  }
  return Status::OK();
}

std::string ShapeString(at::IntArrayRef shape) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}

WeightType WeightTypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return WeightType::kFloat16;
    case at::kBFloat16: return WeightType::kBFloat16;
    default: return WeightType::kFloat32;
  }
}

PackedMatrix PackTensor(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return PackedMatrix(c.data_ptr(), WeightTypeOf(c), c.size(0), c.size(1));
}

void PackedLinear(const float* in, int64_t M, const PackedMatrix& w, float* out, bool add) {
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 16) / (PackedMatrix::kPanel * w.cols()));
  at::parallel_for(0, w.panels(), grain, [&](int64_t b, int64_t e) {
    LinearPacked(in, M, w, out, w.rows(), b, e, add);
  });
}

}  // namespace specloop
