// Benchmark helpers: JSON lines {"name", "params", "value", "unit"}, medians, model loading.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/llama_model.h"

namespace specloop::bench {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline void Emit(const std::string& name, const nlohmann::json& params, double value,
                 const std::string& unit) {
  std::cout << nlohmann::json{{"name", name}, {"params", params}, {"value", value}, {"unit", unit}}
                   .dump()
            << std::endl;
}

// Loads a model directory or exits with the error: a benchmark has nothing to measure without.
inline std::unique_ptr<LlamaModel> LoadOrDie(const std::string& dir) {
  std::unique_ptr<LlamaModel> m;
  Status s = LlamaModel::Load(dir, LoadOptions(), &m);
  if (!s.ok()) {
    std::cerr << s.ToString() << "\n";
    std::exit(1);
  }
  return m;
}

}  // namespace specloop::bench
