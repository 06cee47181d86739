// compat::remove_tree (Note [remove_all and libtorch 2.11]): what
// std::filesystem::remove_all does, which ddp may not call.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compat/filesystem_compat.h"

namespace ddp::compat {
namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::string fresh_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ddp-remove-tree-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

TEST(RemoveTree, RemovesANestedTreeAndCountsItsEntries) {
  const std::string root = fresh_dir();
  ASSERT_EQ(::mkdir((root + "/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/a/b").c_str(), 0755), 0);
  std::ofstream(root + "/a/b/f") << "x";
  std::ofstream(root + "/g") << "y";
  std::error_code ec;
  EXPECT_EQ(remove_tree(root, ec), 5u);  // f, b, a, g, root
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(exists(root));
}

TEST(RemoveTree, RemovesALinkNotWhatItPointsTo) {
  const std::string root = fresh_dir(), outside = fresh_dir();
  std::ofstream(outside + "/keep") << "z";
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/link").c_str()), 0);
  EXPECT_EQ(remove_tree(root), 2u);
  EXPECT_FALSE(exists(root));
  EXPECT_TRUE(exists(outside + "/keep"));
  EXPECT_EQ(remove_tree(outside), 2u);
}

TEST(RemoveTree, ALinkToADirectoryGivenAsThePathIsRemovedNotFollowed) {
  const std::string root = fresh_dir(), target = fresh_dir();
  std::ofstream(target + "/keep") << "z";
  const std::string link = root + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_EQ(remove_tree(link), 1u);
  EXPECT_FALSE(exists(link));
  EXPECT_TRUE(exists(target + "/keep"));
  EXPECT_EQ(remove_tree(root), 1u);
  EXPECT_EQ(remove_tree(target), 2u);
}

TEST(RemoveTree, AMissingPathIsNoErrorAndAFileIsRemoved) {
  const std::string root = fresh_dir();
  std::error_code ec;
  EXPECT_EQ(remove_tree(root + "/none", ec), 0u);
  EXPECT_FALSE(ec);
  std::ofstream(root + "/f") << "x";
  EXPECT_EQ(remove_tree(root + "/f"), 1u);
  EXPECT_TRUE(exists(root));
  EXPECT_EQ(remove_tree(root), 1u);
}

TEST(RemoveTree, AnErrorIsReportedWithThePath) {
  const std::string root = fresh_dir();
  std::ofstream(root + "/f") << "x";
  const std::string under_a_file = root + "/f/x";  // ENOTDIR, even for root
  std::error_code ec;
  EXPECT_EQ(remove_tree(under_a_file, ec), 0u);
  EXPECT_EQ(ec, std::errc::not_a_directory) << ec.message();
  try {
    remove_tree(under_a_file);
    FAIL() << "no error for a path under a file";
  } catch (const std::filesystem::filesystem_error& e) {
    EXPECT_NE(std::string(e.what()).find(under_a_file), std::string::npos) << e.what();
  }
  EXPECT_EQ(remove_tree(root), 2u);
}

}  // namespace
}  // namespace ddp::compat
