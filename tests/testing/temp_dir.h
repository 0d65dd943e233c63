// Test helpers shared by every area: temporary directories and the fixture directory.
#pragma once

#include <cstdlib>
#include <string>

#include "common/base/remove_tree.h"

namespace specloop {
namespace testing {

// A fresh directory under $TMPDIR (else /tmp), removed recursively by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "specloop-test") {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
    if (mkdtemp(t.data()) != nullptr) path_ = t;
  }
  ~TempDir() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

#ifdef SPECLOOP_SHARED_DIR
// The shared fixtures: $SPECLOOP_SHARED, else ../shared beside the source tree (the
// SPECLOOP_SHARED_DIR compile definition of every test binary).
inline std::string SharedDir() {
  const char* env = std::getenv("SPECLOOP_SHARED");
  return env && *env ? env : SPECLOOP_SHARED_DIR;
}
#endif

}  // namespace testing
}  // namespace specloop
