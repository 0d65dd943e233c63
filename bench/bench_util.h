// Benchmark output: JSON lines {"name", "params", "value", "unit"}, and medians.
#pragma once

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

}  // namespace specloop::bench
