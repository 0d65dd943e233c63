// Fixed (p, q) pairs over small vocabularies shared by the chain and multi-draft tests.
#pragma once

#include <string>
#include <vector>

namespace specloop {
namespace spec_test {

struct DistCase {
  std::string name;
  std::vector<float> p;  // [vocab] target
  std::vector<float> q;  // [vocab] draft
};

// The cases every verifier is tested on.
inline std::vector<DistCase> BaseCases() {
  return {
      {"v2", {0.7f, 0.3f}, {0.2f, 0.8f}},
      {"mixed_v5", {0.35f, 0.25f, 0.2f, 0.15f, 0.05f}, {0.1f, 0.4f, 0.1f, 0.3f, 0.1f}},
      {"disjoint_v4", {0.6f, 0.4f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.5f, 0.5f}},
      {"equal_v3", {0.5f, 0.3f, 0.2f}, {0.5f, 0.3f, 0.2f}},
      // q puts its mass where p is small.
      {"q_on_p_tail_v8",
       {0.4f, 0.25f, 0.15f, 0.1f, 0.05f, 0.03f, 0.015f, 0.005f},
       {0.01f, 0.01f, 0.02f, 0.06f, 0.1f, 0.2f, 0.3f, 0.3f}},
      // q is 0 where p is positive and positive where p is 0.
      {"zeros_v6", {0.3f, 0.0f, 0.3f, 0.2f, 0.0f, 0.2f}, {0.0f, 0.3f, 0.4f, 0.1f, 0.2f, 0.0f}},
  };
}

// BaseCases() and one where q has fewer tokens than most n.
inline std::vector<DistCase> MultiDraftCases() {
  std::vector<DistCase> cases = BaseCases();
  cases.push_back(
      {"narrow_q_v6", {0.1f, 0.2f, 0.3f, 0.1f, 0.2f, 0.1f}, {0.7f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f}});
  return cases;
}

}  // namespace spec_test
}  // namespace specloop
