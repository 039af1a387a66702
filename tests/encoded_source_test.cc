// Encoded sources (image folder, record shards, RAM cache) and ImageDataset through the Loader.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "image_fixtures.h"
#include "source/image_folder.h"
#include "source/record_format.h"
#include "stoker/encoded.h"
#include "stoker/image.h"
#include "stoker/loader.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// root/<class>/... with small JPEGs; returns the files in ImageFolder order.
std::vector<fs::path> make_folder(const fs::path& root, int per_class = 3) {
  std::vector<fs::path> files;
  std::uint32_t seed = 1;
  for (const char* cls : {"ant", "bee", "cat"}) {
    for (int i = 0; i < per_class; ++i) {
      const auto p = root / cls / ("img" + std::to_string(i) + ".jpg");
      testing::write_file(p, testing::make_jpeg(64 + 8 * i, 48 + 4 * i, 3, seed++));
      files.push_back(p);
    }
  }
  return files;
}

std::vector<std::byte> read_all(const EncodedSource& s, std::size_t i) {
  EncodedBytes b;
  s.read(i, b);
  return {b.bytes.begin(), b.bytes.end()};
}

TEST(ImageFolder, OrderLabelsAndExtensionsFollowTorchvision) {
  TempDir dir;
  const auto root = dir.path();
  testing::write_file(root / "b_class" / "z.JPEG", {std::byte{1}});
  testing::write_file(root / "b_class" / "a.png", {std::byte{2}});
  testing::write_file(root / "b_class" / "notes.txt", {std::byte{3}});      // not an image
  testing::write_file(root / "b_class" / "sub" / "m.jpg", {std::byte{4}});  // nested: walked
  testing::write_file(root / "a_class" / "x.jpeg", {std::byte{5}});
  testing::write_file(root / "stray.jpg", {std::byte{6}});  // not in a class folder
  fs::create_directories(root / "c_empty" / "sub");
  testing::write_file(root / "c_empty" / "sub" / "notes.txt", {std::byte{7}});
  // A class folder without images: torchvision refuses it (a label no sample has).
  try {
    open_image_folder(root.string());
    FAIL() << "a class folder without images";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("found no valid file for the classes c_empty ("),
              std::string::npos)
        << e.what();
  }
  testing::write_file(root / "c_empty" / "sub" / "y.png", {std::byte{7}});

  auto src = open_image_folder(root.string());
  EXPECT_EQ(src->classes(), (std::vector<std::string>{"a_class", "b_class", "c_empty"}));
  ASSERT_EQ(src->size(), 5u);
  fs::remove_all(root / "c_empty");
  src = open_image_folder(root.string());
  EXPECT_EQ(src->classes(), (std::vector<std::string>{"a_class", "b_class"}));
  ASSERT_EQ(src->size(), 4u);
  // sorted(os.walk(...)): b_class's own files (sorted) before those of b_class/sub.
  EXPECT_EQ(src->name(0), (root / "a_class" / "x.jpeg").string());
  EXPECT_EQ(src->name(1), (root / "b_class" / "a.png").string());
  EXPECT_EQ(src->name(2), (root / "b_class" / "z.JPEG").string());
  EXPECT_EQ(src->name(3), (root / "b_class" / "sub" / "m.jpg").string());
  EXPECT_EQ(src->label(0), 0);
  EXPECT_EQ(src->label(3), 1);
  EXPECT_EQ(read_all(*src, 3), std::vector<std::byte>{std::byte{4}});
  EXPECT_EQ(src->counters().storage_reads, 1u);

  EXPECT_THROW(open_image_folder((root / "missing").string()), std::runtime_error);
  fs::remove(root / "b_class" / "sub" / "m.jpg");
  fs::remove(root / "a_class" / "x.jpeg");
  try {
    src->read(0, *std::make_unique<EncodedBytes>());
    FAIL() << "read of a removed file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("x.jpeg: cannot open"), std::string::npos) << e.what();
  }
}

// The layout of a folder given as keys (an s3:// listing), in any order: the rules of the test
// above, with folder markers ("b/") and directories that sort between a class's files.
TEST(ImageFolder, LayoutFromKeysFollowsTorchvision) {
  const std::vector<std::string_view> keys = {
      "b/sub/m.jpg", "stray.jpg", "b/z.JPEG",      "b/notes.txt", "a/x.jpeg",
      "b/",          "b/a.png",   "b/sub-x/k.png", "c/sub/",      "b/sub/deep/n.jpg"};
  detail::FolderLayout layout = detail::image_folder_layout(keys);
  EXPECT_EQ(layout.classes, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(layout.empty, "c");  // only a folder marker: torchvision refuses it
  // a/x.jpeg; then b's own files, b/sub, b/sub-x ('-' sorts before '/'), b/sub/deep.
  std::vector<std::string_view> order;
  for (std::size_t i : layout.images) order.push_back(keys[i]);
  EXPECT_EQ(order, (std::vector<std::string_view>{"a/x.jpeg", "b/a.png", "b/z.JPEG", "b/sub/m.jpg",
                                                  "b/sub-x/k.png", "b/sub/deep/n.jpg"}));
  EXPECT_EQ(layout.labels, (std::vector<std::int64_t>{0, 1, 1, 1, 1, 1}));
  EXPECT_TRUE(detail::image_folder_layout({"x.jpg", "y/"}).images.empty());
  EXPECT_TRUE(detail::has_image_extension("A.WebP"));
  EXPECT_FALSE(detail::has_image_extension("a.jpg.txt"));
}

TEST(ImageFolder, ANamedPipeIsRefusedNotWaitedOn) {
  // A FIFO named like an image (no writer): reading it must fail at once, not wait for one.
  TempDir dir;
  testing::write_file(dir.path() / "c" / "a.jpg", {std::byte{1}});
  ASSERT_EQ(::mkfifo((dir.path() / "c" / "b.jpg").c_str(), 0600), 0);
  auto src = open_image_folder(dir.path().string());
  ASSERT_EQ(src->size(), 2u);
  try {
    src->read(1, *std::make_unique<EncodedBytes>());
    FAIL() << "read a FIFO";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("b.jpg: not a regular file"), std::string::npos)
        << e.what();
  }
}

TEST(Records, PackRoundTripsByteForByte) {
  TempDir dir;
  make_folder(dir / "images", 4);
  auto folder = open_image_folder((dir / "images").string());
  PackOptions o;
  o.shard_bytes = 2000;  // several shards
  std::size_t last_done = 0;
  o.progress = [&](std::size_t done, std::size_t total, std::uint64_t) {
    EXPECT_EQ(done, last_done + 1);
    EXPECT_EQ(total, folder->size());
    last_done = done;
  };
  const auto r = pack_records(*folder, (dir / "packed").string(), o);
  EXPECT_EQ(r.records, folder->size());
  EXPECT_GT(r.shards, 1u);
  EXPECT_EQ(last_done, folder->size());
  // Nothing but the shards is left behind: no temporary directory.
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2u);

  auto rec = open_records((dir / "packed").string());
  ASSERT_EQ(rec->size(), folder->size());
  EXPECT_EQ(rec->classes(), folder->classes());
  for (std::size_t i = 0; i < rec->size(); ++i) {
    EXPECT_EQ(read_all(*rec, i), read_all(*folder, i)) << i;
    EXPECT_EQ(rec->label(i), folder->label(i));
    EXPECT_NE(rec->name(i).find(folder->name(i)), std::string::npos);
  }
  // An existing destination is refused unless overwriting.
  EXPECT_THROW(pack_records(*folder, (dir / "packed").string()), std::runtime_error);
  o.overwrite = true;
  o.shard_bytes = std::uint64_t{1} << 30;
  last_done = 0;
  EXPECT_EQ(pack_records(*folder, (dir / "packed").string(), o).shards, 1u);
  EXPECT_EQ(open_records((dir / "packed").string())->size(), folder->size());
}

fs::path one_shard(const TempDir& dir) {
  make_folder(dir / "images", 2);
  auto folder = open_image_folder((dir / "images").string());
  pack_records(*folder, (dir / "packed").string());
  return dir / "packed" / "part-00000.stkr";
}

std::string open_error(const fs::path& p) {
  try {
    open_records(p.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Records, TruncatedOrCorruptShardsAreRefusedWithTheReason) {
  TempDir dir;
  const auto shard = one_shard(dir);
  const auto bytes = testing::read_file(shard);

  auto truncated = bytes;
  truncated.resize(bytes.size() - 10);
  testing::write_file(shard, truncated);
  EXPECT_NE(open_error(shard).find(shard.string() + ": corrupt record shard: truncated"),
            std::string::npos)
      << open_error(shard);

  testing::write_file(shard, std::vector<std::byte>(bytes.begin(), bytes.begin() + 20));
  EXPECT_NE(open_error(shard).find("no complete header"), std::string::npos);

  auto bad_magic = bytes;
  bad_magic[0] = std::byte{'X'};
  testing::write_file(shard, bad_magic);
  EXPECT_NE(open_error(shard).find("not a stoker record shard"), std::string::npos);

  auto bad_index = bytes;
  bad_index[bytes.size() - 5] ^= std::byte{0x40};  // inside the name block of the index
  testing::write_file(shard, bad_index);
  EXPECT_NE(open_error(shard).find("index checksum mismatch"), std::string::npos);

  auto bad_version = bytes;
  bad_version[8] = std::byte{9};
  testing::write_file(shard, bad_version);
  EXPECT_NE(open_error(shard).find("version 9 is not supported"), std::string::npos);
}

TEST(Records, APackWithAShardMissingIsRefusedNamingIt) {
  TempDir dir;
  make_folder(dir / "images", 6);
  PackOptions o;
  o.shard_bytes = 2000;  // several shards
  const auto packed = dir / "packed";
  const auto r = pack_records(*open_image_folder((dir / "images").string()), packed.string(), o);
  ASSERT_GE(r.shards, 3u);
  const auto shard = [&](std::size_t n) {
    char name[32];
    std::snprintf(name, sizeof name, "part-%05zu.stkr", n);
    return packed / name;
  };
  // Each header carries its shard's number and the pack's count.
  for (std::size_t n = 0; n < r.shards; ++n) {
    records::Header h;
    const auto bytes = testing::read_file(shard(n));
    std::memcpy(&h, bytes.data(), sizeof h);
    EXPECT_EQ(h.shard, n);
    EXPECT_EQ(h.shards, r.shards);
  }
  const auto middle = testing::read_file(shard(1));
  const auto last = testing::read_file(shard(r.shards - 1));
  fs::remove(shard(1));
  EXPECT_NE(open_error(packed).find(": 1 of its " + std::to_string(r.shards) +
                                    " record shards are missing (part-00001.stkr)"),
            std::string::npos)
      << open_error(packed);
  testing::write_file(shard(1), middle);
  fs::remove(shard(r.shards - 1));  // the last one: only the count tells
  EXPECT_NE(open_error(packed).find("record shards are missing"), std::string::npos)
      << open_error(packed);
  testing::write_file(shard(r.shards - 1), last);
  EXPECT_EQ(open_records(packed.string())->size(), r.records);
  // One shard opened alone is read alone.
  EXPECT_GT(open_records(shard(1).string())->size(), 0u);

  // A pack written before the count was recorded: a gap in the shards' names still tells.
  for (std::size_t n = 0; n < r.shards; ++n) {
    auto bytes = testing::read_file(shard(n));
    std::memset(bytes.data() + offsetof(records::Header, shard), 0, 8);
    testing::write_file(shard(n), bytes);
  }
  EXPECT_EQ(open_records(packed.string())->size(), r.records);
  fs::remove(shard(1));
  EXPECT_NE(open_error(packed).find("missing (part-00001.stkr)"), std::string::npos)
      << open_error(packed);
}

TEST(Records, ACorruptRecordFailsItsReadOnly) {
  TempDir dir;
  const auto shard = one_shard(dir);
  auto bytes = testing::read_file(shard);
  // Record 1's payload starts right after record 0's; flip a byte in the middle of record 1.
  records::Header h;
  std::memcpy(&h, bytes.data(), sizeof h);
  std::uint32_t classes = 0;
  std::memcpy(&classes, bytes.data() + h.index_offset, 4);
  std::size_t at = h.index_offset + 4;
  for (std::uint32_t c = 0; c < classes; ++c) {
    std::uint32_t len = 0;
    std::memcpy(&len, bytes.data() + at, 4);
    at += 4 + len;
  }
  records::Entry e1;
  std::memcpy(&e1, bytes.data() + at + records::kEntryBytes, sizeof e1);
  bytes[e1.offset + e1.length / 2] ^= std::byte{0xFF};
  testing::write_file(shard, bytes);

  auto rec = open_records(shard.string());
  EXPECT_NO_THROW(read_all(*rec, 0));
  try {
    read_all(*rec, 1);
    FAIL() << "corrupt record read";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("part-00000.stkr record 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
  }
}

TEST(RamCache, LaterEpochsNeverTouchStorageAndTheBudgetHolds) {
  TempDir dir;
  make_folder(dir / "images", 4);
  auto folder = open_image_folder((dir / "images").string());
  auto cached = cache_in_ram(folder, 64 << 20);
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (std::size_t i = 0; i < cached->size(); ++i) {
      EXPECT_EQ(read_all(*cached, i), read_all(*folder, i));
    }
  }
  const auto c = cached->counters();
  EXPECT_EQ(c.reads, 3 * cached->size());
  EXPECT_EQ(c.storage_reads, cached->size());  // the first epoch only
  EXPECT_EQ(c.cached, cached->size());

  // A budget for about half of the bytes: what fits is kept, the rest reads through.
  const std::size_t half = c.cached_bytes / 2;
  auto small = cache_in_ram(folder, half);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (std::size_t i = 0; i < small->size(); ++i) {
      EXPECT_EQ(read_all(*small, i), read_all(*folder, i));
    }
  }
  const auto s = small->counters();
  EXPECT_LE(s.cached_bytes, half);
  EXPECT_GT(s.cached, 0u);
  EXPECT_LT(s.cached, small->size());
  EXPECT_EQ(s.storage_reads, small->size() + (small->size() - s.cached));
}

TEST(RamCache, ConcurrentFirstReadsAreSafe) {
  TempDir dir;
  make_folder(dir / "images", 5);
  auto folder = open_image_folder((dir / "images").string());
  auto cached = cache_in_ram(folder, 64 << 20);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 3; ++round) {
        for (std::size_t i = 0; i < cached->size(); ++i) {
          if (read_all(*cached, i) != read_all(*folder, i)) ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(cached->counters().cached, cached->size());
}

// ---------------------------------------------------------------- through the loader

std::vector<std::vector<std::byte>> all_batches(std::shared_ptr<const Dataset> ds,
                                                std::size_t workers, std::size_t epochs = 1) {
  LoaderOptions o;
  o.dataset = std::move(ds);
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 3;
  o.workers = workers;
  Loader loader(o);
  std::vector<std::vector<std::byte>> out;
  for (std::size_t e = 0; e < epochs; ++e) {
    while (auto b = loader.next()) {
      for (std::size_t f = 0; f < 2; ++f) out.emplace_back(b->bytes(f).begin(), b->bytes(f).end());
    }
  }
  return out;
}

TEST(ImageDataset, OutputDoesNotDependOnWorkersOrSource) {
  TempDir dir;
  make_folder(dir / "images", 4);
  auto folder = open_image_folder((dir / "images").string());
  pack_records(*folder, (dir / "packed").string());
  ImageDatasetOptions o;
  o.source = folder;
  o.transform = ImageTransform::train(32);
  auto ds = std::make_shared<ImageDataset>(o);
  EXPECT_EQ(ds->fields()[0].shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(ds->fields()[0].dtype, DType::f32);
  const auto inline_read = all_batches(ds, 0, 2);
  EXPECT_EQ(all_batches(ds, 1, 2), inline_read);
  EXPECT_EQ(all_batches(ds, 3, 2), inline_read);
  o.source = open_records((dir / "packed").string());
  EXPECT_EQ(all_batches(std::make_shared<ImageDataset>(o), 2, 2), inline_read);
  o.source = cache_in_ram(folder, 1 << 20);
  EXPECT_EQ(all_batches(std::make_shared<ImageDataset>(o), 2, 2), inline_read);
  // Labels: each sample's class.
  std::set<std::int64_t> labels;
  for (std::size_t i = 1; i < inline_read.size(); i += 2) {
    std::int64_t l[4];
    std::memcpy(l, inline_read[i].data(), sizeof l);
    labels.insert(l, l + 4);
  }
  EXPECT_EQ(labels, (std::set<std::int64_t>{0, 1, 2}));
}

TEST(ImageDataset, SkipPolicyReportsBadFilesAndTrainingGoesOn) {
  TempDir dir;
  const auto files = make_folder(dir / "images", 4);
  testing::write_file(files[1], {});                                         // empty
  testing::write_file(files[5], std::vector<std::byte>(500, std::byte{7}));  // not an image
  auto jpeg = testing::read_file(files[9]);
  jpeg.resize(jpeg.size() / 2);
  testing::write_file(files[9], jpeg);  // truncated
  ImageDatasetOptions io;
  io.source = open_image_folder((dir / "images").string());
  io.transform = ImageTransform::val(40, 32);
  LoaderOptions o;
  o.dataset = std::make_shared<ImageDataset>(io);
  o.batch_size = 4;
  o.on_error = ErrorPolicy::skip;
  Loader loader(o);
  std::map<std::size_t, std::string> skipped;
  std::size_t rows = 0;
  while (auto b = loader.next()) {
    rows += b->size();
    for (const auto& s : b->skipped()) skipped[s.index] = s.reason;
  }
  EXPECT_EQ(rows, 12u);
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_NE(skipped[1].find(files[1].string() + ": empty file"), std::string::npos) << skipped[1];
  EXPECT_NE(skipped[5].find(files[5].string() + ": not an image"), std::string::npos);
  EXPECT_NE(skipped[9].find(files[9].string() + ": truncated JPEG"), std::string::npos)
      << skipped[9];

  // With the raise policy the same file stops its batch with a SampleError naming it.
  o.on_error = ErrorPolicy::raise;
  Loader raising(o);
  try {
    while (raising.next()) {
    }
    FAIL() << "no error raised";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 1u);
    EXPECT_NE(std::string(e.what()).find(files[1].string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stoker
