// torchvision.datasets.ImageFolder's layout as an EncodedSource.
#include "source/image_folder.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "io/file.h"
#include "io/object_store.h"
#include "io/remote.h"
#include "source/file_util.h"
#include "source/resolve.h"
#include "stoker/encoded.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

using detail::has_image_extension;

class ImageFolderSource final : public EncodedSource {
 public:
  ImageFolderSource(const std::string& root, const ObjectStorageOptions& remote) : root_(root) {
    const detail::PathKind kind = detail::path_kind(root, "");
    if (kind == detail::PathKind::object || kind == detail::PathKind::prefix) {
      open_remote(remote);
      return;
    }
    std::error_code ec;
    if (!fs::is_directory(root, ec)) {
      throw std::runtime_error(root + ": not a directory");
    }
    // classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (entry.is_directory(ec)) classes_.push_back(entry.path().filename().string());
    }
    if (ec) throw std::runtime_error(root + ": cannot list: " + ec.message());
    std::sort(classes_.begin(), classes_.end());
    if (classes_.empty()) throw std::runtime_error(root + ": no class folders");
    // For each class: sorted(os.walk(class_dir, followlinks=True)), files sorted by name.
    std::string empty;  // the classes with no image, as torchvision names them
    for (std::size_t c = 0; c < classes_.size(); ++c) {
      const std::size_t before = paths_.size();
      const fs::path class_dir = fs::path(root) / classes_[c];
      std::vector<std::string> dirs{class_dir.string()};
      for (auto it = fs::recursive_directory_iterator(
               class_dir, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_directory(ec)) dirs.push_back(it->path().string());
      }
      std::sort(dirs.begin(), dirs.end());
      for (const auto& dir : dirs) {
        std::vector<std::string> names;
        for (const auto& entry : fs::directory_iterator(dir, ec)) {
          const std::string name = entry.path().filename().string();
          if (!entry.is_directory(ec) && has_image_extension(name)) names.push_back(name);
        }
        std::sort(names.begin(), names.end());
        for (auto& n : names) {
          paths_.push_back((fs::path(dir) / n).string());
          labels_.push_back(static_cast<std::int64_t>(c));
        }
      }
      if (paths_.size() == before) empty += (empty.empty() ? "" : ", ") + classes_[c];
    }
    refuse_empty_classes(empty);
  }

  std::size_t size() const override { return labels_.size(); }
  std::int64_t label(std::size_t index) const override { return labels_.at(index); }
  std::string name(std::size_t index) const override {
    return files_ ? objects_.at(index).url : paths_.at(index);
  }
  std::vector<std::string> classes() const override { return classes_; }

  // An image in object storage as a File, read through the object cache.
  io::FilePtr object(std::size_t index) const {
    return io::open_object(objects_.at(index), files_);
  }

  void read(std::size_t index, EncodedBytes& out) const override {
    if (files_) {  // the whole object
      const io::FilePtr f = object(index);
      out.storage.resize(static_cast<std::size_t>(f->size()));
      try {
        out.storage.resize(f->read_at(0, out.storage.data(), out.storage.size()));
      } catch (const std::exception& e) {
        throw std::runtime_error(f->name() + ": " + e.what());
      }
    } else {  // a local file, read whole with no File made (no allocation per sample)
      io::read_local_file(paths_.at(index), out.storage);
    }
    out.bytes = {out.storage.data(), out.storage.size()};
    storage_reads_.add(out.storage.size());
  }

  Counters counters() const override { return storage_reads_.counters(); }
  std::uint64_t ahead_bytes() const override { return files_ ? files_->ahead_bytes() : 0; }

  bool will_read(std::span<const std::size_t> rows) const noexcept override {
    return detail::rows_at_hand(
        rows, static_cast<bool>(files_), objects_.size(),
        [&](std::size_t index) { return object(index)->will_read(0, objects_[index].size); });
  }
  bool file_per_sample() const override { return true; }
  std::vector<ObjectVersion> objects() const override {
    std::vector<ObjectVersion> out;
    out.reserve(objects_.size());
    for (const auto& o : objects_) out.push_back({o.url, o.size, o.etag});
    return out;
  }
  ObjectStorageCounters object_storage() const override {
    return files_ ? files_->counters() : ObjectStorageCounters{};
  }

 private:
  // torchvision's ImageFolder refuses a class folder without images (a label no sample has):
  // FileNotFoundError, "Found no valid file for the classes ...".
  void refuse_empty_classes(const std::string& empty) const {
    if (empty.empty()) return;
    throw std::runtime_error(root_ + ": found no valid file for the classes " + empty +
                             " (supported extensions: " + detail::image_extensions() + ")");
  }

  // An s3:// prefix: one recursive listing (the processes of a node take turns; the ranks of a
  // torchrun job share it), or the objects given as known. A class is a first-level "folder"
  // (a key with a '/' after its first component); within a class, images in the order of
  // sorted(os.walk()): by "directory" (the key up to its last '/'), then by name.
  void open_remote(const ObjectStorageOptions& o) {
    std::string prefix = root_;
    if (!prefix.ends_with('/')) prefix += '/';
    detail::Resolver resolver(o, "image folder");
    std::vector<detail::RemoteObject> listed = resolver.list_all(prefix);
    files_ = resolver.remote();
    if (listed.empty()) {
      throw io::ObjectStoreError(io::ObjectStoreError::Kind::kNotFound, root_, 404, "",
                                 prefix +
                                     ": no objects under this prefix (an image folder's "
                                     "classes are the first level of keys below it)");
    }
    std::vector<std::string_view> keys;
    keys.reserve(listed.size());
    for (const auto& object : listed) {
      const std::string& url = object.url;
      keys.push_back(url.starts_with(prefix) ? std::string_view(url).substr(prefix.size())
                                             : std::string_view());
    }
    detail::FolderLayout layout = detail::image_folder_layout(keys);
    if (layout.classes.empty()) throw std::runtime_error(prefix + ": no class folders");
    refuse_empty_classes(layout.empty);
    classes_ = std::move(layout.classes);
    labels_ = std::move(layout.labels);
    objects_.reserve(layout.images.size());
    for (const std::size_t i : layout.images) objects_.push_back(std::move(listed[i]));
  }

  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<std::int64_t> labels_;
  detail::RemoteHandle files_;                 // an s3:// prefix: its object cache
  std::vector<detail::RemoteObject> objects_;  // and its images, as paths_ are a folder's
  mutable detail::StorageReads storage_reads_;
};

}  // namespace

namespace detail {

namespace {
// torchvision.datasets.folder.IMG_EXTENSIONS.
constexpr const char* kExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                       ".pgm", ".tif",  ".tiff", ".webp"};
}  // namespace

bool has_image_extension(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* ext : kExtensions) {
    if (lower.ends_with(ext)) return true;
  }
  return false;
}

std::string image_extensions() {
  std::string out;
  for (const char* ext : kExtensions) out += (out.empty() ? "" : ", ") + std::string(ext);
  return out;
}

FolderLayout image_folder_layout(const std::vector<std::string_view>& keys) {
  struct Image {
    std::string_view cls, dir, name;
    std::size_t key;
  };
  FolderLayout out;
  std::vector<Image> images;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::string_view key = keys[i];
    const std::size_t first = key.find('/');
    if (first == std::string_view::npos || first == 0) continue;  // in no class folder
    const std::string_view cls = key.substr(0, first);
    if (out.classes.empty() || out.classes.back() != cls) out.classes.emplace_back(cls);
    const std::size_t last = key.rfind('/');
    const std::string_view name = key.substr(last + 1);
    if (name.empty() || !has_image_extension(name)) continue;  // a folder marker, not an image
    images.push_back({cls, key.substr(0, last), name, i});
  }
  std::sort(out.classes.begin(), out.classes.end());
  out.classes.erase(std::unique(out.classes.begin(), out.classes.end()), out.classes.end());
  std::sort(images.begin(), images.end(), [](const Image& a, const Image& b) {
    return std::tie(a.cls, a.dir, a.name) < std::tie(b.cls, b.dir, b.name);
  });
  std::size_t at = 0;
  for (std::size_t c = 0; c < out.classes.size(); ++c) {
    const std::size_t before = out.images.size();
    for (; at < images.size() && images[at].cls == out.classes[c]; ++at) {
      out.images.push_back(images[at].key);
      out.labels.push_back(static_cast<std::int64_t>(c));
    }
    if (out.images.size() == before) out.empty += (out.empty.empty() ? "" : ", ") + out.classes[c];
  }
  return out;
}

}  // namespace detail

std::shared_ptr<EncodedSource> open_image_folder(const std::string& root,
                                                 const ObjectStorageOptions& remote) {
  return std::make_shared<ImageFolderSource>(root, remote);
}

}  // namespace stoker
