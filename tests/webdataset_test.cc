// The tar indexer (ustar, GNU long names, pax, damaged files) and WebDataset over it.
#include "stoker/webdataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "image_fixtures.h"
#include "source/tar_index.h"
#include "support/errors.h"
#include "support/read_sample.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using detail::index_tar_file;
using detail::TarMember;
using testing::TempDir;

// A tar written member by member, as tar and Python's tarfile write them.
class TarWriter {
 public:
  enum class Names { ustar, gnu, pax };

  // A member; names longer than 100 bytes go into the ustar prefix, a GNU 'L' record or a pax
  // 'x' header, as `names` says.
  void add(const std::string& name, const std::string& data, char type = '0',
           Names names = Names::ustar) {
    std::string header_name = name;
    std::string prefix;
    if (name.size() > 100) {
      if (names == Names::gnu) {
        add_raw("././@LongLink", name + '\0', 'L', "", true);
        header_name = name.substr(0, 100);
      } else if (names == Names::pax) {
        add_raw("PaxHeaders/x", pax_record("path", name), 'x', "", false);
        header_name = name.substr(0, 100);
      } else {
        const std::size_t slash = name.rfind('/', 155);
        prefix = name.substr(0, slash);
        header_name = name.substr(slash + 1);
      }
    }
    add_raw(header_name, data, type, prefix, names == Names::gnu);
  }
  void pax_global(const std::string& key, const std::string& value) {
    add_raw("pax_global_header", pax_record(key, value), 'g', "", false);
  }
  std::string finish() {
    bytes_.append(1024, '\0');
    return bytes_;
  }
  std::size_t size() const { return bytes_.size(); }

  static std::string pax_record(const std::string& key, const std::string& value) {
    const std::string body = " " + key + "=" + value + "\n";
    std::size_t len = body.size() + 1;
    while (std::to_string(len).size() + body.size() != len) ++len;
    return std::to_string(len) + body;
  }

 private:
  void add_raw(const std::string& name, const std::string& data, char type,
               const std::string& prefix, bool gnu) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<std::size_t>(name.size(), 100));
    std::snprintf(h + 100, 8, "%07o", 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
    std::snprintf(h + 136, 12, "%011o", 0);
    h[156] = type;
    if (gnu) {
      std::memcpy(h + 257, "ustar  ", 8);
    } else {
      std::memcpy(h + 257, "ustar", 6);
      std::memcpy(h + 263, "00", 2);
      std::memcpy(h + 345, prefix.data(), std::min<std::size_t>(prefix.size(), 155));
    }
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    bytes_.append(h, 512);
    bytes_ += data;
    bytes_.append((512 - data.size() % 512) % 512, '\0');
  }

  std::string bytes_;
};

void write(const fs::path& p, const std::string& s) {
  testing::write_file(
      p, std::vector<std::byte>(reinterpret_cast<const std::byte*>(s.data()),
                                reinterpret_cast<const std::byte*>(s.data()) + s.size()));
}

std::string read_member(const fs::path& tar, const TarMember& m) {
  const auto all = testing::read_file(tar);
  return std::string(reinterpret_cast<const char*>(all.data()) + m.offset, m.size);
}

TEST(TarIndex, UstarMembersWithTheirOffsetsAndSizes) {
  TempDir dir;
  TarWriter t;
  t.add("a/", "", '5');  // a directory: left out
  t.add("a/0001.jpg", std::string(700, 'j'));
  t.add("a/0001.cls", "3");
  t.add("a/link", "", '2');  // a symlink: left out
  t.add("empty.txt", "");
  t.add("old-dir/", "", '\0');  // a v7 directory: type '\0', a trailing slash
  write(dir / "s.tar", t.finish());
  const auto members = index_tar_file((dir / "s.tar").string());
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].name, "a/0001.jpg");
  EXPECT_EQ(members[0].size, 700u);
  EXPECT_EQ(read_member(dir / "s.tar", members[0]), std::string(700, 'j'));
  EXPECT_EQ(members[1].name, "a/0001.cls");
  EXPECT_EQ(read_member(dir / "s.tar", members[1]), "3");
  EXPECT_EQ(members[2].name, "empty.txt");
  EXPECT_EQ(members[2].size, 0u);
}

TEST(TarIndex, LongNamesUstarPrefixGnuAndPax) {
  TempDir dir;
  const std::string deep = std::string(90, 'd') + "/" + std::string(80, 'e') + "/key.jpg";
  const std::string deeper = std::string(120, 'x') + "/" + std::string(40, 'y') + ".cls";
  const std::string paxed = std::string(150, 'p') + "/k.v.npy";
  TarWriter t;
  t.add(deep, "one", '0', TarWriter::Names::ustar);
  t.add(deeper, "two", '0', TarWriter::Names::gnu);
  t.add(paxed, "three", '0', TarWriter::Names::pax);
  t.add("short.txt", "four");  // no extended header left over from the ones before
  write(dir / "s.tar", t.finish());
  const auto members = index_tar_file((dir / "s.tar").string());
  ASSERT_EQ(members.size(), 4u);
  EXPECT_EQ(members[0].name, deep);
  EXPECT_EQ(members[1].name, deeper);
  EXPECT_EQ(members[2].name, paxed);
  EXPECT_EQ(members[3].name, "short.txt");
  EXPECT_EQ(read_member(dir / "s.tar", members[1]), "two");
  EXPECT_EQ(read_member(dir / "s.tar", members[2]), "three");
  EXPECT_EQ(read_member(dir / "s.tar", members[3]), "four");
}

TEST(TarIndex, PaxSizeOverridesTheHeaderAndGlobalHeadersAreNotMembers) {
  TempDir dir;
  TarWriter t;
  t.pax_global("comment", "made by a test");
  t.add("a.txt", "12345");
  write(dir / "s.tar", t.finish());
  const auto members = index_tar_file((dir / "s.tar").string());
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].name, "a.txt");
  EXPECT_EQ(read_member(dir / "s.tar", members[0]), "12345");
}

TEST(TarIndex, TruncatedShardsAreRefusedWithTheFileNamed) {
  TempDir dir;
  TarWriter t;
  t.add("k1.jpg", std::string(3000, 'a'));
  t.add("k1.cls", "1");
  const std::string whole = t.finish();
  const std::string path = (dir / "cut.tar").string();
  // Inside the first member's data, inside the second header, at a member boundary (no
  // end-of-archive marker), and empty.
  for (std::size_t cut :
       {std::size_t{1000}, std::size_t{3584 + 100}, std::size_t{3584 + 1024}, std::size_t{0}}) {
    write(path, whole.substr(0, cut));
    const std::string e = error_of([&] { index_tar_file(path); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("empty") != std::string::npos)
        << cut << ": " << e;
  }
  write(path, whole);
  EXPECT_EQ(index_tar_file(path).size(), 2u);
}

TEST(TarIndex, BadChecksumIsCorruptNamingTheOffset) {
  TempDir dir;
  TarWriter t;
  t.add("k1.jpg", std::string(600, 'a'));
  t.add("k1.cls", "1");
  std::string bytes = t.finish();
  bytes[1536 + 10] ^= 1;  // the second member's header (after 512 + 1024)
  const std::string path = (dir / "bad.tar").string();
  write(path, bytes);
  const std::string e = error_of([&] { index_tar_file(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  EXPECT_NE(e.find("byte 1536"), std::string::npos) << e;
  EXPECT_NE(e.find("k1.jpg"), std::string::npos) << e;  // the member before it

  write(path, std::string("\x1f\x8b\x08") + std::string(2000, '\0'));
  EXPECT_NE(error_of([&] { index_tar_file(path); }).find("gzip"), std::string::npos);
  write(path, std::string(2000, 'z'));
  EXPECT_NE(error_of([&] { index_tar_file(path); }).find("not a tar"), std::string::npos);
}

// ---------------------------------------------------------------------------- WebDataset

std::string npy_f32(const std::vector<float>& v) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(v.size()) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  return out;
}

using testing::read_sample;

std::int64_t as_i64(const std::vector<std::byte>& b) {
  std::int64_t v = 0;
  std::memcpy(&v, b.data(), 8);
  return v;
}

WebDatasetOptions options(const fs::path& dir, std::vector<std::string> fields) {
  WebDatasetOptions o;
  o.shards = {dir.string()};
  o.fields = std::move(fields);
  o.transform = ImageTransform::val(32, 32);
  o.storage.index_cache_dir = (dir / "index-cache").string();
  return o;
}

TEST(WebDataset, GroupsByKeyWithDottedDirectoriesAndReadsFields) {
  TempDir dir;
  TarWriter t;
  const auto jpeg = testing::make_jpeg(40, 30);
  const std::string jpg(reinterpret_cast<const char*>(jpeg.data()), jpeg.size());
  t.add("v1.0/train/0001.JPG", jpg);  // field names match lower-case
  t.add("v1.0/train/0001.cls", " 7\n");
  t.add("v1.0/train/0001.feat.npy", npy_f32({1, 2, 3}));
  t.add("README", "no key: left out");
  t.add("v1.0/train/0002.jpg", jpg);
  t.add("v1.0/train/0002.cls", "-2");
  t.add("v1.0/train/0002.feat.npy", npy_f32({4, 5, 6}));
  write(dir / "a-000.tar", t.finish());
  TarWriter u;
  u.add("0003.png", "not really a png");
  u.add("0003.cls", "x");
  u.add("0004.cls", "4");
  write(dir / "a-001.tar", u.finish());

  WebDataset d(options(dir.path(), {"cls", "feat.npy"}));
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d.key(0), "v1.0/train/0001");
  EXPECT_EQ(d.key(3), "0004");
  const auto fields = d.fields();
  ASSERT_EQ(fields.size(), 2u);
  EXPECT_EQ(fields[0].dtype, DType::i64);
  EXPECT_EQ(fields[1].dtype, DType::f32);
  EXPECT_EQ(fields[1].shape, (std::vector<std::int64_t>{3}));
  auto r = read_sample(d, 1);
  EXPECT_EQ(as_i64(r.fields[0]), -2);
  float f[3];
  std::memcpy(f, r.fields[1].data(), 12);
  EXPECT_EQ(f[2], 6.0f);
  r = read_sample(d, 0);
  EXPECT_EQ(as_i64(r.fields[0]), 7);
  // A missing field names shard, key and what the sample has.
  std::string e = error_of([&] { read_sample(d, 3); });
  EXPECT_NE(e.find("a-001.tar key '0004'"), std::string::npos) << e;
  EXPECT_NE(e.find("no field 'feat.npy'"), std::string::npos) << e;
  // A label that is not an integer.
  WebDataset labels(options(dir.path(), {"cls"}));
  e = error_of([&] { read_sample(labels, 2); });
  EXPECT_NE(e.find("a-001.tar key '0003'"), std::string::npos) << e;
  EXPECT_NE(e.find("not an integer"), std::string::npos) << e;

  // Images, alternatives: jpg or png; the png does not decode: named.
  WebDataset images(options(dir.path(), {"jpg;png", "cls"}));
  EXPECT_EQ(images.fields()[0].shape, (std::vector<std::int64_t>{3, 32, 32}));
  r = read_sample(images, 0);
  EXPECT_EQ(as_i64(r.fields[1]), 7);
  e = error_of([&] { read_sample(images, 2); });
  EXPECT_NE(e.find("key '0003': field 'jpg;png'"), std::string::npos) << e;
}

TEST(WebDataset, TheRamCacheCountsAsResidentBytes) {
  TempDir dir;
  TarWriter t;
  for (const char* key : {"k0", "k1", "k2", "k3"}) t.add(std::string(key) + ".cls", key + 1);
  write(dir / "a.tar", t.finish());
  WebDatasetOptions o = options(dir.path(), {"cls"});
  EXPECT_EQ(WebDataset(o).resident_bytes(), 0u);
  o.cache_bytes = 1 << 20;
  WebDataset d(o);
  EXPECT_EQ(d.resident_bytes(), 0u);
  for (std::size_t i = 0; i < d.size(); ++i) read_sample(d, i);
  EXPECT_GT(d.resident_bytes(), 0u);  // the loader's memory cap counts it (memory_cache)
  EXPECT_EQ(d.resident_bytes(), d.source()->counters().cached_bytes);
}

TEST(WebDataset, IndexIsCachedByPathSizeAndMtime) {
  TempDir dir;
  TarWriter t;
  t.add("k1.cls", "1");
  t.add("k2.cls", "2");
  write(dir / "s.tar", t.finish());
  {
    WebDataset d(options(dir.path(), {"cls"}));
    EXPECT_EQ(d.indexes_from_cache(), 0u);
  }
  {
    WebDataset d(options(dir.path(), {"cls"}));
    EXPECT_EQ(d.indexes_from_cache(), 1u);
    EXPECT_EQ(d.size(), 2u);
  }
  TarWriter u;  // a different shard at the same path: indexed again
  u.add("k1.cls", "1");
  u.add("k2.cls", "2");
  u.add("k3.cls", "3");
  write(dir / "s.tar", u.finish());
  {
    WebDataset d(options(dir.path(), {"cls"}));
    EXPECT_EQ(d.indexes_from_cache(), 0u);
    EXPECT_EQ(d.size(), 3u);
  }
  // A cache that cannot be written does not fail the load.
  auto o = options(dir.path(), {"cls"});
  write(dir / "not-a-dir", "x");
  o.storage.index_cache_dir = (dir / "not-a-dir" / "cache").string();
  WebDataset d(o);
  EXPECT_EQ(d.size(), 3u);
}

TEST(WebDataset, ShardTruncatedAfterIndexingIsAnErrorNamingIt) {
  TempDir dir;
  TarWriter t;
  t.add("k1.cls", "1");
  t.add("k2.npy", npy_f32(std::vector<float>(1000, 1.0f)));
  const std::string whole = t.finish();
  write(dir / "s.tar", whole);
  WebDataset d(options(dir.path(), {"npy"}));
  fs::resize_file(dir / "s.tar", 1500);
  const std::string e = error_of([&] { read_sample(d, 1); });
  EXPECT_NE(e.find("s.tar key 'k2'"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(WebDataset, UnsupportedFieldsAndCompressedShardsAreClearErrors) {
  TempDir dir;
  TarWriter t;
  t.add("k1.json", "{}");
  write(dir / "s.tar", t.finish());
  std::string e = error_of([&] { WebDataset d(options(dir.path(), {"json"})); });
  EXPECT_NE(e.find("'json' is not supported"), std::string::npos) << e;
  TarWriter empty;
  empty.add("k1.npy", npy_f32({}));
  write(dir / "s.tar", empty.finish());
  e = error_of([&] { WebDataset d(options(dir.path(), {"npy"})); });
  EXPECT_NE(e.find("s.tar key 'k1': field 'npy': an empty array"), std::string::npos) << e;
  write(dir / "z.tar.gz", "\x1f\x8b");
  auto o = options(dir.path(), {"cls"});
  o.shards = {(dir / "z.tar.gz").string()};
  e = error_of([&] { WebDataset d(o); });
  EXPECT_NE(e.find("compressed"), std::string::npos) << e;
}

}  // namespace
}  // namespace stoker
