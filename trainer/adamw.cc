#include "trainer/adamw.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

namespace specloop {
namespace trainer {

AdamW::AdamW(std::vector<at::Tensor> params, const AdamWOptions& options)
    : params_(std::move(params)), options_(options) {
  for (const at::Tensor& p : params_) {
    m_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  }
}

void AdamW::ZeroGrad() {
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

double AdamW::Step(double lr_scale) {
  at::NoGradGuard no_grad;
  double sq = 0;
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  const double clip = options_.max_grad_norm > 0 && norm > options_.max_grad_norm
                          ? options_.max_grad_norm / (norm + 1e-12)
                          : 1.0;
  ++steps_;
  const double lr = options_.lr * lr_scale;
  const double bc1 = 1 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double bc2 = 1 - std::pow(options_.beta2, static_cast<double>(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad() * clip;
    if (options_.weight_decay > 0 && p.dim() >= 2) p.mul_(1 - lr * options_.weight_decay);
    m_[i].mul_(options_.beta1).add_(g, 1 - options_.beta1);
    v_[i].mul_(options_.beta2).addcmul_(g, g, 1 - options_.beta2);
    at::Tensor denom = (v_[i] / bc2).sqrt_().add_(options_.eps);
    p.addcdiv_(m_[i], denom, -lr / bc1);
  }
  return norm;
}

}  // namespace trainer
}  // namespace specloop
