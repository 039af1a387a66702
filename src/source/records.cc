// Record shards (docs/record_format.md): the writer behind `stoker pack` and the reader, which
// reads through io::File (never a mapping: a shard truncated under it is an error, not SIGBUS).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/remote.h"
#include "source/file_util.h"
#include "source/index_cache.h"
#include "source/record_format.h"
#include "source/resolve.h"
#include "stoker/encoded.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using records::Entry;
using records::Header;

static_assert(std::endian::native == std::endian::little,
              "the record format is little-endian; add byte swaps for this host");

std::uint64_t checksum(const void* data, std::size_t size) { return XXH3_64bits(data, size); }

std::uint64_t header_checksum(const Header& h) {
  return checksum(&h, offsetof(Header, header_checksum));
}

// ---------------------------------------------------------------------------- reading

// A shard as an io::File (a local file read with pread, never mapped: a shard truncated or
// rewritten while a loader has it open is an error naming the file, not SIGBUS; or an object
// read through the object cache's chunks, docs/storage.md), with its header and index.
class ShardFile {
 public:
  explicit ShardFile(io::FilePtr file) : file_(std::move(file)) {}

  // read_at, all `n` bytes or an error naming `what` (built only then).
  template <typename What>
  void read_exactly(std::uint64_t offset, std::size_t n, std::byte* dst, What what) const {
    std::size_t got = 0;
    try {
      got = file_->read_at(offset, dst, n);
    } catch (const std::exception& e) {
      if (!remote()) throw;
      throw std::runtime_error(what() + ": " + e.what());
    }
    if (got < n) {
      throw std::runtime_error(what() + ": the shard was truncated while open (it ends at " +
                               std::to_string(offset + got) + " bytes, " + std::to_string(n) +
                               " bytes were to be read at " + std::to_string(offset) + ")");
    }
  }
  // read_exactly for a shard's header and index, read once (and, in object storage, kept in
  // the index cache): File::read_once (a shard in object storage larger than one chunk is
  // read by exact ranges: its 64-byte header need not cost an 8 MiB chunk, its index the
  // chunks around it; a smaller one through its one chunk, whose GET then serves its records).
  void read_metadata(std::uint64_t offset, std::size_t n, std::byte* dst) const {
    if (!remote()) {
      read_exactly(offset, n, dst, [&] { return path(); });
      return;
    }
    try {
      file_->read_once(offset, dst, n);
    } catch (const std::exception& e) {
      throw std::runtime_error(path() + ": " + e.what());
    }
  }
  // A hint that bytes [offset, offset + n) will be read soon (object storage only).
  bool will_read(std::uint64_t offset, std::size_t n) const { return file_->will_read(offset, n); }

  std::uint64_t size() const { return file_->size(); }
  const std::string& path() const { return file_->name(); }
  const detail::RemoteObject* remote() const { return file_->object(); }
  // The shard's header and index (class list, entries, names), read once when it is opened.
  Header header{};
  std::vector<std::byte> index;

 private:
  io::FilePtr file_;
};

struct Record {
  std::uint64_t offset;  // in its shard
  std::uint64_t length;
  std::int64_t label;
  std::uint64_t checksum;
  std::uint32_t shard;
  std::uint32_t number;  // within its shard
  std::string_view name;
};

[[noreturn]] void corrupt(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": corrupt record shard: " + why);
}

// Reads the shard's header and index into file.header and file.index, checking them (naming
// the file): the magic, the version, the header checksum, that the index lies inside the file,
// its checksum.
void read_index(ShardFile& file) {
  const std::string& path = file.path();
  const std::uint64_t size = file.size();
  if (size < records::kHeaderBytes) {
    corrupt(path, "truncated (" + std::to_string(size) + " bytes, no complete header)");
  }
  Header& h = file.header;
  file.read_metadata(0, sizeof h, reinterpret_cast<std::byte*>(&h));
  if (std::memcmp(h.magic, records::kMagic, sizeof h.magic) != 0) {
    throw std::runtime_error(path + ": not a stoker record shard (bad magic)");
  }
  if (h.version != records::kVersion) {
    throw std::runtime_error(path + ": record format version " + std::to_string(h.version) +
                             " is not supported (this build reads version " +
                             std::to_string(records::kVersion) + ")");
  }
  if (header_checksum(h) != h.header_checksum) corrupt(path, "header checksum mismatch");
  if (h.header_bytes != records::kHeaderBytes) corrupt(path, "unexpected header size");
  if (h.index_offset > size || h.index_bytes > size - h.index_offset) {
    corrupt(path, "truncated (" + std::to_string(size) + " bytes, the index ends at " +
                      std::to_string(h.index_offset + h.index_bytes) + ")");
  }
  file.index.resize(h.index_bytes);
  file.read_metadata(h.index_offset, h.index_bytes, file.index.data());
  if (checksum(file.index.data(), h.index_bytes) != h.index_checksum) {
    corrupt(path, "index checksum mismatch");
  }
}

// ---------------------------------------------------------------------------- index cache

// A record shard in object storage: its header and index kept in the index cache
// (index_cache.h's entries, kind "STKRIX01", keyed by URL, size and ETag; body: the header,
// then the index).
constexpr std::string_view kIndexMagic = "STKRIX01";

std::string index_file(const std::string& dir, const std::string& url) {
  return detail::index_cache_file(dir, url, "rix");
}

detail::IndexKey index_key(const detail::RemoteObject& o) {
  return {o.url, o.size, detail::etag_stamp(o.etag)};
}

bool load_cached_index(const std::string& file, ShardFile& shard) {
  const auto body = detail::load_index_entry(file, kIndexMagic, index_key(*shard.remote()));
  if (!body || body->size() < sizeof(Header)) return false;
  std::memcpy(&shard.header, body->data(), sizeof(Header));
  if (shard.header.index_bytes != body->size() - sizeof(Header)) return false;
  const auto* index = reinterpret_cast<const std::byte*>(body->data()) + sizeof(Header);
  shard.index.assign(index, index + shard.header.index_bytes);
  return true;
}

// Any failure is ignored (the next process reads the index from the object again).
void save_cached_index(const std::string& file, const ShardFile& shard) {
  std::string body(reinterpret_cast<const char*>(&shard.header), sizeof(Header));
  body.append(reinterpret_cast<const char*>(shard.index.data()), shard.index.size());
  detail::save_index_entry(file, kIndexMagic, index_key(*shard.remote()), body);
}

class RecordSource final : public EncodedSource {
 public:
  RecordSource(const std::string& path, const ObjectStorageOptions& remote) {
    const detail::PathKind kind = detail::path_kind(path, records::kShardSuffix);
    if (kind == detail::PathKind::object || kind == detail::PathKind::prefix) {
      open_remote(path, remote, kind == detail::PathKind::prefix);
      return;
    }
    std::vector<std::string> files;
    const bool directory = kind == detail::PathKind::directory;
    if (directory) {
      files = detail::files_in(path, records::kShardSuffix);
      if (files.empty()) throw std::runtime_error(path + ": no record shards (*.stkr)");
    } else {
      files.push_back(path);
    }
    std::vector<std::pair<std::uint32_t, std::uint32_t>> numbers;  // (shard, shards) per file
    for (const auto& f : files) {
      auto file = std::make_unique<ShardFile>(detail::Resolver::open(f));
      read_index(*file);
      numbers.push_back(add_shard(std::move(file)));
    }
    if (directory) check_complete(path, files, numbers);  // a shard given alone is read alone
  }

  std::size_t size() const override { return records_.size(); }
  std::int64_t label(std::size_t index) const override { return records_.at(index).label; }
  std::vector<std::string> classes() const override { return classes_; }
  std::string name(std::size_t index) const override {
    const Record& r = records_.at(index);
    return shards_[r.shard]->path() + " record " + std::to_string(r.number) + " (" +
           std::string(r.name) + ")";
  }

  void read(std::size_t index, EncodedBytes& out) const override {
    const Record& r = records_.at(index);
    out.storage.resize(r.length);  // its capacity reused from read to read
    shards_[r.shard]->read_exactly(r.offset, r.length, out.storage.data(),
                                   [&] { return name(index); });
    if (checksum(out.storage.data(), r.length) != r.checksum) {
      throw std::runtime_error(name(index) + ": checksum mismatch (corrupt record)");
    }
    out.bytes = {out.storage.data(), r.length};
    storage_reads_.add(r.length);
  }

  Counters counters() const override { return storage_reads_.counters(); }
  std::uint64_t ahead_bytes() const override { return files_ ? files_->ahead_bytes() : 0; }

  bool will_read(std::span<const std::size_t> rows) const noexcept override {
    return detail::rows_at_hand(
        rows, static_cast<bool>(files_), records_.size(), [&](std::size_t index) {
          const Record& r = records_[index];
          return shards_[r.shard]->will_read(r.offset, static_cast<std::size_t>(r.length));
        });
  }
  std::vector<ObjectVersion> objects() const override {
    std::vector<ObjectVersion> out;
    for (const auto& s : shards_) {
      if (const detail::RemoteObject* o = s->remote()) out.push_back({o->url, o->size, o->etag});
    }
    return out;
  }
  ObjectStorageCounters object_storage() const override {
    return files_ ? files_->counters() : ObjectStorageCounters{};
  }

 private:
  // Record shards in object storage: an s3:// prefix (every *.stkr directly under it, checked
  // for completeness as a directory is) or one shard's URL, or the shards `o.known_objects`
  // names (as another process resolved `url`: no request). The processes of a node take turns
  // (one listing, each index read once: the others find it in the index cache).
  void open_remote(const std::string& url, const ObjectStorageOptions& o, bool prefix) {
    detail::Resolver resolver(o, "records");
    std::vector<std::unique_ptr<ShardFile>> files;
    for (auto& file : resolver.objects_of(url, records::kShardSuffix)) {
      files.push_back(std::make_unique<ShardFile>(std::move(file)));
    }
    files_ = resolver.remote();
    const std::string& index_dir = resolver.index_dir();
    constexpr std::size_t kIndexThreads = 16;  // shards whose index is read at once
    resolver.index(files.size(), kIndexThreads, [&](std::size_t i) {
      ShardFile& f = *files[i];
      const std::string cached =
          index_dir.empty() ? std::string() : index_file(index_dir, f.path());
      if (!cached.empty() && load_cached_index(cached, f)) return;
      read_index(f);
      if (!cached.empty()) save_cached_index(cached, f);
    });
    std::vector<std::string> names;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> numbers;
    for (auto& f : files) {
      names.push_back(f->path());
      numbers.push_back(add_shard(std::move(f)));
    }
    if (prefix) check_complete(url, names, numbers);
  }

  // A directory's shards, each with the (number, count) its header carries: every shard of
  // the pack must be there (a copy of the pack made in part would lose its records silently).
  // Packs written before the count was recorded (0, 0) are checked by their file names,
  // part-NNNNN.stkr numbered from 0 without gaps.
  static void check_complete(const std::string& dir, const std::vector<std::string>& files,
                             const std::vector<std::pair<std::uint32_t, std::uint32_t>>& numbers) {
    std::vector<std::uint64_t> present;
    std::uint64_t count = 0;
    const bool recorded =
        std::all_of(numbers.begin(), numbers.end(), [](const auto& n) { return n.second != 0; });
    for (std::size_t k = 0; k < files.size(); ++k) {
      if (recorded) {
        if (count != 0 && numbers[k].second != count) {
          throw std::runtime_error(dir + ": its shards come from different packs (" + files[k] +
                                   " is one of " + std::to_string(numbers[k].second) +
                                   ", another one of " + std::to_string(count) + ")");
        }
        count = numbers[k].second;
        present.push_back(numbers[k].first);
      } else {
        unsigned long n = 0;
        const std::string name = fs::path(files[k]).filename().string();
        if (std::sscanf(name.c_str(), "part-%5lu.stkr", &n) != 1) return;  // not named by pack
        present.push_back(n);
        count = std::max<std::uint64_t>(count, n + 1);
      }
    }
    std::string missing;
    std::size_t lost = 0;
    for (std::uint64_t n = 0; n < count; ++n) {
      if (std::find(present.begin(), present.end(), n) != present.end()) continue;
      if (++lost <= 5) {
        char name[32];
        std::snprintf(name, sizeof name, "part-%05llu%s", static_cast<unsigned long long>(n),
                      records::kShardSuffix);
        missing += (missing.empty() ? "" : ", ") + std::string(name);
      }
    }
    if (lost > 0) {
      throw std::runtime_error(dir + ": " + std::to_string(lost) + " of its " +
                               std::to_string(count) + " record shards are missing (" + missing +
                               (lost > 5 ? ", ..." : "") +
                               "): the pack was copied or moved in part?");
    }
  }

  // Parses a shard's index (read and checked by read_index, or from the index cache).
  std::pair<std::uint32_t, std::uint32_t> add_shard(std::unique_ptr<ShardFile> file) {
    const std::string& path = file->path();
    const Header& h = file->header;
    const std::byte* index = file->index.data();
    if (file->index.size() != h.index_bytes || checksum(index, h.index_bytes) != h.index_checksum) {
      corrupt(path, "index checksum mismatch");
    }
    // Index: u32 class count, (u32 length, bytes) per class, the entries, then the names.
    std::size_t at = 0;
    auto take = [&](void* dst, std::size_t n) {
      if (n > h.index_bytes - at) corrupt(path, "index too short");
      std::memcpy(dst, index + at, n);
      at += n;
    };
    std::uint32_t class_count = 0;
    take(&class_count, 4);
    std::vector<std::string> classes;
    for (std::uint32_t c = 0; c < class_count; ++c) {
      std::uint32_t len = 0;
      take(&len, 4);
      if (len > h.index_bytes - at) corrupt(path, "index too short");
      classes.emplace_back(reinterpret_cast<const char*>(index + at), len);
      at += len;
    }
    if (shards_.empty()) {
      classes_ = classes;
    } else if (classes != classes_) {
      throw std::runtime_error(path + ": its class list differs from " + shards_[0]->path());
    }
    if (h.records > (h.index_bytes - at) / records::kEntryBytes) corrupt(path, "index too short");
    const std::size_t names_at = at + h.records * records::kEntryBytes;
    const std::size_t names_bytes = h.index_bytes - names_at;
    const char* names = reinterpret_cast<const char*>(index + names_at);
    const auto shard = static_cast<std::uint32_t>(shards_.size());
    for (std::uint64_t i = 0; i < h.records; ++i) {
      Entry e;
      take(&e, sizeof e);
      if (e.offset < records::kHeaderBytes || e.offset > h.index_offset ||
          e.length > h.index_offset - e.offset) {
        corrupt(path, "record " + std::to_string(i) + " lies outside the data area");
      }
      if (e.name_offset > names_bytes || e.name_length > names_bytes - e.name_offset) {
        corrupt(path, "record " + std::to_string(i) + " has a bad name");
      }
      records_.push_back({e.offset, e.length, e.label, e.checksum, shard,
                          static_cast<std::uint32_t>(i),
                          std::string_view(names + e.name_offset, e.name_length)});
    }
    shards_.push_back(std::move(file));
    return {h.shard, h.shards};
  }

  detail::RemoteHandle files_;  // shards in object storage: their object cache
  std::vector<std::unique_ptr<ShardFile>> shards_;
  std::vector<Record> records_;
  std::vector<std::string> classes_;
  mutable detail::StorageReads storage_reads_;
};

// ---------------------------------------------------------------------------- writing

class ShardWriter {
 public:
  ShardWriter(std::string path, const std::vector<std::string>& classes, std::uint32_t number)
      : path_(std::move(path)), classes_(classes), number_(number) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) detail::throw_errno(path_, "cannot create");
    const std::byte zero[records::kHeaderBytes] = {};
    write(zero, sizeof zero);  // the header is written last, when the index is known
  }
  ~ShardWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  std::uint64_t bytes() const { return offset_; }
  std::size_t records() const { return entries_.size(); }

  void add(std::span<const std::byte> payload, std::int64_t label, const std::string& name) {
    Entry e{};
    e.offset = offset_;
    e.length = payload.size();
    e.label = label;
    e.checksum = checksum(payload.data(), payload.size());
    e.name_offset = static_cast<std::uint32_t>(names_.size());
    e.name_length = static_cast<std::uint32_t>(name.size());
    names_ += name;
    write(payload.data(), payload.size());
    entries_.push_back(e);
  }

  void finish() {
    std::vector<std::byte> index;
    auto put = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      index.insert(index.end(), b, b + n);
    };
    const auto class_count = static_cast<std::uint32_t>(classes_.size());
    put(&class_count, 4);
    for (const auto& c : classes_) {
      const auto len = static_cast<std::uint32_t>(c.size());
      put(&len, 4);
      put(c.data(), c.size());
    }
    for (const auto& e : entries_) put(&e, sizeof e);
    put(names_.data(), names_.size());

    Header h{};
    std::memcpy(h.magic, records::kMagic, sizeof h.magic);
    h.version = records::kVersion;
    h.header_bytes = records::kHeaderBytes;
    h.records = entries_.size();
    h.index_offset = offset_;
    h.index_bytes = index.size();
    h.index_checksum = checksum(index.data(), index.size());
    h.header_checksum = header_checksum(h);
    h.shard = number_;  // the count (h.shards) is set once the pack is complete: set_count()
    write(index.data(), index.size());
    if (::pwrite(fd_, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
      detail::throw_errno(path_, "cannot write the header");
    }
    if (::fsync(fd_) != 0) detail::throw_errno(path_, "cannot sync");
    if (::close(fd_) != 0) {
      fd_ = -1;
      detail::throw_errno(path_, "cannot close");
    }
    fd_ = -1;
  }

 private:
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        detail::throw_errno(path_, "cannot write");
      }
      p += w;
      n -= static_cast<std::size_t>(w);
      offset_ += static_cast<std::uint64_t>(w);
    }
  }

  std::string path_;
  const std::vector<std::string>& classes_;
  const std::uint32_t number_;
  int fd_ = -1;
  std::uint64_t offset_ = 0;
  std::vector<Entry> entries_;
  std::string names_;
};

// Writes the pack's shard count into a finished shard's header (outside the header checksum,
// like the shard's number) and syncs it.
void set_count(const std::string& path, std::uint32_t shards) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) detail::throw_errno(path, "cannot open");
  const bool ok = ::pwrite(fd, &shards, sizeof shards, offsetof(Header, shards)) ==
                      static_cast<ssize_t>(sizeof shards) &&
                  ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (!ok) detail::throw_errno(path, "cannot write the shard count");
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// ".<name><suffix>-<pid>", built by appending (GCC 12 warns falsely on chained operator+).
std::string hidden_name(const fs::path& target, const std::string& suffix) {
  std::string name = ".";
  name.append(target.filename().string());
  name.append(suffix);
  name.append("-");
  name.append(std::to_string(::getpid()));
  return name;
}

}  // namespace

std::shared_ptr<EncodedSource> open_records(const std::string& path,
                                            const ObjectStorageOptions& remote) {
  return std::make_shared<RecordSource>(path, remote);
}

PackResult pack_records(const EncodedSource& source, const std::string& dest,
                        const PackOptions& options) {
  const fs::path target = fs::absolute(fs::path(dest)).lexically_normal();
  std::error_code ec;
  if (fs::exists(target, ec) && !options.overwrite) {
    throw std::runtime_error(
        dest + ": already exists (to replace it: stoker pack --force, or PackOptions::overwrite)");
  }
  const fs::path parent = target.parent_path();
  fs::create_directories(parent, ec);
  // A temporary directory beside the target: same file system, so the final rename is atomic.
  std::random_device rd;
  const fs::path tmp = parent / hidden_name(target, ".tmp-" + std::to_string(rd()));
  if (!fs::create_directory(tmp, ec)) {
    throw std::runtime_error(tmp.string() + ": cannot create: " + ec.message());
  }
  PackResult result;
  try {
    const auto classes = source.classes();
    result.classes = classes.size();
    const auto shard_name = [&](std::size_t n) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "part-%05zu%s", n, records::kShardSuffix);
      return (tmp / buf).string();
    };
    auto writer = std::make_unique<ShardWriter>(shard_name(0), classes, 0);
    EncodedBytes bytes;
    const std::size_t total = source.size();
    for (std::size_t i = 0; i < total; ++i) {
      source.read(i, bytes);
      if (writer->records() > 0 && writer->bytes() + bytes.bytes.size() > options.shard_bytes) {
        writer->finish();
        ++result.shards;
        writer = std::make_unique<ShardWriter>(shard_name(result.shards), classes,
                                               static_cast<std::uint32_t>(result.shards));
      }
      writer->add(bytes.bytes, source.label(i), source.name(i));
      ++result.records;
      result.bytes += bytes.bytes.size();
      if (options.progress) options.progress(i + 1, total, result.bytes);
    }
    writer->finish();
    ++result.shards;
    for (std::size_t n = 0; n < result.shards; ++n) {
      set_count(shard_name(n), static_cast<std::uint32_t>(result.shards));
    }
    sync_directory(tmp);
    if (fs::exists(target, ec)) {
      // overwrite: move the old pack aside first, so dest is never half old, half new.
      const fs::path old = parent / hidden_name(target, ".old");
      fs::rename(target, old);
      fs::rename(tmp, target);
      fs::remove_all(old, ec);
    } else {
      fs::rename(tmp, target);
    }
    sync_directory(parent);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return result;
}

PackResult pack_image_folder(const std::string& src, const std::string& dest,
                             const PackOptions& options) {
  const fs::path from = fs::weakly_canonical(fs::absolute(src));
  const fs::path to = fs::weakly_canonical(fs::absolute(dest));
  if (std::mismatch(to.begin(), to.end(), from.begin(), from.end()).first == to.end()) {
    throw std::runtime_error(dest + ": is or contains the image folder being packed (" + src +
                             "); choose another destination");
  }
  return pack_records(*open_image_folder(src), dest, options);
}

}  // namespace stoker
