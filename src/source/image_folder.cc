// torchvision.datasets.ImageFolder's layout as an EncodedSource.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "source/file_util.h"
#include "stoker/encoded.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// torchvision.datasets.folder.IMG_EXTENSIONS, matched on the lower-cased name.
constexpr const char* kExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                       ".pgm", ".tif",  ".tiff", ".webp"};

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* ext : kExtensions) {
    const std::string e(ext);
    if (lower.size() >= e.size() && lower.compare(lower.size() - e.size(), e.size(), e) == 0) {
      return true;
    }
  }
  return false;
}

class ImageFolderSource final : public EncodedSource {
 public:
  explicit ImageFolderSource(const std::string& root) : root_(root) {
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
    // torchvision's ImageFolder refuses a class folder without images (a label no sample
    // has): FileNotFoundError, "Found no valid file for the classes ...".
    if (!empty.empty()) {
      std::string extensions;
      for (const char* ext : kExtensions)
        extensions += (extensions.empty() ? "" : ", ") + std::string(ext);
      throw std::runtime_error(root + ": found no valid file for the classes " + empty +
                               " (supported extensions: " + extensions + ")");
    }
  }

  std::size_t size() const override { return paths_.size(); }
  std::int64_t label(std::size_t index) const override { return labels_.at(index); }
  std::string name(std::size_t index) const override { return paths_.at(index); }
  std::vector<std::string> classes() const override { return classes_; }

  void read(std::size_t index, EncodedBytes& out) const override {
    const std::string& path = paths_.at(index);
    detail::read_whole_file(path, out.storage);
    out.bytes = {out.storage.data(), out.storage.size()};
    storage_reads_.add(out.storage.size());
  }

  Counters counters() const override { return storage_reads_.counters(); }

 private:
  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<std::int64_t> labels_;
  mutable detail::StorageReads storage_reads_;
};

}  // namespace

std::shared_ptr<EncodedSource> open_image_folder(const std::string& root) {
  return std::make_shared<ImageFolderSource>(root);
}

}  // namespace stoker
