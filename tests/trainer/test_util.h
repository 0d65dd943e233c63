// Helpers for the trainer tests: temporary directories and the shared fixture directory.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace specloop {
namespace testing {

// A fresh directory under $TMPDIR, removed (recursively) by the destructor.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/specloop-trainer-test-XXXXXX";
    if (mkdtemp(t.data()) != nullptr) path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string SharedDir() {
  const char* env = std::getenv("SPECLOOP_SHARED");
  return env && *env ? env : SPECLOOP_SHARED_DIR;
}

}  // namespace testing
}  // namespace specloop
