// ApplyMallocPolicy (common/base/malloc_policy.h): a block of kMallocMmapThreshold bytes or more
// is mmapped even after a larger mmapped block was freed, which under glibc's default raises
// the threshold so that the same block would come from the heap. Each case runs in a forked
// child, since the policy is process-wide and cannot be undone; the child without the policy
// is the companion that shows the check can fail.
#include "common/base/malloc_policy.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

namespace specloop {
namespace {

// Whether glibc served `p` (from malloc) by its own mmap: the IS_MMAPPED bit (0x2) of the size
// word before the block, in glibc's chunk layout (mallinfo2's hblkhd reads 0 on this glibc).
bool IsMmapped(const void* p) { return (static_cast<const size_t*>(p)[-1] & 2) != 0; }

// In a fresh child: optionally the policy, then an 8 MiB block (mmapped under any policy)
// touched and freed, then a 1 MiB block. Exit code 10: the 1 MiB block was mmapped; 11: it
// came from the heap; 12: the policy was refused; 13: the 8 MiB block was not mmapped.
int RunChild(bool policy) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (policy && !ApplyMallocPolicy()) _exit(12);
    char* big = static_cast<char*>(std::malloc(size_t{8} << 20));
    std::memset(big, 1, size_t{8} << 20);
    if (!IsMmapped(big)) _exit(13);
    std::free(big);
    char* block = static_cast<char*>(std::malloc(size_t{1} << 20));
    std::memset(block, 1, size_t{1} << 20);
    const bool mmapped = IsMmapped(block);
    std::free(block);
    _exit(mmapped ? 10 : 11);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(MallocPolicy, LargeBlockIsMmappedAfterALargerOneWasFreed) {
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  unsetenv("GLIBC_TUNABLES");
  EXPECT_EQ(RunChild(/*policy=*/true), 10);
}

TEST(MallocPolicy, WithoutItGlibcMovesTheThresholdAndTheBlockComesFromTheHeap) {
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  unsetenv("GLIBC_TUNABLES");
  EXPECT_EQ(RunChild(/*policy=*/false), 11);
}

}  // namespace
}  // namespace specloop
