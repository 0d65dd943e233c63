// AdamW (Loshchilov & Hutter: Adam with decoupled weight decay) with global gradient-norm
// clipping, over plain LibTorch tensors updated in place. The moments live in memory only: a
// restarted trainer starts them afresh from the checkpoint's weights.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace specloop {
namespace trainer {

struct AdamWOptions {
  double lr = 1e-3;            // Default: 1e-3.
  double beta1 = 0.9;          // Default: 0.9.
  double beta2 = 0.999;        // Default: 0.999.
  double eps = 1e-8;           // Default: 1e-8.
  double weight_decay = 0.0;   // decoupled, on matrices only (not norms). Default: 0.
  double max_grad_norm = 1.0;  // global L2 clip; <= 0 disables. Default: 1.0.
};

class AdamW {
 public:
  // `params`: leaf tensors with requires_grad set; updated in place by Step().
  AdamW(std::vector<at::Tensor> params, const AdamWOptions& options);

  // Clears the gradients.
  void ZeroGrad();
  // Clips the gradients to max_grad_norm (global norm) and takes one step with learning rate
  // lr * lr_scale. Parameters without a gradient are left alone. Returns the norm before
  // clipping.
  double Step(double lr_scale = 1.0);
  int64_t steps() const { return steps_; }
  const AdamWOptions& options() const { return options_; }

 private:
  std::vector<at::Tensor> params_, m_, v_;
  AdamWOptions options_;
  int64_t steps_ = 0;
};

}  // namespace trainer
}  // namespace specloop
