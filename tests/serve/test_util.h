// Helpers for the serve tests: fixture paths, temporary directories, running commands.
#pragma once

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/temp_dir.h"

namespace specloop {
namespace serve_test {

inline std::string Shared() { return testing::SharedDir(); }
inline std::string TargetDir() { return Shared() + "/models/target-6m"; }
inline std::string DraftDir() { return Shared() + "/models/draft-mix-1m"; }

using testing::TempDir;

// Runs `cmd` through the shell; returns its exit status and its stdout in *out.
inline int RunCommand(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out->append(buf.data(), n);
  const int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Single-quotes `s` for the shell.
inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace serve_test
}  // namespace specloop
