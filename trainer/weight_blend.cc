#include "trainer/weight_blend.h"

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <string>

namespace specloop {
namespace trainer {

Status BlendWeights(const std::vector<at::Tensor>& live, const std::vector<at::Tensor>& candidate,
                    double lambda, std::vector<at::Tensor>* out) {
  if (!std::isfinite(lambda)) return Status::InvalidArgument("blend: lambda is not finite");
  if (live.size() != candidate.size() || live.size() != out->size()) {
    return Status::InvalidArgument("blend: " + std::to_string(live.size()) + " live, " +
                                   std::to_string(candidate.size()) + " candidate and " +
                                   std::to_string(out->size()) + " output tensors");
  }
  for (size_t i = 0; i < live.size(); ++i) {
    const at::Tensor& o = (*out)[i];
    if (!live[i].sizes().equals(candidate[i].sizes()) || !live[i].sizes().equals(o.sizes()) ||
        live[i].scalar_type() != candidate[i].scalar_type() ||
        live[i].scalar_type() != o.scalar_type()) {
      return Status::InvalidArgument("blend: tensor " + std::to_string(i) +
                                     " differs in shape or dtype between the drafts");
    }
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live.size(); ++i) {
    const at::Tensor l = live[i].detach().to((*out)[i].device());
    const at::Tensor c = candidate[i].detach().to((*out)[i].device());
    (*out)[i].detach().copy_(l + (c - l) * lambda);
  }
  return Status::OK();
}

Status FirstAcceptedBlend(const std::vector<double>& lambdas,
                          const std::function<Status(double, bool*)>& accepts, int* chosen) {
  *chosen = -1;
  for (size_t i = 0; i < lambdas.size(); ++i) {
    bool accepted = false;
    SPECLOOP_RETURN_IF_ERROR(accepts(lambdas[i], &accepted));
    if (accepted) {
      *chosen = static_cast<int>(i);
      return Status::OK();
    }
  }
  return Status::OK();
}

}  // namespace trainer
}  // namespace specloop
