// torchvision.datasets.ImageFolder's rules, as pure functions: which names are images, and the
// classes, order and labels of a folder given as keys (an s3:// listing; tested on its own in
// tests/encoded_source_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::detail {

// torchvision.datasets.folder.IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp),
// matched on the lower-cased name; and the list, for messages.
bool has_image_extension(std::string_view name);
std::string image_extensions();

struct FolderLayout {
  std::vector<std::string> classes;  // sorted
  std::vector<std::size_t> images;   // indices into the keys, in torchvision's order
  std::vector<std::int64_t> labels;  // per image
  std::string empty;                 // the classes with no image, ", "-separated ("": none)
};

// The layout of a folder given as the keys below its root ("cat/sub/x.jpg"), in any order: a
// class is the first component of a key that has a '/' after it (keys without one belong to no
// class; a key ending in '/' is a folder marker, no image), and a class's images are ordered as
// sorted(os.walk(class_dir)) then sorted(files) order them: by "directory" (the key up to its
// last '/'), then by name.
FolderLayout image_folder_layout(const std::vector<std::string_view>& keys);

}  // namespace stoker::detail
