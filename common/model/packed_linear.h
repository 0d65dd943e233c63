// What every model of this folder shares (LlamaModel, Eagle3Head) in loading and in the CPU
// inference forward: weight dtypes, shapes in errors, packing an ATen matrix for the kernels,
// and a threaded product.
#pragma once

#include <string>

#include <ATen/ATen.h>

#include "common/base/status.h"
#include "common/kernels/linear_kernels.h"

namespace specloop {

// The weights' dtype for LoadOptions::dtype `name` ("auto": float32 on the CPU, `stored` on
// CUDA; "float32", "float16", "bfloat16"); anything else is InvalidArgument / NotSupported.
Status ParseWeightDtype(const std::string& name, at::ScalarType stored, bool cuda,
                        at::ScalarType* out);

// "[a, b, ...]", for errors that name a tensor's shape.
std::string ShapeString(at::IntArrayRef shape);

// The kernels' name for a weight tensor's dtype (float32 unless float16 or bfloat16).
WeightType WeightTypeOf(const at::Tensor& t);

// A CPU matrix [rows, cols] of float32, float16 or bfloat16, packed for LinearPacked.
PackedMatrix PackTensor(const at::Tensor& t);

// out [M, O] (+)= in [M, K] times weight [O, K] transposed. The intra-op threads split the
// output panels; a matrix under ~64K weights stays on the calling thread (a fork costs more).
void PackedLinear(const float* in, int64_t M, const PackedMatrix& w, float* out, bool add);

}  // namespace specloop
