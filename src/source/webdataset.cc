// WebDataset tar shards: the index of each shard (cached on disk), the samples grouped from it
// as the `webdataset` package groups them, their bytes read with pread, and the data set that
// decodes them into the batch.
#include "stoker/webdataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "io/file.h"
#include "io/object_store.h"
#include "io/remote.h"
#include "source/file_util.h"
#include "source/index_cache.h"
#include "source/resolve.h"
#include "source/tar_index.h"
#include "stoker/frontend/log.h"
#include "stoker/frontend/shuffle_choice.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using detail::TarMember;

constexpr std::uint64_t kMissing = std::numeric_limits<std::uint64_t>::max();

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool ends_with(std::string_view s, std::string_view end) {
  return s.size() >= end.size() && s.substr(s.size() - end.size()) == end;
}

// ---------------------------------------------------------------------------- keys

// webdataset's base_plus_ext: re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", path), the key its
// group 1 and the field its group 2. Returns the key's length (the field starts one past it),
// or nullopt where the regular expression does not match (the member has no key).
std::optional<std::size_t> key_length(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  const std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const std::size_t dot = path.find('.', base);
  if (dot == std::string_view::npos) return std::nullopt;  // no dot in the base name
  if (dot > base) return dot;                              // the usual case
  // The base name starts with a dot: the key is the path up to the last slash, which matches
  // when the directory component before that slash has no dot ([^.]+ may span slashes).
  if (slash == std::string_view::npos) return std::nullopt;
  const std::size_t prev = slash == 0 ? std::string_view::npos : path.rfind('/', slash - 1);
  const std::size_t from = prev == std::string_view::npos ? 0 : prev + 1;
  if (path.substr(from, slash - from).find('.') != std::string_view::npos) return std::nullopt;
  return slash + 1;
}

// webdataset's tar_file_iterator skips "__meta__" files at the top and anything matching
// r"__[^/]*__($|/)" from the start of the name.
bool is_meta(std::string_view name) {
  if (name.size() < 4 || name.substr(0, 2) != "__") return false;
  const std::size_t slash = name.find('/');
  const std::string_view first = name.substr(0, slash);
  if (first.size() >= 4 && ends_with(first, "__")) return true;
  // "__x__" followed by end or '/' anywhere before the first slash is covered above; the
  // regex can also end at an earlier "__" only if followed by '/' or the end, which is `first`.
  return false;
}

// ---------------------------------------------------------------------------- index cache

constexpr std::string_view kCacheMagic = "STKWDS01";  // index_cache.h's entries of tar members

struct ShardStat {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;  // a local shard's; a URL shard's: etag_stamp() of its ETag
};

std::string cache_file(const std::string& dir, const std::string& path) {
  return detail::index_cache_file(dir, path, "idx");
}

// The cached index of `path` if there is one for this size and mtime (else nullopt).
std::optional<std::vector<TarMember>> load_index(const std::string& file, const std::string& path,
                                                 const ShardStat& st) {
  const auto body = detail::load_index_entry(file, kCacheMagic, {path, st.size, st.mtime_ns});
  if (!body) return std::nullopt;
  detail::IndexReader r(*body);
  std::uint64_t count = 0;
  if (!r.get(count)) return std::nullopt;
  std::vector<TarMember> members;
  members.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(count, body->size() / 28)));
  for (std::uint64_t i = 0; i < count; ++i) {
    TarMember m;
    std::uint32_t len = 0;
    if (!r.get(m.offset) || !r.get(m.size) || !r.get(m.header) || !r.get(len) ||
        !r.get_string(m.name, len) || m.offset > st.size || m.size > st.size - m.offset) {
      return std::nullopt;
    }
    members.push_back(std::move(m));
  }
  if (!r.done()) return std::nullopt;
  return members;
}

// Writes the index atomically (a temporary file renamed); any failure is ignored.
void save_index(const std::string& file, const std::string& path, const ShardStat& st,
                const std::vector<TarMember>& members) {
  detail::IndexWriter w;
  w.put(static_cast<std::uint64_t>(members.size()));
  for (const auto& m : members) {
    w.put(m.offset);
    w.put(m.size);
    w.put(m.header);
    w.put(static_cast<std::uint32_t>(m.name.size()));
    w.put_bytes(m.name.data(), m.name.size());
  }
  detail::save_index_entry(file, kCacheMagic, {path, st.size, st.mtime_ns}, w.data);
}

// ---------------------------------------------------------------------------- fields

enum class Kind : std::uint8_t { image, integer, npy };

Kind kind_of(const std::string& field) {
  const std::size_t dot = field.rfind('.');
  const std::string ext = dot == std::string::npos ? field : field.substr(dot + 1);
  if (ext == "jpg" || ext == "jpeg" || ext == "png") return Kind::image;
  if (ext == "cls" || ext == "cls2" || ext == "class" || ext == "count" || ext == "index" ||
      ext == "inx" || ext == "id" || ext == "txt") {
    return Kind::integer;
  }
  if (ext == "npy") return Kind::npy;
  throw std::invalid_argument(
      "stoker.WebDataset: field '" + field +
      "' is not supported: a batch holds fixed-shape arrays, so the fields read are images "
      "(jpg, jpeg, png), integers (cls, cls2, class, count, index, inx, id, txt holding an "
      "integer) and npy arrays; json, text and other raw bytes are not (docs/formats.md)");
}

struct Field {
  std::string name;                       // as given ("jpg;png")
  std::vector<std::string> alternatives;  // lower-case
  Kind kind = Kind::image;
  FieldSpec spec;
};

// The npy header: dtype and shape. Throws std::runtime_error with the reason.
struct Npy {
  DType dtype = DType::u8;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;
};

Npy parse_npy(std::span<const std::byte> b) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (b.size() < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) {
    throw std::runtime_error("not an npy array (no \\x93NUMPY magic)");
  }
  std::size_t header_len = 0, at = 0;
  if (p[6] == 1) {
    header_len = p[8] | (std::size_t{p[9]} << 8);
    at = 10;
  } else if (p[6] == 2 || p[6] == 3) {
    if (b.size() < 12) throw std::runtime_error("truncated npy header");
    header_len =
        p[8] | (std::size_t{p[9]} << 8) | (std::size_t{p[10]} << 16) | (std::size_t{p[11]} << 24);
    at = 12;
  } else {
    throw std::runtime_error("npy format version " + std::to_string(p[6]) + " is not supported");
  }
  if (header_len > b.size() - at) throw std::runtime_error("truncated npy header");
  const std::string h(reinterpret_cast<const char*>(p + at), header_len);
  auto value_of = [&](const std::string& key) -> std::string_view {
    const std::size_t k = h.find("'" + key + "'");
    if (k == std::string::npos) throw std::runtime_error("npy header has no '" + key + "'");
    std::size_t v = h.find(':', k);
    if (v == std::string::npos) throw std::runtime_error("malformed npy header");
    ++v;
    while (v < h.size() && h[v] == ' ') ++v;
    return std::string_view(h).substr(v);
  };
  Npy out;
  out.data_offset = at + header_len;
  const std::string_view descr = value_of("descr");
  if (descr.size() < 5 || descr[0] != '\'') throw std::runtime_error("malformed npy descr");
  const std::size_t end = descr.find('\'', 1);
  if (end == std::string_view::npos) throw std::runtime_error("malformed npy descr");
  std::string d(descr.substr(1, end - 1));
  if (d.size() == 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=')) d = d.substr(1);
  static const std::pair<const char*, DType> kTypes[] = {
      {"u1", DType::u8},  {"b1", DType::u8},  {"i1", DType::i8},
      {"i2", DType::i16}, {"i4", DType::i32}, {"i8", DType::i64},
      {"f2", DType::f16}, {"f4", DType::f32}, {"f8", DType::f64}};
  bool found = false;
  for (const auto& [name, type] : kTypes) {
    if (d == name) {
      out.dtype = type;
      found = true;
    }
  }
  if (!found) {
    throw std::runtime_error("npy dtype '" + std::string(descr.substr(1, end - 1)) +
                             "' is not supported (little-endian u1, b1, i1-i8, f2-f8)");
  }
  if (value_of("fortran_order").substr(0, 5) != "False") {
    throw std::runtime_error("npy array in Fortran order is not supported");
  }
  const std::string_view shape = value_of("shape");
  if (shape.empty() || shape[0] != '(') throw std::runtime_error("malformed npy shape");
  const std::size_t close = shape.find(')');
  if (close == std::string_view::npos) throw std::runtime_error("malformed npy shape");
  std::int64_t v = -1;
  for (std::size_t i = 1; i < close; ++i) {
    const char c = shape[i];
    if (c >= '0' && c <= '9') {
      if (v < 0) v = 0;
      if (v > (std::int64_t{1} << 40)) throw std::runtime_error("npy shape too large");
      v = v * 10 + (c - '0');
    } else if (c == ',' || c == ' ' || c == 'L') {
      if (c == ',' && v < 0) throw std::runtime_error("malformed npy shape");
      if (c == ',') {
        out.shape.push_back(v);
        v = -1;
      }
    } else {
      throw std::runtime_error("malformed npy shape");
    }
  }
  if (v >= 0) out.shape.push_back(v);
  return out;
}

std::int64_t parse_integer(std::span<const std::byte> b) {
  std::string_view s(reinterpret_cast<const char*>(b.data()), b.size());
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.size() > 19) throw std::runtime_error("not an integer");
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') throw std::runtime_error("not an integer");
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw std::runtime_error("integer out of the int64 range");
  }
  return negative ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
}

}  // namespace

std::optional<std::pair<std::string, std::string>> webdataset_member(std::string_view name) {
  if (is_meta(name)) return std::nullopt;
  const auto key = key_length(name);
  if (!key) return std::nullopt;
  return std::pair{std::string(name.substr(0, *key)), lower(name.substr(*key + 1))};
}

// ---------------------------------------------------------------------------- the source

struct WebDataset::Impl final : EncodedSource {
  struct Shard {
    std::string path;
    std::uint64_t size = 0;
    // A local file (kept open for up to kOpenShards shards, else opened per read) or an object
    // read through the object cache.
    io::FilePtr file;
    std::vector<TarMember> members;
    bool remote() const { return file->object() != nullptr; }
  };
  // One member's bytes for one field: at `offset` in the shard, `rel` in the sample's bytes.
  struct Loc {
    std::uint64_t offset = 0;
    std::uint64_t size = kMissing;
    std::uint64_t rel = 0;
  };
  struct Sample {
    std::uint32_t shard = 0;
    std::uint32_t first = 0;  // its members: shard.members[first, first + count)
    std::uint32_t count = 0;
    std::uint32_t key_length = 0;
    std::uint64_t span_offset = 0;  // the bytes read: one read when `contiguous`
    std::uint64_t span_bytes = 0;
    bool contiguous = true;
    std::string duplicate;  // a field name that two of its members have
  };
  static constexpr std::size_t kOpenShards = 512;

  std::vector<Shard> shards;
  std::vector<Field> fields;
  std::vector<Sample> samples;
  std::vector<Loc> locs;  // samples x fields
  std::size_t from_cache = 0;
  mutable detail::StorageReads storage_reads;
  // URL shards: the process's RemoteFiles for the object cache (another one in a forked child).
  std::uint64_t object_cache_bytes = 0;
  detail::RemoteHandle remote_files;
  // The samples in storage blocks (storage_layout()).
  std::shared_ptr<const StorageBlocks> blocks;
  // When the blocks are the cache's chunks: the reads of each block's samples so far, so that
  // a block whose samples have all been read this epoch is the cache's first out.
  std::unique_ptr<std::atomic<std::uint32_t>[]> block_reads;

  detail::RemoteFiles& files() const { return *remote_files; }

  std::size_t size() const override { return samples.size(); }
  std::int64_t label(std::size_t) const override { return -1; }  // in the fields, not here
  std::vector<std::string> classes() const override { return {}; }
  std::string key(std::size_t index) const {
    const Sample& s = samples.at(index);
    return shards[s.shard].members[s.first].name.substr(0, s.key_length);
  }
  std::string name(std::size_t index) const override {
    return shards[samples.at(index).shard].path + " key '" + key(index) + "'";
  }
  const Loc& loc(std::size_t index, std::size_t field) const {
    return locs[index * fields.size() + field];
  }

  // Counts a read of sample `index` in its block; the block's last sample this epoch (each is
  // read once an epoch) lets the cache drop it first (a hint: a sample read again, as a
  // replacement, only moves which read that is).
  void read_of_block(std::size_t index) const {
    const std::size_t b = blocks->block_of(index);
    const std::size_t samples_in = blocks->ends[b] - (b > 0 ? blocks->ends[b - 1] : 0);
    if ((block_reads[b].fetch_add(1, std::memory_order_relaxed) + 1) % samples_in == 0) {
      shards[samples[index].shard].file->done_with(sample_start(index));
    }
  }

  // Every shard is read from object storage.
  bool remote() const {
    return std::all_of(shards.begin(), shards.end(), [](const Shard& s) { return s.remote(); });
  }

  // Where sample `index`'s reads begin in its shard.
  std::uint64_t sample_start(std::size_t index) const {
    const Sample& s = samples[index];
    if (s.contiguous) return s.span_offset;
    std::uint64_t start = s.span_offset + s.span_bytes;
    for (std::size_t f = 0; f < fields.size(); ++f) {
      if (loc(index, f).size != kMissing) start = std::min(start, loc(index, f).offset);
    }
    return start;
  }

  // Groups each shard's samples into blocks of at least detail::storage_block_bytes() of the
  // object cache, cut between samples (StorageBlocks). When the data set does not fit the
  // cache, the shards' cache chunks become these blocks (RemoteObject::chunk_starts), so that
  // a windowed shuffle fetches each block once, whole, and no sample straddles two chunks; a
  // data set that fits keeps the aligned chunks its indexing fetched.
  void make_blocks() {
    const std::uint64_t target = detail::storage_block_bytes(object_cache_bytes);
    auto out = std::make_shared<StorageBlocks>();
    std::uint64_t total = 0;
    std::vector<std::vector<std::uint64_t>> starts(shards.size());
    for (std::size_t i = 0; i < samples.size();) {
      const std::uint32_t shard = samples[i].shard;
      std::vector<std::uint64_t>& cuts = starts[shard];
      cuts.push_back(0);  // the first block of a shard starts at its first byte
      std::uint64_t begin = 0;
      for (++i; i <= samples.size(); ++i) {
        const bool last = i == samples.size() || samples[i].shard != shard;
        const std::uint64_t at = last ? shards[shard].size : sample_start(i);
        if (!last && at - begin < target) continue;
        out->ends.push_back(i);
        out->bytes.push_back(at - begin);
        total += at - begin;
        if (last) {
          out->object_ends.push_back(i);
          break;
        }
        cuts.push_back(at);
        begin = at;
      }
    }
    if (object_cache_bytes > 0 && total > object_cache_bytes && remote()) {
      for (std::size_t k = 0; k < shards.size(); ++k) {
        const detail::RemoteObject* object = shards[k].file->object();
        if (object != nullptr && !starts[k].empty()) {
          detail::RemoteObject cut = *object;
          cut.chunk_starts =
              std::make_shared<const std::vector<std::uint64_t>>(std::move(starts[k]));
          cut.done_with_each = true;  // read_of_block()
          shards[k].file = io::open_object(std::move(cut), remote_files);
        }
      }
      block_reads = std::make_unique<std::atomic<std::uint32_t>[]>(out->ends.size());
    }
    blocks = std::move(out);
  }

  // Bytes [offset, offset + n) of the shard, errors naming the sample.
  void read_span(const Shard& shard, std::uint64_t offset, std::byte* dst, std::size_t n,
                 std::size_t index) const {
    std::size_t got = 0;
    try {
      got = shard.file->read_at(offset, dst, n);
    } catch (const std::exception& e) {
      throw std::runtime_error(name(index) + ": " + e.what());
    }
    if (got < n) {
      throw std::runtime_error(name(index) + ": the shard ends at byte " +
                               std::to_string(offset + got) + " but the sample's data runs to " +
                               std::to_string(offset + n) + " (truncated since it was indexed, " +
                               std::to_string(shard.size) + " bytes then)");
    }
  }

  void read(std::size_t index, EncodedBytes& out) const override {
    const Sample& s = samples.at(index);
    const Shard& shard = shards[s.shard];
    out.storage.resize(static_cast<std::size_t>(s.span_bytes));
    if (s.contiguous) {
      read_span(shard, s.span_offset, out.storage.data(), out.storage.size(), index);
    } else {
      for (std::size_t f = 0; f < fields.size(); ++f) {
        const Loc& l = loc(index, f);
        if (l.size == kMissing) continue;
        read_span(shard, l.offset, out.storage.data() + l.rel, static_cast<std::size_t>(l.size),
                  index);
      }
    }
    out.bytes = {out.storage.data(), out.storage.size()};
    storage_reads.add(out.storage.size());
    if (block_reads) read_of_block(index);
  }

  Counters counters() const override { return storage_reads.counters(); }

  // The shard's members, from the cache when it holds them for this size and mtime.
  std::vector<TarMember> index_shard(const std::string& path, const WebDatasetOptions& o,
                                     Shard& shard) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) detail::throw_errno(path, "cannot open");
    if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + ": not a regular file");
    const ShardStat ss{static_cast<std::uint64_t>(st.st_size),
                       std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
    shard.size = ss.size;
    shard.file = io::open_local(path, shards.size() < kOpenShards);
    std::error_code ec;
    const std::string absolute = fs::absolute(path, ec).lexically_normal().string();
    const std::string dir = detail::index_cache_dir(o.storage, "webdataset");
    const std::string file = dir.empty() ? std::string() : cache_file(dir, absolute);
    if (!file.empty()) {
      if (auto members = load_index(file, absolute, ss)) {
        ++from_cache;
        return std::move(*members);
      }
    }
    auto members = detail::index_tar(*shard.file);
    if (!file.empty()) save_index(file, absolute, ss, members);
    return members;
  }

  // The members of a URL shard, from the index cache when it holds them for this URL, size and
  // ETag; else read from its tar headers through the object cache (whole chunks, in order).
  std::vector<TarMember> index_remote(const io::File& shard, const WebDatasetOptions& o,
                                      bool& cached) const {
    const detail::RemoteObject* in_storage = shard.object();
    if (in_storage == nullptr) throw std::logic_error(shard.name() + ": not an object");
    const detail::RemoteObject& object = *in_storage;
    const ShardStat ss{object.size, detail::etag_stamp(object.etag)};
    const std::string dir = detail::index_cache_dir(o.storage, "webdataset");
    const std::string file = dir.empty() ? std::string() : cache_file(dir, object.url);
    if (!file.empty()) {
      if (auto members = load_index(file, object.url, ss)) {
        cached = true;
        return std::move(*members);
      }
    }
    std::vector<std::byte> chunk;
    std::uint64_t chunk_at = 0;
    auto read_at = [&](std::uint64_t offset, std::span<std::byte> dst) -> std::size_t {
      std::size_t done = 0;
      while (done < dst.size() && offset + done < object.size) {
        const std::uint64_t at = offset + done;
        if (chunk.empty() || at < chunk_at || at >= chunk_at + chunk.size()) {
          chunk_at = at / detail::kRemoteChunkBytes * detail::kRemoteChunkBytes;
          chunk.resize(static_cast<std::size_t>(
              std::min<std::uint64_t>(detail::kRemoteChunkBytes, object.size - chunk_at)));
          if (shard.read_at(chunk_at, chunk.data(), chunk.size()) < chunk.size()) {
            throw std::runtime_error(object.url + ": shorter than its listing's size");
          }
        }
        const auto n = static_cast<std::size_t>(
            std::min<std::uint64_t>(dst.size() - done, chunk_at + chunk.size() - at));
        std::memcpy(dst.data() + done, chunk.data() + (at - chunk_at), n);
        done += n;
      }
      return done;
    };
    auto members = detail::index_tar(read_at, object.size, object.url);
    if (!file.empty()) save_index(file, object.url, ss, members);
    return members;
  }

  void add_shard(const std::string& path, const WebDatasetOptions& o) {
    Shard shard;
    shard.path = path;
    std::vector<TarMember> all = index_shard(path, o, shard);
    add_members(std::move(shard), std::move(all));
  }

  void add_members(Shard shard, std::vector<TarMember> all) {
    const std::string& path = shard.path;
    // Left out as webdataset leaves them out: meta files, members with no key.
    std::size_t keyless = 0;
    std::string example;
    for (auto& m : all) {
      if (is_meta(m.name)) continue;
      if (!key_length(m.name)) {
        if (keyless++ == 0) example = m.name;
        continue;
      }
      shard.members.push_back(std::move(m));
    }
    if (keyless > 0) {
      detail::log(LogLevel::warning,
                  path + ": " + std::to_string(keyless) +
                      " member(s) with no key (no '.' in the base name) left out, e.g. '" +
                      example + "'");
    }
    if (shard.members.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw std::runtime_error(path + ": too many members");
    }
    const auto number = static_cast<std::uint32_t>(shards.size());
    // Consecutive members with the same key make a sample.
    const auto& ms = shard.members;
    std::size_t i = 0;
    while (i < ms.size()) {
      const std::size_t klen = *key_length(ms[i].name);
      const std::string_view key = std::string_view(ms[i].name).substr(0, klen);
      std::size_t j = i + 1;
      while (j < ms.size()) {
        const auto k = key_length(ms[j].name);
        if (*k != klen || std::string_view(ms[j].name).substr(0, klen) != key) break;
        ++j;
      }
      Sample s;
      s.shard = number;
      s.first = static_cast<std::uint32_t>(i);
      s.count = static_cast<std::uint32_t>(j - i);
      s.key_length = static_cast<std::uint32_t>(klen);
      std::vector<std::string> suffixes;
      for (std::size_t m = i; m < j; ++m) {
        std::string suffix = lower(std::string_view(ms[m].name).substr(klen + 1));
        if (std::find(suffixes.begin(), suffixes.end(), suffix) != suffixes.end()) {
          s.duplicate = suffix;
        }
        suffixes.push_back(std::move(suffix));
      }
      std::uint64_t lo = kMissing, hi = 0, sum = 0;
      const std::size_t base = locs.size();
      for (const auto& field : fields) {
        Loc l;
        for (const auto& alt : field.alternatives) {
          const auto it = std::find(suffixes.begin(), suffixes.end(), alt);
          if (it == suffixes.end()) continue;
          const TarMember& m = ms[i + static_cast<std::size_t>(it - suffixes.begin())];
          l.offset = m.offset;
          l.size = m.size;
          lo = std::min(lo, m.offset);
          hi = std::max(hi, m.offset + m.size);
          sum += m.size;
          break;
        }
        locs.push_back(l);
      }
      // One pread of the span when little lies between the fields (tar headers, a small
      // member not asked for); else one pread per field.
      s.contiguous = lo != kMissing && hi - lo <= sum + 64 * 1024;
      std::uint64_t rel = 0;
      for (std::size_t f = 0; f < fields.size(); ++f) {
        Loc& l = locs[base + f];
        if (l.size == kMissing) continue;
        if (s.contiguous) {
          l.rel = l.offset - lo;
        } else {
          l.rel = rel;
          rel += l.size;
        }
      }
      s.span_offset = lo == kMissing ? 0 : lo;
      s.span_bytes = lo == kMissing ? 0 : (s.contiguous ? hi - lo : rel);
      samples.push_back(std::move(s));
      i = j;
    }
    shards.push_back(std::move(shard));
  }

  // What sample `index` holds, for a missing field's message: "jpg, json".
  std::string present(std::size_t index) const {
    const Sample& s = samples[index];
    std::string out;
    for (std::uint32_t m = s.first; m < s.first + s.count; ++m) {
      out += (out.empty() ? "" : ", ") + shards[s.shard].members[m].name.substr(s.key_length + 1);
    }
    return out;
  }
};

// ---------------------------------------------------------------------------- the data set

std::vector<std::string> webdataset_shards(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (detail::path_kind(p, ".tar") != detail::PathKind::directory) {
      out.push_back(p);
      continue;
    }
    std::vector<std::string> found;
    std::size_t compressed = 0;
    for (const auto& e : fs::directory_iterator(p, ec)) {
      const std::string name = e.path().filename().string();
      if (ends_with(name, ".tar") && !e.is_directory(ec)) found.push_back(e.path().string());
      if (ends_with(name, ".tar.gz") || ends_with(name, ".tgz")) ++compressed;
    }
    if (ec) throw std::runtime_error(p + ": cannot list: " + ec.message());
    if (found.empty()) {
      throw std::runtime_error(
          p + ": no WebDataset shards (*.tar)" +
          (compressed ? " (its " + std::to_string(compressed) +
                            " compressed .tar.gz/.tgz shards cannot be indexed for random "
                            "access: decompress them)"
                      : std::string()));
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

WebDataset::WebDataset(WebDatasetOptions options) : options_(std::move(options)) {
  auto impl = std::make_shared<Impl>();
  impl->object_cache_bytes = options_.storage.object_cache_bytes;  // URL shards; blocks' length
  if (options_.fields.empty()) throw std::invalid_argument("stoker.WebDataset: no fields");
  bool images = false;
  for (const auto& name : options_.fields) {
    Field f;
    f.name = name;
    std::size_t at = 0;
    while (at <= name.size()) {
      const std::size_t semi = std::min(name.find(';', at), name.size());
      std::string alt = lower(name.substr(at, semi - at));
      if (alt.empty()) {
        throw std::invalid_argument("stoker.WebDataset: field '" + name + "' has an empty name");
      }
      f.alternatives.push_back(std::move(alt));
      at = semi + 1;
    }
    f.kind = kind_of(f.alternatives[0]);
    for (const auto& alt : f.alternatives) {
      if (kind_of(alt) != f.kind) {
        throw std::invalid_argument("stoker.WebDataset: field '" + name +
                                    "' mixes kinds (images, integers, arrays)");
      }
    }
    f.spec.name = name;
    for (const auto& other : impl->fields) {
      if (other.name == name) {
        throw std::invalid_argument("stoker.WebDataset: field '" + name +
                                    "' is asked for twice (a batch's fields have distinct names)");
      }
    }
    if (f.kind == Kind::image) {
      images = true;
      f.spec.dtype = options_.transform.dtype;
      f.spec.shape = options_.transform.shape();
    } else if (f.kind == Kind::integer) {
      f.spec.dtype = DType::i64;
    }
    impl->fields.push_back(std::move(f));
  }
  if (images) options_.transform.validate();
  const auto named = webdataset_shards(options_.shards);
  if (named.empty()) throw std::invalid_argument("stoker.WebDataset: no shards");
  for (const auto& s : named) {
    if (ends_with(s, ".tar.gz") || ends_with(s, ".tgz")) {
      throw std::runtime_error(s +
                               ": a compressed shard cannot be indexed for random access; "
                               "stoker reads uncompressed .tar shards (decompress it, e.g. "
                               "gunzip)");
    }
  }
  // URL shards: resolved with one listing per prefix, indexed in parallel (each from the index
  // cache, or from its tar headers through the object cache).
  std::vector<char> is_object;
  const std::vector<std::string> urls = detail::storage_urls(named, ".tar", is_object);
  std::vector<std::vector<io::FilePtr>> objects;
  std::vector<std::vector<TarMember>> remote_members;
  if (!urls.empty()) {
    // One listing and one index per node: the processes that make this data set over this
    // index cache take turns (the resolver's NodeTurn), so the first lists and indexes and the
    // others, the ranks of a torchrun job on this node, find the listing (shared within the
    // job) and the indexes (shared by URL, size and ETag) in the cache.
    ObjectStorageOptions storage = options_.storage;
    storage.index_cache_dir = detail::index_cache_dir(options_.storage, "webdataset");
    detail::Resolver resolver(storage, "webdataset");
    objects = resolver.objects(urls, ".tar");
    impl->remote_files = resolver.remote();
    std::vector<io::FilePtr> flat;  // the URL shards' files, in order
    for (const auto& per_url : objects) flat.insert(flat.end(), per_url.begin(), per_url.end());
    remote_members.resize(flat.size());
    std::vector<char> cached(flat.size(), 0);
    constexpr std::size_t kIndexThreads = 64;  // shards indexed at once (each waits on GETs)
    resolver.index(flat.size(), kIndexThreads, [&](std::size_t i) {
      bool hit = false;
      remote_members[i] = impl->index_remote(*flat[i], options_, hit);
      cached[i] = hit;
    });
    impl->from_cache += static_cast<std::size_t>(std::count(cached.begin(), cached.end(), 1));
  }
  std::vector<std::string> shards;  // every shard, for the messages below
  std::size_t next_url = 0, next_object = 0;
  for (std::size_t k = 0; k < named.size(); ++k) {
    const std::string& s = named[k];
    if (!is_object[k]) {
      shards.push_back(s);
      impl->add_shard(s, options_);
      continue;
    }
    for (const auto& file : objects[next_url++]) {
      Impl::Shard shard;
      shard.path = file->name();
      shard.size = file->size();
      shard.file = file;
      shards.push_back(file->name());
      impl->add_members(std::move(shard), std::move(remote_members[next_object++]));
    }
  }
  if (impl->samples.empty()) {
    throw std::runtime_error(shards[0] + (shards.size() > 1 ? " (and the other shards)" : "") +
                             ": no samples (no member has a key)");
  }
  // npy fields: dtype and shape from the first sample that has one.
  for (std::size_t f = 0; f < impl->fields.size(); ++f) {
    Field& field = impl->fields[f];
    if (field.kind != Kind::npy) continue;
    std::size_t i = 0;
    while (i < impl->samples.size() && impl->loc(i, f).size == kMissing) ++i;
    if (i == impl->samples.size()) {
      throw std::runtime_error("stoker.WebDataset: no sample has the field '" + field.name + "'");
    }
    const auto& l = impl->loc(i, f);
    const auto& shard = impl->shards[impl->samples[i].shard];
    std::vector<std::byte> head(static_cast<std::size_t>(std::min<std::uint64_t>(l.size, 65536)));
    impl->read_span(shard, l.offset, head.data(), head.size(), i);
    try {
      const Npy npy = parse_npy(head);
      field.spec.dtype = npy.dtype;
      field.spec.shape = npy.shape;
      if (field.spec.elements() == 0) throw std::runtime_error("an empty array (no elements)");
    } catch (const std::exception& e) {
      throw std::runtime_error(impl->name(i) + ": field '" + field.name + "': " + e.what());
    }
  }
  impl->make_blocks();
  impl_ = std::move(impl);
  source_ = impl_;
  if (options_.cache_bytes > 0) source_ = cache_in_ram(source_, options_.cache_bytes);
}

WebDataset::~WebDataset() = default;

std::size_t WebDataset::size() const { return impl_->samples.size(); }

std::vector<FieldSpec> WebDataset::fields() const {
  std::vector<FieldSpec> out;
  for (const auto& f : impl_->fields) out.push_back(f.spec);
  return out;
}

std::string WebDataset::sample_name(std::size_t index) const { return impl_->name(index); }
std::string WebDataset::key(std::size_t index) const { return impl_->key(index); }
std::vector<std::string> WebDataset::shard_paths() const {
  std::vector<std::string> paths;
  for (const auto& s : impl_->shards) paths.push_back(s.path);
  return paths;
}
std::size_t WebDataset::indexes_from_cache() const { return impl_->from_cache; }

std::vector<ObjectVersion> WebDataset::objects() const {
  std::vector<ObjectVersion> out;
  for (const auto& s : impl_->shards) {
    if (const auto* o = s.file->object()) out.push_back({o->url, o->size, o->etag});
  }
  return out;
}

Dataset::StorageLayout WebDataset::storage_layout() const {
  StorageLayout layout;
  layout.blocks = impl_->blocks;
  layout.cache_bytes = impl_->object_cache_bytes;
  layout.read_whole = impl_->remote();
  layout.ahead_apart = static_cast<bool>(impl_->remote_files);  // RemoteFiles::room_ahead
  layout.fetches_ahead = layout.ahead_apart;                    // will_read
  return layout;
}

ObjectStorageCounters WebDataset::object_storage_counters() const {
  return impl_->remote_files ? impl_->files().counters() : ObjectStorageCounters{};
}

std::size_t WebDataset::resident_bytes() const {
  const std::uint64_t ahead = impl_->remote_files ? impl_->files().memory_bytes() : 0;
  return static_cast<std::size_t>(source_->counters().cached_bytes + ahead);
}

const std::shared_ptr<EncodedSource>& WebDataset::source() const { return source_; }

bool WebDataset::will_read(std::span<const std::size_t> rows) const noexcept {
  const Impl& impl = *impl_;
  if (!impl.remote_files) return true;
  try {
    // The rows' byte ranges by shard, so that neighbours in a shard are fetched together.
    std::vector<std::pair<std::uint32_t, detail::RemoteFiles::Range>> ranges;
    for (const std::size_t index : rows) {
      if (index >= impl.samples.size()) continue;
      const auto& s = impl.samples[index];
      if (!impl.shards[s.shard].remote() || s.span_bytes == 0) continue;
      if (s.contiguous) {
        ranges.push_back({s.shard, {s.span_offset, static_cast<std::size_t>(s.span_bytes)}});
        continue;
      }
      for (std::size_t f = 0; f < impl.fields.size(); ++f) {
        const auto& l = impl.loc(index, f);
        if (l.size != kMissing) {
          ranges.push_back({s.shard, {l.offset, static_cast<std::size_t>(l.size)}});
        }
      }
    }
    std::sort(ranges.begin(), ranges.end());
    std::vector<detail::RemoteFiles::Range> of_shard;
    for (std::size_t i = 0; i < ranges.size();) {
      const std::uint32_t shard = ranges[i].first;
      of_shard.clear();
      for (; i < ranges.size() && ranges[i].first == shard; ++i)
        of_shard.push_back(ranges[i].second);
      if (!impl.shards[shard].file->will_read(of_shard)) return false;
    }
  } catch (...) {
    // A hint: whatever failed here, each read fetches its own chunk and reports its error.
  }
  return true;
}

void WebDataset::read(std::size_t index, const SampleOut& out) const {
  if (index >= size()) {
    throw std::out_of_range("stoker::WebDataset: index " + std::to_string(index) +
                            " out of range for " + std::to_string(size()) + " samples");
  }
  const Impl& impl = *impl_;
  const auto& s = impl.samples[index];
  if (!s.duplicate.empty()) {
    throw std::runtime_error(impl.name(index) + ": two members have the field '" + s.duplicate +
                             "' (a duplicate file name in the tar)");
  }
  for (std::size_t f = 0; f < impl.fields.size(); ++f) {
    if (impl.loc(index, f).size == kMissing) {
      throw std::runtime_error(impl.name(index) + ": no field '" + impl.fields[f].name +
                               "' (the sample has: " + impl.present(index) + ")");
    }
  }
  thread_local EncodedBytes encoded;
  source_->read(index, encoded);  // names the shard and key itself on failure
  for (std::size_t f = 0; f < impl.fields.size(); ++f) {
    const Field& field = impl.fields[f];
    const auto& l = impl.loc(index, f);
    if (l.rel > encoded.bytes.size() || l.size > encoded.bytes.size() - l.rel) {
      throw std::runtime_error(impl.name(index) + ": the cached sample is shorter than its index");
    }
    const auto bytes =
        encoded.bytes.subspan(static_cast<std::size_t>(l.rel), static_cast<std::size_t>(l.size));
    try {
      switch (field.kind) {
        case Kind::image:
          decode_image(bytes, "", options_.transform, out.seed(), out.bytes(f), nullptr,
                       options_.max_pixels);
          break;
        case Kind::integer:
          out.as<std::int64_t>(f)[0] = parse_integer(bytes);
          break;
        case Kind::npy: {
          const Npy npy = parse_npy(bytes);
          if (npy.dtype != field.spec.dtype || npy.shape != field.spec.shape) {
            std::string shape;
            for (auto d : npy.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
            std::string want;
            for (auto d : field.spec.shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
            throw std::runtime_error("npy array " + std::string(dtype_name(npy.dtype)) + " (" +
                                     shape + "), the data set's is " +
                                     std::string(dtype_name(field.spec.dtype)) + " (" + want +
                                     ") (fixed by its first sample)");
          }
          const std::size_t n = field.spec.bytes();
          if (npy.data_offset > bytes.size() || bytes.size() - npy.data_offset < n) {
            throw std::runtime_error("truncated npy array");
          }
          out.copy_from(f, bytes.subspan(npy.data_offset, n));
          break;
        }
      }
    } catch (const std::exception& e) {
      std::string why = e.what();
      if (why.starts_with(": ")) why = why.substr(2);  // decode_image's, with an empty name
      throw std::runtime_error(impl.name(index) + ": field '" + field.name + "': " + why);
    }
  }
}

}  // namespace stoker
