// Token sources (Megatron's indexed data set, flat token files) and the packed rows over them
// (stoker/tokens.h).
#include "stoker/tokens.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "io/file.h"
#include "io/remote.h"
#include "source/index_cache.h"
#include "source/resolve.h"
#include "stoker/frontend/log.h"
#include "util/parallel.h"

namespace stoker {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("stoker: " + what); }

// Token element types of the files: Megatron's dtype codes, and the flat files' two.
enum class Elem : std::uint8_t { u8, i8, i16, i32, i64, u16, u32, u64 };

std::size_t elem_size(Elem e) {
  switch (e) {
    case Elem::u8:
    case Elem::i8:
      return 1;
    case Elem::i16:
    case Elem::u16:
      return 2;
    case Elem::i32:
    case Elem::u32:
      return 4;
    case Elem::i64:
    case Elem::u64:
      return 8;
  }
  return 1;
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void widen(const std::byte* src, std::span<std::int64_t> out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::int64_t>(load<T>(src + i * sizeof(T)));
  }
}

}  // namespace

struct TokenCorpus::Impl {
  struct File {
    io::FilePtr bin;                  // the tokens of a file (none for a column in memory)
    const std::byte* base = nullptr;  // the tokens of a column: its values
    std::string name;                 // the file's path or URL, or the column's source
    const char* unit = "document";    // what errors call a document of it ("row" for columns)
    std::uint64_t first_row = 0;      // the number of its first document within `name`
    Elem elem = Elem::u16;
    std::size_t first_doc = 0;  // its first document's corpus index
  };
  std::vector<File> files;
  std::vector<std::uint32_t> lengths;
  std::vector<std::uint64_t> byte_offsets;  // each document's first token in its file
  std::vector<std::uint32_t> file_of;       // each document's file
  std::uint64_t tokens = 0;
  std::uint64_t vocab_size = 0;
  std::shared_ptr<const void> owner;  // keeps columns' memory alive
  detail::RemoteHandle remote;        // the object cache of the files at URLs

  std::string name(std::size_t doc) const {
    const auto& f = files[file_of[doc]];
    return f.name + " " + f.unit + " " + std::to_string(f.first_row + (doc - f.first_doc));
  }
};

TokenCorpus::TokenCorpus(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenCorpus::~TokenCorpus() = default;

namespace {

std::string strip_suffix(const std::string& path) {
  for (const char* s : {".bin", ".idx"}) {
    const std::size_t n = std::strlen(s);
    if (path.size() > n && path.compare(path.size() - n, n, s) == 0) {
      return path.substr(0, path.size() - n);
    }
  }
  return path;
}

Elem megatron_elem(std::uint8_t code, const std::string& idx) {
  switch (code) {
    case 1:
      return Elem::u8;
    case 2:
      return Elem::i8;
    case 3:
      return Elem::i16;
    case 4:
      return Elem::i32;
    case 5:
      return Elem::i64;
    case 8:
      return Elem::u16;
    case 6:
    case 7:
      fail(idx + ": dtype code " + std::to_string(code) +
           " is a floating-point type, not token ids");
    default:
      fail(idx + ": unknown dtype code " + std::to_string(code) + " (Megatron's are 1-8)");
  }
}

void check_empty(const TokenCorpus::Impl& c, std::size_t doc) { fail(c.name(doc) + " is empty"); }

// More local files than this are opened for each read (thousands of token files must not use
// up the process's descriptors); fewer are kept open.
constexpr std::size_t kKeptOpen = 64;

// The files `names` name, in order: local paths opened, URLs resolved together through
// `resolver` (each an object, or an s3:// prefix: its objects), their object cache kept in `c`.
// The caller holds the resolver (the node's turn) until it has read what opening reads (the
// indexes, the flat files' scans), then finish()es.
std::vector<io::FilePtr> open_files(const std::vector<std::string>& names,
                                    detail::Resolver& resolver, TokenCorpus::Impl& c) {
  std::vector<char> in_storage;
  const auto urls = detail::storage_urls(names, "", in_storage);
  std::vector<std::vector<io::FilePtr>> objects;
  if (!urls.empty()) {
    objects = resolver.objects(urls, "");
    c.remote = resolver.remote();
  }
  const bool keep_open = names.size() - urls.size() <= kKeptOpen;
  std::vector<io::FilePtr> out;
  std::size_t next = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    if (!in_storage[k]) {
      out.push_back(detail::Resolver::open(names[k], keep_open));
      continue;
    }
    for (auto& f : objects.at(next++)) out.push_back(std::move(f));
  }
  return out;
}

// Every chunk opening read in the object cache before the node's next process takes its turn
// (and finds them there).
void finish(const detail::Resolver& resolver) {
  if (resolver.remote()) resolver.remote()->flush_stores();
}

}  // namespace

std::shared_ptr<const TokenCorpus> TokenCorpus::megatron(const std::vector<std::string>& prefixes,
                                                         std::uint64_t vocab_size,
                                                         const ObjectStorageOptions& storage) {
  auto c = std::make_unique<Impl>();
  c->vocab_size = vocab_size;
  if (prefixes.empty()) throw std::invalid_argument("stoker: no Megatron data set given");
  std::vector<std::string> names;  // PREFIX.idx and PREFIX.bin of each
  for (const auto& given : prefixes) {
    const std::string prefix = strip_suffix(given);
    names.push_back(prefix + ".idx");
    names.push_back(prefix + ".bin");
  }
  detail::Resolver resolver(storage, "tokens");
  const std::vector<io::FilePtr> files = open_files(names, resolver, *c);
  for (std::size_t k = 0; k < prefixes.size(); ++k) {
    const io::File& idx_file = *files.at(2 * k);
    const std::string& idx_path = idx_file.name();
    std::vector<std::byte> idx(idx_file.size());
    if (!idx.empty()) idx_file.read_once(0, idx.data(), idx.size());
    static constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    constexpr std::size_t kHeader = 9 + 8 + 1 + 8 + 8;
    if (idx.size() < kHeader) {
      fail(idx_path + ": " + std::to_string(idx.size()) +
           " bytes, shorter than a Megatron index's header");
    }
    const std::byte* p = idx.data();
    if (std::memcmp(p, kMagic, 9) != 0) {
      fail(idx_path + ": not a Megatron index (its magic is not MMIDIDX\\0\\0)");
    }
    const auto version = load<std::uint64_t>(p + 9);
    if (version != 1) fail(idx_path + ": index version " + std::to_string(version) + ", not 1");
    const Elem elem = megatron_elem(static_cast<std::uint8_t>(p[17]), idx_path);
    const auto sequences = load<std::uint64_t>(p + 18);
    const auto doc_index_count = load<std::uint64_t>(p + 26);
    const std::uint64_t need = kHeader + sequences * (4 + 8) + doc_index_count * 8;
    if (sequences > idx.size() / 12 || doc_index_count > idx.size() / 8 || idx.size() < need) {
      fail(idx_path + ": " + std::to_string(idx.size()) + " bytes, but its header says " +
           std::to_string(sequences) + " sequences and " + std::to_string(doc_index_count) +
           " document indices (" + std::to_string(need) + " bytes): truncated");
    }
    Impl::File file;
    file.bin = files.at(2 * k + 1);
    file.name = file.bin->name();
    file.elem = elem;
    file.first_doc = c->lengths.size();
    const std::size_t es = elem_size(elem);
    const std::byte* lens = p + kHeader;
    const std::byte* ptrs = lens + sequences * 4;
    const std::string& bin_path = file.bin->name();
    const std::uint64_t bin_size = file.bin->size();
    const auto file_index = static_cast<std::uint32_t>(c->files.size());
    std::uint64_t expected = 0;  // where the next sequence should start
    c->files.push_back(std::move(file));
    for (std::uint64_t s = 0; s < sequences; ++s) {
      const auto len = load<std::int32_t>(lens + s * 4);
      const auto ptr = load<std::int64_t>(ptrs + s * 8);
      const std::size_t doc = c->lengths.size();
      c->lengths.push_back(len < 0 ? 0 : static_cast<std::uint32_t>(len));
      c->byte_offsets.push_back(static_cast<std::uint64_t>(ptr));
      c->file_of.push_back(file_index);
      if (len < 0) {
        fail(idx_path + ": document " + std::to_string(s) + " has a negative length " +
             std::to_string(len));
      }
      if (static_cast<std::uint64_t>(ptr) != expected) {
        fail(idx_path + " does not match " + bin_path + ": document " + std::to_string(s) +
             " starts at byte " + std::to_string(ptr) + ", where the documents before it end at " +
             std::to_string(expected));
      }
      expected += static_cast<std::uint64_t>(len) * es;
      if (expected > bin_size) {
        fail(bin_path + " is truncated: " + c->name(doc) + " ends at byte " +
             std::to_string(expected) + ", the file has " + std::to_string(bin_size));
      }
      if (len == 0) check_empty(*c, doc);
      c->tokens += static_cast<std::uint64_t>(len);
    }
    if (expected != bin_size) {
      fail(idx_path + " does not match " + bin_path + ": its " + std::to_string(sequences) +
           " documents end at byte " + std::to_string(expected) + ", the file has " +
           std::to_string(bin_size));
    }
  }
  finish(resolver);
  return std::shared_ptr<const TokenCorpus>(new TokenCorpus(std::move(c)));
}

namespace {

// Flat files are scanned by blocks of this many bytes (whole tokens of any size).
constexpr std::size_t kScanBytes = 8u << 20;

template <class T>
void split_flat(TokenCorpus::Impl& c, std::uint32_t file_index, std::uint64_t eod) {
  const io::File& bin = *c.files[file_index].bin;
  const std::uint64_t n = bin.size() / sizeof(T);
  std::uint64_t start = 0;
  auto close = [&](std::uint64_t end, bool at_eod) {  // the document [start, end)
    const std::size_t doc = c.lengths.size();
    const std::uint64_t len = end - start;
    if (len > UINT32_MAX) {
      fail(bin.name() + " document " + std::to_string(doc - c.files[file_index].first_doc) +
           " has " + std::to_string(len) + " tokens, more than 2^32 - 1");
    }
    c.lengths.push_back(static_cast<std::uint32_t>(len));
    c.byte_offsets.push_back(start * sizeof(T));
    c.file_of.push_back(file_index);
    if (len == 1 && at_eod) check_empty(c, doc);  // nothing but its end-of-document token
    c.tokens += len;
    start = end;
  };
  const auto target = static_cast<T>(eod);
  std::vector<std::byte> block(std::min<std::uint64_t>(kScanBytes, n * sizeof(T)));
  for (std::uint64_t first = 0; first < n;) {
    const std::uint64_t count = std::min<std::uint64_t>(block.size() / sizeof(T), n - first);
    const std::size_t bytes = count * sizeof(T);
    bin.will_read((first + count) * sizeof(T), bytes);  // the next block, fetched meanwhile
    if (bin.read_at(first * sizeof(T), block.data(), bytes) != bytes) {
      fail(bin.name() + " is truncated: it holds fewer than its " + std::to_string(bin.size()) +
           " bytes");
    }
    for (std::uint64_t i = 0; i < count; ++i) {
      if (load<T>(block.data() + i * sizeof(T)) == target) close(first + i + 1, true);
    }
    first += count;
  }
  if (start < n) close(n, false);
}

}  // namespace

std::shared_ptr<const TokenCorpus> TokenCorpus::flat(const std::vector<std::string>& paths,
                                                     FlatDType dtype, std::uint64_t eod,
                                                     std::uint64_t vocab_size,
                                                     const ObjectStorageOptions& storage) {
  if (paths.empty()) throw std::invalid_argument("stoker: no token files given");
  const Elem elem = dtype == FlatDType::u16 ? Elem::u16 : Elem::u32;
  const std::size_t es = elem_size(elem);
  const std::uint64_t max_id = dtype == FlatDType::u16 ? UINT16_MAX : UINT32_MAX;
  if (eod > max_id) {
    throw std::invalid_argument("stoker: the end-of-document token " + std::to_string(eod) +
                                " does not fit the files' " +
                                (dtype == FlatDType::u16 ? "uint16" : "uint32") + " tokens");
  }
  auto c = std::make_unique<Impl>();
  c->vocab_size = vocab_size;
  detail::Resolver resolver(storage, "tokens");
  for (io::FilePtr& bin : open_files(paths, resolver, *c)) {
    Impl::File file;
    file.name = bin->name();
    file.elem = elem;
    file.first_doc = c->lengths.size();
    if (bin->size() % es != 0) {
      fail(file.name + " is truncated: " + std::to_string(bin->size()) +
           " bytes, not a whole number of " + std::to_string(es) + "-byte tokens");
    }
    if (bin->size() == 0) fail(file.name + " holds no tokens");
    file.bin = std::move(bin);
    const auto file_index = static_cast<std::uint32_t>(c->files.size());
    c->files.push_back(std::move(file));
    if (elem == Elem::u16) {
      split_flat<std::uint16_t>(*c, file_index, eod);
    } else {
      split_flat<std::uint32_t>(*c, file_index, eod);
    }
  }
  finish(resolver);
  return std::shared_ptr<const TokenCorpus>(new TokenCorpus(std::move(c)));
}

std::shared_ptr<const TokenCorpus> TokenCorpus::columns(std::vector<Column> columns,
                                                        std::shared_ptr<const void> owner,
                                                        std::uint64_t vocab_size) {
  if (columns.empty()) throw std::invalid_argument("stoker: no token columns given");
  auto c = std::make_unique<Impl>();
  c->vocab_size = vocab_size;
  c->owner = std::move(owner);
  for (auto& col : columns) {
    Impl::File file;
    file.base = static_cast<const std::byte*>(col.values);
    file.name = col.source;
    file.unit = "row";
    file.first_row = col.first_row;
    file.first_doc = c->lengths.size();
    switch (col.type) {
      case IdType::u8:
        file.elem = Elem::u8;
        break;
      case IdType::i8:
        file.elem = Elem::i8;
        break;
      case IdType::u16:
        file.elem = Elem::u16;
        break;
      case IdType::i16:
        file.elem = Elem::i16;
        break;
      case IdType::u32:
        file.elem = Elem::u32;
        break;
      case IdType::i32:
        file.elem = Elem::i32;
        break;
      case IdType::u64:
        file.elem = Elem::u64;
        break;
      case IdType::i64:
        file.elem = Elem::i64;
        break;
    }
    const std::size_t es = elem_size(file.elem);
    if (col.offsets.empty()) fail(col.source + ": no offsets (a column chunk needs rows + 1)");
    const auto file_index = static_cast<std::uint32_t>(c->files.size());
    c->files.push_back(std::move(file));
    for (std::size_t r = 0; r + 1 < col.offsets.size(); ++r) {
      const std::size_t doc = c->lengths.size();
      const std::int64_t begin = col.offsets[r], end = col.offsets[r + 1];
      if (begin < 0 || end < begin) {
        fail(col.source + " row " + std::to_string(col.first_row + r) + ": offsets " +
             std::to_string(begin) + " to " + std::to_string(end) + " do not follow each other");
      }
      const auto len = static_cast<std::uint64_t>(end - begin);
      if (len > UINT32_MAX) {
        fail(col.source + " row " + std::to_string(col.first_row + r) + " has " +
             std::to_string(len) + " tokens, more than 2^32 - 1");
      }
      c->lengths.push_back(static_cast<std::uint32_t>(len));
      c->byte_offsets.push_back(static_cast<std::uint64_t>(begin) * es);
      c->file_of.push_back(file_index);
      if (len == 0) check_empty(*c, doc);
      c->tokens += len;
    }
  }
  return std::shared_ptr<const TokenCorpus>(new TokenCorpus(std::move(c)));
}

std::size_t TokenCorpus::documents() const { return impl_->lengths.size(); }
std::uint64_t TokenCorpus::tokens() const { return impl_->tokens; }
std::span<const std::uint32_t> TokenCorpus::lengths() const { return impl_->lengths; }
std::uint64_t TokenCorpus::vocab_size() const { return impl_->vocab_size; }
std::string TokenCorpus::document_name(std::size_t doc) const { return impl_->name(doc); }
std::size_t TokenCorpus::files() const { return impl_->files.size(); }
const std::string& TokenCorpus::file(std::size_t index) const {
  return impl_->files.at(index).name;
}
ObjectStorageCounters TokenCorpus::object_storage_counters() const {
  return impl_->remote ? impl_->remote->counters() : ObjectStorageCounters{};
}

void TokenCorpus::read_tokens(std::size_t doc, std::uint64_t offset, std::span<std::int64_t> out,
                              std::int64_t* next) const {
  const Impl& c = *impl_;
  if (doc >= c.lengths.size() || offset + out.size() > c.lengths[doc]) {
    throw std::out_of_range("stoker: tokens [" + std::to_string(offset) + ", " +
                            std::to_string(offset + out.size()) + ") of document " +
                            std::to_string(doc) + " are past its end");
  }
  const auto& f = c.files[c.file_of[doc]];
  const std::size_t es = elem_size(f.elem);
  const bool more = next != nullptr && offset + out.size() < c.lengths[doc];
  const std::size_t count = out.size() + (more ? 1 : 0);
  const std::uint64_t at = c.byte_offsets[doc] + offset * es;
  const std::byte* src = nullptr;  // a column's values in memory, or the file's bytes read
  if (f.bin) {
    thread_local std::vector<std::byte> bytes;
    bytes.resize(count * es);
    if (f.bin->read_at(at, bytes.data(), bytes.size()) != bytes.size()) {
      fail(f.name + " is truncated: " + c.name(doc) + " ends past its " +
           std::to_string(f.bin->size()) + " bytes");
    }
    src = bytes.data();
  } else {
    src = f.base + at;
  }
  auto convert = [&](const std::byte* from, std::span<std::int64_t> to) {
    switch (f.elem) {
      case Elem::u8:
        return widen<std::uint8_t>(from, to);
      case Elem::i8:
        return widen<std::int8_t>(from, to);
      case Elem::i16:
        return widen<std::int16_t>(from, to);
      case Elem::i32:
        return widen<std::int32_t>(from, to);
      case Elem::i64:
        return widen<std::int64_t>(from, to);
      case Elem::u16:
        return widen<std::uint16_t>(from, to);
      case Elem::u32:
        return widen<std::uint32_t>(from, to);
      case Elem::u64:
        return widen<std::uint64_t>(from, to);
    }
  };
  // Widened, then each checked against the vocabulary (`first`: the first one's place).
  auto take = [&](const std::byte* from, std::span<std::int64_t> to, std::uint64_t first) {
    convert(from, to);
    if (c.vocab_size == 0) return;
    const auto vocab = static_cast<std::int64_t>(c.vocab_size);
    for (std::size_t i = 0; i < to.size(); ++i) {
      if (to[i] < 0 || to[i] >= vocab) {
        fail(c.name(doc) + ": token " + std::to_string(first + i) + " is " + std::to_string(to[i]) +
             ", outside the vocabulary of " + std::to_string(c.vocab_size));
      }
    }
  };
  take(src, out, offset);
  if (more) take(src + out.size() * es, std::span(next, 1), offset + out.size());
}

// ---- TokenRows ----------------------------------------------------------------------------

TokenRows::TokenRows(std::shared_ptr<const TokenCorpus> corpus, TokenRowsOptions options)
    : corpus_(std::move(corpus)), options_(options) {
  if (!corpus_) throw std::invalid_argument("stoker::TokenRows: no corpus");
  plan_ = plan_rows(corpus_->lengths(), options_.pack);
  const std::size_t needed = plan_.max_pieces + 1;
  max_segments_ = options_.max_segments == 0 ? needed : options_.max_segments;
  if (max_segments_ < needed) {
    // A row needs a segment per piece, and one for its padding unless it is full.
    std::size_t most = 0;
    for (std::size_t r = 0; r < plan_.rows(); ++r) {
      std::uint64_t used = 0;
      for (const auto& p : plan_.row(r)) used += p.length;
      most = std::max<std::size_t>(most, plan_.row(r).size() + (used < plan_.seq_len ? 1 : 0));
    }
    if (max_segments_ < most) {
      throw std::invalid_argument("stoker::TokenRows: max_segments " +
                                  std::to_string(max_segments_) + " is fewer than a row needs (" +
                                  std::to_string(most) + ")");
    }
  }
}

std::size_t TokenRows::size() const { return plan_.rows(); }

std::vector<FieldSpec> TokenRows::fields() const {
  const auto n = static_cast<std::int64_t>(plan_.seq_len);
  return {{"input_ids", DType::i64, {n}},
          {"labels", DType::i64, {n}},
          {"position_ids", DType::i64, {n}},
          {"document_ids", DType::i64, {n}},
          {"cu_seqlens", DType::i32, {static_cast<std::int64_t>(max_segments_) + 1}}};
}

void TokenRows::read(std::size_t index, const SampleOut& out) const {
  if (index >= plan_.rows()) {
    throw std::out_of_range("stoker::TokenRows: row " + std::to_string(index) +
                            " out of range for " + std::to_string(plan_.rows()) + " rows");
  }
  const auto ids = out.as<std::int64_t>(0);
  const auto labels = out.as<std::int64_t>(1);
  const auto positions = out.as<std::int64_t>(2);
  const auto docs = out.as<std::int64_t>(3);
  const auto cu = out.as<std::int32_t>(4);
  const bool next = options_.labels == TokenRowsOptions::Labels::next;
  std::size_t at = 0, segment = 0;
  cu[0] = 0;
  for (const auto& p : plan_.row(index)) {
    const auto span = ids.subspan(at, p.length);
    std::int64_t after = kIgnoreLabel;  // the token after the piece in its document, if any
    corpus_->read_tokens(p.doc, p.offset, span, next ? &after : nullptr);
    for (std::uint32_t k = 0; k < p.length; ++k) {
      positions[at + k] = k;
      docs[at + k] = static_cast<std::int64_t>(p.doc);
    }
    if (next) {
      // The token after each in its document: the piece's own, then the one after the piece.
      std::copy(span.begin() + 1, span.end(), labels.begin() + static_cast<std::ptrdiff_t>(at));
      labels[at + p.length - 1] = after;
    } else {
      std::copy(span.begin(), span.end(), labels.begin() + static_cast<std::ptrdiff_t>(at));
      labels[at] = kIgnoreLabel;
    }
    at += p.length;
    cu[++segment] = static_cast<std::int32_t>(at);
  }
  const std::size_t n = plan_.seq_len;
  for (std::size_t i = at; i < n; ++i) {
    ids[i] = options_.pad_id;
    labels[i] = kIgnoreLabel;
    positions[i] = 0;
    docs[i] = -1;
  }
  if (at < n) cu[++segment] = static_cast<std::int32_t>(n);
  for (std::size_t s = segment + 1; s < cu.size(); ++s) cu[s] = static_cast<std::int32_t>(n);
}

std::string TokenRows::sample_name(std::size_t index) const {
  if (index >= plan_.rows()) return {};
  const auto row = plan_.row(index);
  std::string name = "row " + std::to_string(index) + " (" + corpus_->document_name(row[0].doc);
  if (row.size() > 1) name += " and " + std::to_string(row.size() - 1) + " more";
  return name + ")";
}

// ---- TokenMix ------------------------------------------------------------------------------

namespace {

// A mix's index in the index cache (index_cache.h's entries, kind "STKMIX01"), keyed by
// mix_key(); body: the sources (u64), the samples (u64), each source's epochs (u64), each
// sample's source and row, each in the fewest bytes (1, 2, 4 or 8: two u8 before the arrays)
// that hold every value.
constexpr std::string_view kMixMagic = "STKMIX01";

// What a mix's index is made from, as text: the index is a function of the sources' row counts
// and the mix's options; the sources' files (size and mtime where local), documents, tokens
// and packing are in it too, so that an entry says what it was made from and a source changed
// in any way builds the index again.
// A schedule of more than one segment adds its segments (one segment is its weights: the key
// of the plain weights, whose entries stay valid).
std::string mix_key(const std::vector<std::shared_ptr<const TokenRows>>& sources,
                    const TokenMixOptions& o, const std::vector<TokenWeightStep>& schedule,
                    std::size_t samples) {
  auto hex = [](std::string& to, std::uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, " %016llx", static_cast<unsigned long long>(v));
    to += b;
  };
  std::string k = "TokenMix index v1: mixing ";
  k += o.mixing == TokenMixing::stratified ? "stratified" : "iid";
  k += ", batch " + std::to_string(o.batch) + ", samples " + std::to_string(samples) + ", seed " +
       std::to_string(o.seed) + ", weights";
  for (const double w : schedule[0].weights) hex(k, std::bit_cast<std::uint64_t>(w));
  if (schedule.size() > 1) {
    k += ", schedule";
    for (const TokenWeightStep& seg : schedule) {
      k += " step " + std::to_string(seg.step) + ":";
      for (const double w : seg.weights) hex(k, std::bit_cast<std::uint64_t>(w));
    }
  }
  for (std::size_t s = 0; s < sources.size(); ++s) {
    const TokenRows& r = *sources[s];
    const TokenPackOptions& p = r.options().pack;
    const TokenCorpus& c = r.corpus();
    k += "; source " + std::to_string(s) + ": rows " + std::to_string(r.size()) + ", seq_len " +
         std::to_string(p.seq_len) + ", pack " +
         (p.mode == TokenPackOptions::Mode::concat ? "concat" : "best_fit") + ", long " +
         (p.long_documents == TokenPackOptions::Long::split ? "split" : "truncate") +
         ", shuffled " + std::to_string(p.shuffle_documents ? 1 : 0) + ", seed " +
         std::to_string(p.seed) + ", documents " + std::to_string(c.documents()) + ", tokens " +
         std::to_string(c.tokens()) + ", files";
    for (std::size_t f = 0; f < c.files(); ++f) {
      const std::string& name = c.file(f);
      k += ' ';
      k += name;
      struct stat st {};
      if (::stat(name.c_str(), &st) == 0) {
        k += " (" + std::to_string(st.st_size) + " bytes, mtime " +
             std::to_string(static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
                            st.st_mtim.tv_nsec) +
             ")";
      }
    }
  }
  return k;
}

// The narrowest of 1, 2, 4 and 8 bytes that holds every value below `bound`.
std::uint8_t width_below(std::uint64_t bound) {
  if (bound <= 0x100) return 1;
  if (bound <= 0x10000) return 2;
  if (bound <= 0x100000000ULL) return 4;
  return 8;
}

// Values in `width` bytes each (1, 2, 4 or 8), little-endian, to and from their type.
template <class T, std::size_t W>
void narrow_as(std::span<const T> values, char* out) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto v = static_cast<std::uint64_t>(values[i]);
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(out + i * W, &v, W);  // the low bytes
    } else {
      for (std::size_t b = 0; b < W; ++b) out[i * W + b] = static_cast<char>(v >> (8 * b));
    }
  }
}

template <class T, std::size_t W>
void widen_as(const char* in, std::span<T> values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint64_t v = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, in + i * W, W);
    } else {
      for (std::size_t b = 0; b < W; ++b)
        v |= std::uint64_t{static_cast<unsigned char>(in[i * W + b])} << (8 * b);
    }
    values[i] = static_cast<T>(v);
  }
}

// Runs fn(first, count) over runs of a million of `n` values on every core.
template <class Fn>
void by_runs(std::size_t n, const Fn& fn) {
  constexpr std::size_t kRun = std::size_t{1} << 20;
  detail::parallel_for((n + kRun - 1) / kRun, std::max(1u, std::thread::hardware_concurrency()),
                       [&](std::size_t t) { fn(t * kRun, std::min(n - t * kRun, kRun)); });
}

template <class T>
void put_narrow(detail::IndexWriter& w, std::span<const T> values, std::uint8_t width) {
  const std::size_t at = w.data.size();
  w.data.resize(at + values.size() * width);
  char* out = w.data.data() + at;
  by_runs(values.size(), [&](std::size_t first, std::size_t count) {
    const auto part = values.subspan(first, count);
    char* to = out + first * width;
    switch (width) {
      case 1:
        return narrow_as<T, 1>(part, to);
      case 2:
        return narrow_as<T, 2>(part, to);
      case 4:
        return narrow_as<T, 4>(part, to);
      default:
        return narrow_as<T, 8>(part, to);
    }
  });
}

template <class T>
void get_narrow(const char* in, std::span<T> values, std::uint8_t width) {
  by_runs(values.size(), [&](std::size_t first, std::size_t count) {
    const auto part = values.subspan(first, count);
    const char* from = in + first * width;
    switch (width) {
      case 1:
        return widen_as<T, 1>(from, part);
      case 2:
        return widen_as<T, 2>(from, part);
      case 4:
        return widen_as<T, 4>(from, part);
      default:
        return widen_as<T, 8>(from, part);
    }
  });
}

void save_mix(const std::string& file, const std::string& key, std::span<const std::uint64_t> rows,
              const TokenMixIndex& x) {
  const std::uint8_t source_width = width_below(rows.size());
  const std::uint8_t row_width = width_below(*std::max_element(rows.begin(), rows.end()));
  detail::IndexWriter w;
  w.data.reserve(16 + 2 + x.epochs.size() * 8 + x.source.size() * (source_width + row_width));
  w.put(static_cast<std::uint64_t>(x.epochs.size()));
  w.put(static_cast<std::uint64_t>(x.source.size()));
  w.put(source_width);
  w.put(row_width);
  w.put_bytes(x.epochs.data(), x.epochs.size() * sizeof(std::uint64_t));
  put_narrow<std::uint32_t>(w, x.source, source_width);
  put_narrow<std::uint64_t>(w, x.row, row_width);
  detail::save_index_entry(file, kMixMagic, {key, x.source.size(), 0}, w.data);
}

// The index in `file` when it is an entry for `key` that holds `samples` samples of sources of
// `rows` rows (each sample's source and row in range); else false.
bool load_mix(const std::string& file, const std::string& key, std::size_t samples,
              std::span<const std::uint64_t> rows, TokenMixIndex& x) {
  const auto body = detail::load_index_entry(file, kMixMagic, {key, samples, 0});
  if (!body) return false;
  detail::IndexReader in(*body);
  std::uint64_t n = 0, count = 0;
  std::uint8_t source_width = 0, row_width = 0;
  if (!in.get(n) || !in.get(count) || !in.get(source_width) || !in.get(row_width) ||
      n != rows.size() || count != samples || source_width != width_below(n) ||
      row_width != width_below(*std::max_element(rows.begin(), rows.end())) ||
      in.left() != n * 8 + count * (source_width + row_width)) {
    return false;
  }
  const char* at = body->data() + (body->size() - in.left());
  x.epochs.resize(n);
  std::memcpy(x.epochs.data(), at, n * 8);
  x.source.resize(samples);
  x.row.resize(samples);
  get_narrow<std::uint32_t>(at + n * 8, x.source, source_width);
  get_narrow<std::uint64_t>(at + n * 8 + samples * source_width, x.row, row_width);
  std::atomic<bool> in_range{true};
  by_runs(samples, [&](std::size_t first, std::size_t run) {
    for (std::size_t i = first; i < first + run; ++i) {
      if (x.source[i] >= n || x.row[i] >= rows[x.source[i]]) in_range = false;
    }
  });
  return in_range;
}

}  // namespace

TokenMix::TokenMix(std::vector<std::shared_ptr<const TokenRows>> sources, TokenMixOptions options)
    : sources_(std::move(sources)) {
  if (sources_.empty()) throw std::invalid_argument("stoker::TokenMix: no sources");
  std::vector<std::uint64_t> rows;
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < sources_.size(); ++s) {
    if (!sources_[s])
      throw std::invalid_argument("stoker::TokenMix: source " + std::to_string(s) + " is null");
    const auto& a = *sources_[s];
    const auto& b = *sources_[0];
    if (a.plan().seq_len != b.plan().seq_len || a.max_segments() != b.max_segments()) {
      throw std::invalid_argument(
          "stoker::TokenMix: source " + std::to_string(s) + "'s rows (seq_len " +
          std::to_string(a.plan().seq_len) + ", max_segments " + std::to_string(a.max_segments()) +
          ") differ from source 0's (seq_len " + std::to_string(b.plan().seq_len) +
          ", max_segments " + std::to_string(b.max_segments()) + ")");
    }
    rows.push_back(a.size());
    total += a.size();
  }
  const std::size_t samples = options.samples == 0 ? total : options.samples;
  if (!options.weights.empty() && !options.schedule.empty()) {
    throw std::invalid_argument("stoker::TokenMix: give weights or a schedule, not both");
  }
  if (options.schedule.empty() && options.weights.size() != rows.size()) {
    throw std::invalid_argument("stoker::TokenMix: " + std::to_string(options.weights.size()) +
                                " weights for " + std::to_string(rows.size()) + " sources");
  }
  // The schedule checked (a bad one throws here, before the index cache is looked at).
  const std::vector<TokenWeightStep> schedule =
      options.schedule.empty() ? std::vector<TokenWeightStep>{{0, options.weights}}
                               : checked_schedule(options.schedule, rows.size());
  std::string dir;
  if (options.index_cache && samples >= kTokenMixCacheSamples) {
    ObjectStorageOptions where;
    where.index_cache_dir = options.index_cache_dir;
    dir = detail::index_cache_dir(where);
  }
  std::string key, file;
  if (!dir.empty()) {
    key = mix_key(sources_, options, schedule, samples);
    file = detail::index_cache_file(dir, key, "mix");
    index_from_cache_ = load_mix(file, key, samples, rows, index_);
    std::error_code ec;
    if (!index_from_cache_ && std::filesystem::exists(file, ec)) {
      detail::log(LogLevel::warning, "TokenMix: the index cache entry " + file +
                                         " is damaged or cut short (or made by another version "
                                         "of stoker): building the mix's index again");
    }
  }
  if (!index_from_cache_) {
    index_ = options.schedule.empty() ? token_mix_index(rows, options.weights, options.mixing,
                                                        options.batch, samples, options.seed)
                                      : token_mix_index(rows, schedule, options.mixing,
                                                        options.batch, samples, options.seed);
    if (!file.empty()) save_mix(file, key, rows, index_);
  }
  fields_ = sources_[0]->fields();
  fields_.push_back({"source", DType::i64, {}});
}

std::size_t TokenMix::size() const { return index_.source.size(); }

std::vector<FieldSpec> TokenMix::fields() const { return fields_; }

void TokenMix::read(std::size_t index, const SampleOut& out) const {
  if (index >= size()) {
    throw std::out_of_range("stoker::TokenMix: sample " + std::to_string(index) +
                            " out of range for " + std::to_string(size()) + " samples");
  }
  const std::uint32_t s = index_.source[index];
  sources_[s]->read(static_cast<std::size_t>(index_.row[index]), out);
  out.as<std::int64_t>(fields_.size() - 1)[0] = s;
}

std::string TokenMix::sample_name(std::size_t index) const {
  if (index >= size()) return {};
  const std::uint32_t s = index_.source[index];
  return "source " + std::to_string(s) + " " +
         sources_[s]->sample_name(static_cast<std::size_t>(index_.row[index]));
}

}  // namespace stoker
