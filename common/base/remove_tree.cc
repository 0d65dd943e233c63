#include "common/base/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace specloop {
namespace {

// Depth first (FTW_DEPTH): a directory is visited after its entries. A nonzero return stops
// the walk and is what nftw returns.
int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}

}  // namespace

Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? Status::OK()
                           : Status::IOError("cannot remove " + path + ": " + std::strerror(errno));
  }
  // FTW_PHYS: links are entries, not followed. 16: open directory handles at most.
  const int err = nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  if (err == 0) return Status::OK();
  return Status::IOError("cannot remove " + path + ": " +
                         std::strerror(err > 0 ? err : errno));
}

}  // namespace specloop
