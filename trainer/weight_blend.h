// Blends of the live draft's and a candidate's weights (WiSE-FT-style interpolation: Wortsman
// et al., "Robust fine-tuning of zero-shot models"): theta = live + lambda * (candidate - live).
// A candidate the gate refused only for holding a domain below its best ("below_best",
// publish_gate.h) keeps part of what it learnt at a blend nearer the live draft, which holds
// that domain. The trainer tries a few lambdas in order and publishes the first blend its gate
// accepts (TrainerOptions::below_best_blends, trainer/README.md "No forgetting").
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "common/base/status.h"

namespace specloop {
namespace trainer {

// Sets each tensor of *out, in place and outside autograd, to
// live[i] + lambda * (candidate[i] - live[i]) (lambda 0: the live weights, 1: the candidate's).
// *out may alias `candidate` only if the caller no longer needs the candidate's values (the
// trainer passes a copy). InvalidArgument when the lists differ in length, or a tensor in shape
// or dtype, or lambda is not finite; *out is then unchanged.
Status BlendWeights(const std::vector<at::Tensor>& live, const std::vector<at::Tensor>& candidate,
                    double lambda, std::vector<at::Tensor>* out);

// Asks `accepts` about each lambda in order and stops at the first it accepts: *chosen is its
// index, -1 when none was accepted (every lambda asked). An error from `accepts` stops the
// search and is returned (*chosen -1).
Status FirstAcceptedBlend(const std::vector<double>& lambdas,
                          const std::function<Status(double lambda, bool* accepted)>& accepts,
                          int* chosen);

}  // namespace trainer
}  // namespace specloop
