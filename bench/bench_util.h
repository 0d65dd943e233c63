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

// "a,b,c" -> {"a", "b", "c"} (empty pieces dropped).
inline std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
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
