// RemoveTree: deletes a file, or a directory with everything under it. Symbolic links are
// removed, never followed. A path that does not exist is not an error.
//
// Not std::filesystem::remove_all: LibTorch's pip wheels (torch 2.11 + CUDA 13 seen) export
// their own copies of the std::filesystem functions from libtorch.so, a binary linked against
// that LibTorch calls those, and remove_all's there jumps to a null pointer (the trainer
// crashed on stop, in ReplayReader's destructor). POSIX nftw does the same work without them.
#pragma once

#include <string>

#include "common/base/status.h"

namespace specloop {

// IOError naming the entry that could not be removed (what was removed before it stays gone).
Status RemoveTree(const std::string& path);

}  // namespace specloop
