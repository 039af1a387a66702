#include "stoker/frontend/object_files.h"

#include <algorithm>
#include <span>
#include <stdexcept>

#include "io/file.h"
#include "io/remote.h"
#include "source/resolve.h"

namespace stoker::detail {
namespace {

class Object final : public ObjectFile {
 public:
  Object(io::FilePtr file, RemoteHandle remote)
      : file_(std::move(file)), remote_(std::move(remote)) {}

  const std::string& url() const override { return file_->name(); }
  std::uint64_t size() const override { return file_->size(); }
  const std::string& etag() const override { return object().etag; }
  std::size_t read_at(std::uint64_t offset, std::byte* dst, std::size_t n,
                      bool exact) const override {
    if (!exact) return file_->read_at(offset, dst, n);
    const std::uint64_t left = offset < size() ? size() - offset : 0;
    const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(left, n));
    file_->read_uncached(offset, dst, count);
    return count;
  }
  void will_read(const std::vector<Range>& ranges) const override {
    file_->will_read(std::span<const Range>(ranges));
  }
  std::shared_ptr<ObjectFile> cut_at(std::vector<std::uint64_t> starts) const override {
    RemoteObject cut = object();
    cut.chunk_starts = std::make_shared<const std::vector<std::uint64_t>>(std::move(starts));
    return std::make_shared<Object>(io::open_object(std::move(cut), remote_), remote_);
  }
  ObjectStorageCounters counters() const override { return remote_->counters(); }

 private:
  const RemoteObject& object() const {
    const RemoteObject* object = file_->object();
    if (object == nullptr) throw std::logic_error(url() + ": not an object");  // never: opened so
    return *object;
  }

  io::FilePtr file_;
  RemoteHandle remote_;
};

}  // namespace

std::vector<std::shared_ptr<ObjectFile>> open_object_files(const std::vector<std::string>& urls,
                                                           const std::string& suffix,
                                                           const ObjectStorageOptions& options) {
  Resolver resolver(options, "objects");
  std::vector<std::shared_ptr<ObjectFile>> out;
  for (auto& per_url : resolver.objects(urls, suffix)) {
    for (auto& file : per_url)
      out.push_back(std::make_shared<Object>(std::move(file), resolver.remote()));
  }
  return out;
}

}  // namespace stoker::detail
