// io::File (src/io/file.h), the one way the sources read bytes, and the resolver's local side
// (src/source/resolve.h): reads at offsets, short reads at the end and after a truncation (never
// SIGBUS), errors naming the file, slices of a file, what a user's path names.
#include "io/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "source/resolve.h"
#include "support/errors.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

class Files : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("file_test_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A file of `n` bytes, byte i being i % 251.
  std::string write(const std::string& name, std::size_t n) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    for (std::size_t i = 0; i < n; ++i) out.put(static_cast<char>(i % 251));
    return path;
  }
  fs::path dir_;
};

std::string read_string(const io::File& f, std::uint64_t offset, std::size_t n) {
  std::string out(n, '\0');
  out.resize(f.read_at(offset, reinterpret_cast<std::byte*>(out.data()), n));
  return out;
}

std::string expected(std::uint64_t offset, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((offset + i) % 251));
  return out;
}

TEST_F(Files, ALocalFileReadsAtAnyOffsetAndShortAtItsEnd) {
  const std::string path = write("a.bin", 10000);
  for (const bool keep_open : {true, false}) {
    const io::FilePtr f = io::open_local(path, keep_open);
    EXPECT_EQ(f->name(), path);
    EXPECT_EQ(f->size(), 10000u);
    EXPECT_EQ(read_string(*f, 0, 100), expected(0, 100));
    EXPECT_EQ(read_string(*f, 9000, 500), expected(9000, 500));
    EXPECT_EQ(read_string(*f, 9990, 100), expected(9990, 10));  // past its end: short
    EXPECT_EQ(read_string(*f, 20000, 100), "");
    EXPECT_TRUE(f->will_read(0, 10000));  // nothing to fetch ahead
    EXPECT_EQ(f->object(), nullptr);
  }
}

TEST_F(Files, ALocalFileTruncatedUnderItsReaderReadsShortAndReadOnceNamesIt) {
  const std::string path = write("t.bin", 10000);
  const io::FilePtr f = io::open_local(path);
  ASSERT_EQ(::truncate(path.c_str(), 4000), 0);
  EXPECT_EQ(f->size(), 10000u);  // as it was opened
  EXPECT_EQ(read_string(*f, 3900, 500), expected(3900, 100));
  std::vector<std::byte> buf(500);
  const std::string e = error_of([&] { f->read_once(3900, buf.data(), buf.size()); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(Files, OpeningWhatIsNotARegularFileIsAnErrorNamingIt) {
  const std::string missing = (dir_ / "missing.bin").string();
  std::string e = error_of([&] { io::open_local(missing); });
  EXPECT_NE(e.find(missing + ": cannot open"), std::string::npos) << e;
  e = error_of([&] { io::open_local(dir_.string()); });
  EXPECT_NE(e.find(dir_.string()), std::string::npos) << e;
  const std::string fifo = (dir_ / "pipe.tar").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  e = error_of([&] { io::open_local(fifo); });  // returns at once: O_NONBLOCK
  EXPECT_NE(e.find(fifo + ": not a regular file"), std::string::npos) << e;
}

TEST_F(Files, AFileOpenedForEachReadNamesItWhenItIsGone) {
  const std::string path = write("gone.bin", 100);
  const io::FilePtr f = io::open_local(path, false);
  fs::remove(path);
  const std::string e = error_of([&] { read_string(*f, 0, 10); });
  EXPECT_NE(e.find(path + ": cannot open"), std::string::npos) << e;
}

TEST_F(Files, ASliceReadsItsRangeOfAnotherFileOnly) {
  const std::string path = write("tar.bin", 10000);
  const io::FilePtr member = io::slice(io::open_local(path), 1000, 300, path + " member 'x'");
  EXPECT_EQ(member->size(), 300u);
  EXPECT_EQ(member->name(), path + " member 'x'");
  EXPECT_EQ(read_string(*member, 0, 50), expected(1000, 50));
  EXPECT_EQ(read_string(*member, 250, 100), expected(1250, 50));  // not past the member
  EXPECT_EQ(read_string(*member, 300, 10), "");
  const std::string e = error_of([&] { io::slice(io::open_local(path), 9900, 200, "m"); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
}

TEST_F(Files, ThePathKindIsWhatTheNameIsNotWhereItComesFrom) {
  using detail::PathKind;
  EXPECT_EQ(detail::path_kind(dir_.string(), ".tar"), PathKind::directory);
  EXPECT_EQ(detail::path_kind(write("a.tar", 1), ".tar"), PathKind::file);
  EXPECT_EQ(detail::path_kind((dir_ / "not-yet.tar").string(), ".tar"), PathKind::file);
  EXPECT_EQ(detail::path_kind("s3://b/dir/a.tar", ".tar"), PathKind::object);
  EXPECT_EQ(detail::path_kind("s3://b/dir", ".tar"), PathKind::prefix);
  EXPECT_EQ(detail::path_kind("s3://b/dir/", ".tar"), PathKind::prefix);
  EXPECT_EQ(detail::path_kind("https://h/x/shard", ".tar"), PathKind::object);
  EXPECT_EQ(detail::path_kind("http://h/x/", ".tar"), PathKind::object);
}

TEST_F(Files, ADirectorysFilesAreThoseEndingInTheSuffixInNameOrder) {
  write("b.tar", 1);
  write("a.tar", 1);
  write("c.txt", 1);
  fs::create_directories(dir_ / "d.tar");
  const auto files = detail::files_in(dir_.string(), ".tar");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(fs::path(files[0]).filename(), "a.tar");
  EXPECT_EQ(fs::path(files[1]).filename(), "b.tar");
}

}  // namespace
}  // namespace stoker
