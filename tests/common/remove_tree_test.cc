#include "common/base/remove_tree.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "tests/testing/temp_dir.h"

namespace specloop {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(RemoveTree, RemovesADirectoryAndEverythingUnderItWithoutFollowingLinks) {
  testing::TempDir t;
  const std::string root = t.Sub("tree"), outside = t.Sub("outside");
  ASSERT_EQ(mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((root + "/a").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((root + "/a/b").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((root + "/empty").c_str(), 0755), 0);
  Touch(root + "/f");
  Touch(root + "/a/b/g");
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  Touch(outside + "/kept");
  ASSERT_EQ(symlink(outside.c_str(), (root + "/a/link").c_str()), 0);

  EXPECT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
  EXPECT_TRUE(Exists(outside + "/kept")) << "the link's target was followed";
}

TEST(RemoveTree, RemovesAFileAndTakesAMissingPathAsDone) {
  testing::TempDir t;
  Touch(t.Sub("f"));
  EXPECT_TRUE(RemoveTree(t.Sub("f")).ok());
  EXPECT_FALSE(Exists(t.Sub("f")));
  EXPECT_TRUE(RemoveTree(t.Sub("never-there")).ok());
}

TEST(RemoveTree, AnEntryThatCannotBeRemovedIsAnIoErrorNamingThePath) {
  // /proc's entries refuse removal, to root as well.
  const Status s = RemoveTree("/proc/self/status");
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_NE(s.ToString().find("/proc/self/status"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace specloop
