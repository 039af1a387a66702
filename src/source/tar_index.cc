#include "source/tar_index.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "io/file.h"
#include "source/file_util.h"

namespace stoker::detail {
namespace {

constexpr std::uint64_t kBlock = 512;
// Headers are read in windows of this size: one pread covers a small member's header, its
// data and the next few headers (a label file beside its image).
constexpr std::size_t kWindow = 16 * 1024;

std::uint64_t round_up(std::uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// A NUL-terminated field of at most `n` bytes.
std::string_view field(const std::byte* h, std::size_t at, std::size_t n) {
  const char* p = reinterpret_cast<const char*>(h) + at;
  return {p, strnlen(p, n)};
}

// A numeric field: octal digits (leading spaces allowed, ended by a space or NUL) or, with the
// top bit of the first byte set, GNU's big-endian base-256. Empty means 0. nullopt if malformed.
std::optional<std::uint64_t> number(const std::byte* h, std::size_t at, std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(h) + at;
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return std::nullopt;  // negative (0xff) or reserved
    std::uint64_t v = 0;
    for (std::size_t i = 1; i < n; ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | p[i];
    }
    return v;
  }
  std::size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  std::uint64_t v = 0;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return std::nullopt;
    v = v * 8 + (p[i] - '0');
  }
  if (i < n && p[i] != ' ' && p[i] != '\0') return std::nullopt;
  return v;
}

bool all_zero(const std::byte* h) {
  return std::all_of(h, h + kBlock, [](std::byte b) { return b == std::byte{0}; });
}

// The stored checksum matches the sum of the header's bytes with the checksum field read as
// spaces, unsigned (POSIX) or signed (some old writers).
bool checksum_ok(const std::byte* h) {
  const auto stored = number(h, 148, 8);
  if (!stored) return false;
  std::uint64_t sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    const auto b = (i >= 148 && i < 156) ? std::uint8_t{' '} : std::to_integer<std::uint8_t>(h[i]);
    sum += b;
    signed_sum += static_cast<std::int8_t>(b);
  }
  return *stored == sum || static_cast<std::int64_t>(*stored) == signed_sum;
}

std::string at_byte(std::uint64_t offset) { return " at byte " + std::to_string(offset); }

class Indexer {
 public:
  Indexer(const ReadAt& read, std::uint64_t file_size, const std::string& name)
      : read_(read), size_(file_size), name_(name) {}

  std::vector<TarMember> run() {
    std::vector<TarMember> out;
    if (size_ == 0) fail("empty file, not a tar");
    std::uint64_t at = 0;
    std::uint64_t first_header = 0;
    std::optional<std::string> long_name;           // GNU 'L' for the next member
    std::map<std::string, std::string> pax;         // 'x' for the next member
    std::map<std::string, std::string> global_pax;  // 'g' for every member after it
    bool pending = false;                           // an 'L' / 'x' header waits for its member
    while (true) {
      if (at + kBlock > size_) {
        if (at == size_ && !pending) {
          fail("truncated: the file ends" + at_byte(at) +
               " without the end-of-archive marker (a partial download?)");
        }
        fail("truncated: the file ends inside a header" + at_byte(at) + " (a partial download?)");
      }
      const std::byte* h = view(at, kBlock);
      if (all_zero(h)) {
        if (pending)
          fail("truncated: an extended header is followed by the end of the archive" + at_byte(at));
        break;  // end of archive (a second zero block usually follows; not required)
      }
      if (!checksum_ok(h)) {
        if (at == 0) {
          if (std::to_integer<int>(h[0]) == 0x1f && std::to_integer<int>(h[1]) == 0x8b) {
            fail(
                "gzip-compressed; a compressed tar cannot be indexed for random access "
                "(decompress it, e.g. gunzip, or repack it uncompressed)");
          }
          fail("not a tar file (no valid tar header at the start)");
        }
        fail("corrupt tar: header checksum mismatch" + at_byte(at) +
             (last_.empty() ? "" : " (after member '" + last_ + "')"));
      }
      if (!pending) first_header = at;
      const auto parsed_size = number(h, 124, 12);
      if (!parsed_size) fail("corrupt tar: bad size field" + at_byte(at));
      const char type = static_cast<char>(h[156]);
      const std::uint64_t data = at + kBlock;
      std::uint64_t size = *parsed_size;
      // Types whose size is not followed by data (tarfile's rule): links, devices, dirs, FIFOs.
      const bool no_data =
          type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6';
      if (type == 'K') {  // GNU long link name, for a link that follows: not needed
        if (data > size_ || size > size_ - data) {
          fail("truncated: an extended header runs past the end of the file" + at_byte(at));
        }
        pending = true;
        at = data + round_up(size);
        continue;
      }
      if (type == 'L' || type == 'x' || type == 'g') {
        const std::string text = payload(data, size, type);
        if (type == 'L') {
          long_name = std::string(text.c_str());  // up to its NUL
        } else {
          parse_pax(text, type == 'g' ? global_pax : pax, data);
        }
        if (type != 'g') pending = true;
        at = data + round_up(size);
        continue;
      }
      // A real entry: its name and size, with the extended headers before it applied.
      std::string name;
      if (long_name) {
        name = *long_name;
      } else {
        name = std::string(field(h, 0, 100));
        const std::string_view magic = field(h, 257, 6);
        const std::string_view prefix = field(h, 345, 155);
        // POSIX ustar ("ustar\0"); GNU's "ustar  " keeps other things where the prefix is.
        if (magic == "ustar" && std::to_integer<int>(h[262]) == 0 && !prefix.empty()) {
          name = std::string(prefix) + "/" + name;
        }
      }
      for (const auto* m : {&global_pax, &pax}) {
        if (auto it = m->find("path"); it != m->end()) name = it->second;
        if (auto it = m->find("size"); it != m->end()) size = pax_number(it->second, data);
      }
      long_name.reset();
      pax.clear();
      pending = false;
      // An old-style entry ('\0') named with a trailing slash is a directory (tarfile's rule).
      const bool regular =
          type == '0' || type == '7' || (type == '\0' && (name.empty() || name.back() != '/'));
      if (!no_data && (data > size_ || size > size_ - data)) {
        fail("truncated: member '" + name + "' (" + std::to_string(size) + " bytes" +
             at_byte(data) + ") runs past the end of the file (" + std::to_string(size_) +
             " bytes; a partial download?)");
      }
      if (regular) {
        out.push_back({name, data, size, first_header});
        last_ = name;
      }
      at = no_data ? data : data + round_up(size);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(name_ + ": " + why);
  }

  // `n` (<= kWindow) bytes at `offset`, which lie inside the file.
  const std::byte* view(std::uint64_t offset, std::size_t n) {
    if (offset < window_at_ || offset + n > window_at_ + window_.size()) {
      window_.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kWindow, size_ - offset)));
      const std::size_t got = read_(offset, window_);
      window_.resize(got);
      window_at_ = offset;
      if (got < n) {
        fail("truncated: the file ended while it was read" + at_byte(offset + got) +
             " (it shrank?)");
      }
    }
    return window_.data() + (offset - window_at_);
  }

  // The data of an extended header ('L', 'x', 'g').
  std::string payload(std::uint64_t data, std::uint64_t size, char type) {
    if (size > (std::uint64_t{1} << 20)) {
      fail(std::string("corrupt tar: a '") + type + "' extended header of " + std::to_string(size) +
           " bytes" + at_byte(data - kBlock));
    }
    if (data > size_ || size > size_ - data) {
      fail("truncated: an extended header runs past the end of the file" + at_byte(data - kBlock) +
           " (a partial download?)");
    }
    std::string text(static_cast<std::size_t>(size), '\0');
    std::size_t done = 0;
    while (done < text.size()) {
      const std::size_t n = std::min(kWindow, text.size() - done);
      std::memcpy(text.data() + done, view(data + done, n), n);
      done += n;
    }
    return text;
  }

  // pax records: "<length> <key>=<value>\n", the length counting the whole record.
  void parse_pax(const std::string& text, std::map<std::string, std::string>& into,
                 std::uint64_t data) {
    std::size_t at = 0;
    while (at < text.size()) {
      if (text[at] == '\0') break;  // padding
      std::size_t len = 0;
      std::size_t i = at;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9' && len < text.size()) {
        len = len * 10 + static_cast<std::size_t>(text[i] - '0');
        ++i;
      }
      if (i == at || i >= text.size() || text[i] != ' ' || len <= i - at ||
          len > text.size() - at || text[at + len - 1] != '\n') {
        fail("corrupt tar: malformed pax header" + at_byte(data - kBlock));
      }
      const std::string record = text.substr(i + 1, at + len - 1 - (i + 1));
      const std::size_t eq = record.find('=');
      if (eq == std::string::npos) fail("corrupt tar: malformed pax record" + at_byte(data));
      const std::string key = record.substr(0, eq);
      if (key == "path" || key == "size") into[key] = record.substr(eq + 1);
      at += len;
    }
  }

  std::uint64_t pax_number(const std::string& s, std::uint64_t data) const {
    std::uint64_t v = 0;
    if (s.empty() || s.size() > 19) fail("corrupt tar: bad pax size" + at_byte(data));
    for (char c : s) {
      if (c < '0' || c > '9') fail("corrupt tar: bad pax size" + at_byte(data));
      v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return v;
  }

  const ReadAt& read_;
  const std::uint64_t size_;
  const std::string& name_;
  std::vector<std::byte> window_;
  std::uint64_t window_at_ = 0;
  std::string last_;  // the last member indexed, for errors
};

}  // namespace

std::vector<TarMember> index_tar(const ReadAt& read, std::uint64_t file_size,
                                 const std::string& name) {
  return Indexer(read, file_size, name).run();
}

std::vector<TarMember> index_tar(const io::File& file) {
  const ReadAt read = [&](std::uint64_t offset, std::span<std::byte> dst) {
    return file.read_at(offset, dst.data(), dst.size());
  };
  return index_tar(read, file.size(), file.name());
}

std::vector<TarMember> index_tar_file(const std::string& path) {
  return index_tar(*io::open_local(path));
}

}  // namespace stoker::detail
