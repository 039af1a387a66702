// The corrupt-data corpus (corrupt_corpus.h) through decode_image, the image folder, record
// shards and the Loader: every bad file fails naming itself and the reason; under the skip
// policy an epoch still has every row and the batches' skipped lists name exactly the bad
// files; the odd but valid files decode.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "corrupt_corpus.h"
#include "source/record_format.h"
#include "stoker/encoded.h"
#include "stoker/image.h"
#include "stoker/loader.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::CorpusFile;
using testing::TempDir;

std::vector<std::byte> decode(const fs::path& path, const ImageTransform& t) {
  const auto data = testing::read_file(path);
  std::vector<std::byte> out(t.output_bytes());
  decode_image(data, path.string(), t, 0, out);
  return out;
}

std::string decode_error(const fs::path& path, const ImageTransform& t) {
  try {
    decode(path, t);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

LoaderOptions image_loader(const fs::path& root, ErrorPolicy policy, std::size_t workers) {
  ImageDatasetOptions io;
  io.source = open_image_folder(root.string());
  io.transform = ImageTransform::val(40, 32);
  LoaderOptions o;
  o.dataset = std::make_shared<ImageDataset>(io);
  o.batch_size = 4;
  o.workers = workers;
  o.on_error = policy;
  return o;
}

TEST(CorruptCorpus, EveryBadFileFailsNamingItselfAndTheReason) {
  TempDir dir;
  const auto corpus = testing::make_corrupt_corpus(dir.path());
  for (const auto& t : {ImageTransform::val(40, 32), ImageTransform::train(24)}) {
    for (const CorpusFile& f : corpus) {
      const std::string error = decode_error(f.path, t);
      if (!f.bad) {
        EXPECT_EQ(error, "") << f.path;
        continue;
      }
      EXPECT_EQ(error.rfind(f.path.string() + ": ", 0), 0u) << error;  // starts with the path
      EXPECT_NE(error.find(f.reason), std::string::npos) << f.path << ": " << error;
    }
  }
}

TEST(CorruptCorpus, RaiseNamesTheFileThroughTheLoader) {
  TempDir dir;
  const auto corpus = testing::make_corrupt_corpus(dir.path());
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    if (!corpus[i].bad) continue;
    // A folder with a good file and this bad one: the bad one is sample 1.
    TempDir one;
    fs::create_directories(one.path() / "x");
    fs::copy_file(corpus[0].path, one.path() / "x" / "a.jpg");
    const auto bad = one.path() / "x" / ("b_" + corpus[i].path.filename().string());
    fs::copy_file(corpus[i].path, bad);
    Loader loader(image_loader(one.path(), ErrorPolicy::raise, 0));
    try {
      while (loader.next()) {
      }
      ADD_FAILURE() << corpus[i].path << " raised nothing";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.index(), 1u);
      const std::string what = e.what();
      EXPECT_NE(what.find(bad.string()), std::string::npos) << what;
      EXPECT_NE(what.find(corpus[i].reason), std::string::npos) << what;
    }
  }
}

TEST(CorruptCorpus, SkipFinishesTheEpochAndNamesExactlyTheBadFiles) {
  TempDir dir;
  const auto corpus = testing::make_corrupt_corpus(dir.path());
  std::set<std::size_t> bad;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    if (corpus[i].bad) bad.insert(i);
  }
  for (std::size_t workers : {0u, 3u}) {
    Loader loader(image_loader(dir.path(), ErrorPolicy::skip, workers));
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      std::size_t rows = 0;
      std::map<std::size_t, std::string> skipped;
      std::set<std::size_t> delivered;
      while (auto b = loader.next()) {
        rows += b->size();
        for (const auto& s : b->skipped()) skipped[s.index] = s.reason;
        for (std::size_t i : b->indices()) delivered.insert(i);
      }
      EXPECT_EQ(rows, corpus.size()) << "workers " << workers;
      std::set<std::size_t> named;
      for (const auto& [index, reason] : skipped) {
        named.insert(index);
        EXPECT_NE(reason.find(corpus[index].path.string()), std::string::npos) << reason;
        EXPECT_NE(reason.find(corpus[index].reason), std::string::npos) << reason;
      }
      EXPECT_EQ(named, bad) << "workers " << workers;
      for (std::size_t i : delivered) EXPECT_FALSE(bad.count(i)) << "bad sample " << i << " kept";
      // The loader's report: each bad file once (replacements that failed too included),
      // named by its path, with its reason; the same after the second epoch.
      std::set<std::size_t> reported;
      for (const auto& s : loader.skipped_samples()) {
        EXPECT_TRUE(reported.insert(s.index).second) << "sample " << s.index << " twice";
        EXPECT_EQ(s.name, corpus[s.index].path.string());
        EXPECT_NE(s.reason.find(corpus[s.index].reason), std::string::npos) << s.reason;
      }
      EXPECT_EQ(reported, bad) << "workers " << workers;
      EXPECT_EQ(loader.stats().bad_samples, bad.size());
      EXPECT_GE(loader.stats().skipped, bad.size() * (epoch + 1));
    }
  }
}

TEST(CorruptCorpus, OddButValidImagesDecodeAsTheirPlainTwins) {
  TempDir dir;
  const auto corpus = testing::make_corrupt_corpus(dir.path());
  auto find = [&](const std::string& suffix) {
    for (const auto& f : corpus) {
      const auto name = f.path.filename().string();
      if (name.size() >= suffix.size() && name.ends_with(suffix)) return f.path;
    }
    throw std::runtime_error("no " + suffix);
  };
  const auto val = ImageTransform::val(40, 32);
  auto u8 = val;
  u8.dtype = DType::u8;
  u8.layout = ImageLayout::hwc;
  const auto plain = decode(find("_good.jpg"), u8);
  // EXIF orientation is not applied, as torchvision's PIL loader does not apply it.
  EXPECT_EQ(decode(find("exif_rotated.jpg"), u8), plain);
  // A JPEG missing only its end marker has all its rows.
  EXPECT_EQ(decode(find("no_end_marker.jpg"), u8), plain);
  // A 1x1 image resizes to its one color.
  const auto one = decode(find("one_pixel.jpg"), u8);
  for (std::size_t i = 0; i < one.size(); i += 3) {
    EXPECT_NEAR(static_cast<int>(one[i]), 200, 3);
    EXPECT_NEAR(static_cast<int>(one[i + 1]), 100, 3);
    EXPECT_NEAR(static_cast<int>(one[i + 2]), 50, 3);
  }
  // Gray comes out as equal R, G and B.
  const auto gray = decode(find("gray.jpg"), u8);
  for (std::size_t i = 0; i < gray.size(); i += 3) {
    ASSERT_EQ(gray[i], gray[i + 1]);
    ASSERT_EQ(gray[i], gray[i + 2]);
  }
  // The rest decode (tests/image/test_pillow.py and test_odd_images.py compare with Pillow).
  for (const char* name : {"cmyk.jpg", "progressive.jpg", "wide.jpg", "png_named.jpg"}) {
    EXPECT_NO_THROW(decode(find(name), val)) << name;
    EXPECT_NO_THROW(decode(find(name), ImageTransform::train(24))) << name;
  }
}

// ------------------------------------------------------------------------------ records

struct Shard {
  fs::path path;
  std::vector<std::byte> bytes;
  records::Header header;
  std::vector<records::Entry> entries;
};

Shard pack_good_images(const TempDir& dir, int count) {
  for (int i = 0; i < count; ++i) {
    testing::write_file(dir.path() / "images" / "x" / ("img" + std::to_string(i) + ".jpg"),
                        testing::make_jpeg(64, 48, 3, static_cast<std::uint32_t>(i + 1)));
  }
  pack_records(*open_image_folder((dir.path() / "images").string()),
               (dir.path() / "packed").string());
  Shard s;
  s.path = dir.path() / "packed" / "part-00000.stkr";
  s.bytes = testing::read_file(s.path);
  std::memcpy(&s.header, s.bytes.data(), sizeof s.header);
  std::uint32_t classes = 0;
  std::memcpy(&classes, s.bytes.data() + s.header.index_offset, 4);
  std::size_t at = s.header.index_offset + 4;
  for (std::uint32_t c = 0; c < classes; ++c) {
    std::uint32_t len = 0;
    std::memcpy(&len, s.bytes.data() + at, 4);
    at += 4 + len;
  }
  s.entries.resize(s.header.records);
  std::memcpy(s.entries.data(), s.bytes.data() + at, s.entries.size() * sizeof(records::Entry));
  return s;
}

// Reads one epoch of `o` with on_error=skip: the rows handed out and each skipped sample's
// reason by index.
std::pair<std::size_t, std::map<std::size_t, std::string>> read_skipping(LoaderOptions o) {
  o.on_error = ErrorPolicy::skip;
  Loader loader(o);
  std::size_t rows = 0;
  std::map<std::size_t, std::string> skipped;
  while (auto b = loader.next()) {
    rows += b->size();
    for (const auto& sk : b->skipped()) skipped[sk.index] = sk.reason;
  }
  return {rows, skipped};
}

std::string open_error(const fs::path& path) {
  try {
    open_records(path.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(CorruptCorpus, AShardTruncatedMidRecordIsRefusedAtOpen) {
  TempDir dir;
  const Shard s = pack_good_images(dir, 4);
  const auto& e = s.entries[2];
  testing::write_file(
      s.path,
      {s.bytes.begin(), s.bytes.begin() + static_cast<std::ptrdiff_t>(e.offset + e.length / 2)});
  const std::string error = open_error(s.path);
  EXPECT_EQ(error.rfind(s.path.string() + ": corrupt record shard: truncated", 0), 0u) << error;
}

TEST(CorruptCorpus, AShardOfAFutureVersionIsRefusedAtOpen) {
  TempDir dir;
  Shard s = pack_good_images(dir, 2);
  s.header.version = records::kVersion + 1;  // a well-formed shard of a later format
  s.header.header_checksum = XXH3_64bits(&s.header, offsetof(records::Header, header_checksum));
  std::memcpy(s.bytes.data(), &s.header, sizeof s.header);
  testing::write_file(s.path, s.bytes);
  const std::string error = open_error(s.path);
  EXPECT_NE(error.find(s.path.string() + ": record format version " +
                       std::to_string(records::kVersion + 1) + " is not supported"),
            std::string::npos)
      << error;
}

TEST(CorruptCorpus, ARecordWithABadChecksumIsNamedAndSkipped) {
  TempDir dir;
  Shard s = pack_good_images(dir, 10);
  const std::set<std::size_t> bad{3, 7};
  for (std::size_t r : bad) {
    s.bytes[s.entries[r].offset + s.entries[r].length / 2] ^= std::byte{0x5A};
  }
  testing::write_file(s.path, s.bytes);

  ImageDatasetOptions io;
  io.source = open_records((dir.path() / "packed").string());
  io.transform = ImageTransform::val(40, 32);
  LoaderOptions o;
  o.dataset = std::make_shared<ImageDataset>(io);
  o.batch_size = 3;
  o.workers = 2;
  o.on_error = ErrorPolicy::raise;
  {
    Loader loader(o);
    try {
      while (loader.next()) {
      }
      FAIL() << "no error raised";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.index(), 3u);
      const std::string what = e.what();
      EXPECT_NE(what.find("part-00000.stkr record 3 ("), std::string::npos) << what;
      EXPECT_NE(what.find("img3.jpg"), std::string::npos) << what;  // the record's name
      EXPECT_NE(what.find("checksum mismatch"), std::string::npos) << what;
    }
  }
  const auto [rows, skipped] = read_skipping(o);
  EXPECT_EQ(rows, 10u);
  std::set<std::size_t> named;
  for (const auto& [index, reason] : skipped) {
    named.insert(index);
    EXPECT_NE(reason.find("checksum mismatch"), std::string::npos) << reason;
  }
  EXPECT_EQ(named, bad);
}

// A shard truncated (a copy that is overwritten, a disk that fills) or rewritten while a loader
// has it open: the records it no longer holds are errors naming shard and record, skipped with
// on_error=skip; the rest are read. Mapped, the process would die of SIGBUS.
TEST(CorruptCorpus, AShardTruncatedWhileOpenIsAnErrorNotSigbus) {
  TempDir dir;
  Shard s = pack_good_images(dir, 10);
  ImageDatasetOptions io;
  io.source = open_records((dir.path() / "packed").string());
  io.transform = ImageTransform::val(40, 32);
  const auto& cut = s.entries[6];
  fs::resize_file(s.path, cut.offset + cut.length / 2);  // records 6.. are gone or cut short

  LoaderOptions o;
  o.dataset = std::make_shared<ImageDataset>(io);
  o.batch_size = 3;
  o.workers = 2;
  const auto [rows, skipped] = read_skipping(o);
  EXPECT_EQ(rows, 10u);  // the epoch completes
  std::set<std::size_t> named;
  for (const auto& [index, reason] : skipped) {
    named.insert(index);
    EXPECT_NE(reason.find("part-00000.stkr record " + std::to_string(index)), std::string::npos)
        << reason;
    EXPECT_NE(reason.find("truncated while open"), std::string::npos) << reason;
  }
  EXPECT_EQ(named, (std::set<std::size_t>{6, 7, 8, 9}));

  // Rewritten in place (same size, other bytes): the records' checksums tell.
  TempDir other;
  Shard t = pack_good_images(other, 4);
  auto source = open_records(t.path.string());
  for (auto& byte : t.bytes) byte ^= std::byte{0xFF};
  testing::write_file(t.path, t.bytes);
  EncodedBytes out;
  EXPECT_THROW(source->read(1, out), std::runtime_error);
}

}  // namespace
}  // namespace stoker
