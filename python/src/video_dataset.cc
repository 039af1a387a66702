#include "video_dataset.h"

#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fields.h"
#include "native_datasets.h"
#include "stoker/video.h"

namespace stoker::python {
namespace {

const VideoClips& clips_of(const NativeDataset& d) {
  const auto* v = dynamic_cast<const VideoClips*>(d.dataset.get());
  if (v == nullptr) throw py::type_error("stoker: not a VideoClips data set");
  return *v;
}

NativeDataset make_video_clips(const std::vector<std::string>& paths, int frames, int stride,
                               double fps, int height, int width, bool center_crop,
                               const std::string& sampling, int clips_per_video,
                               const std::string& index_cache_dir, bool index_cache,
                               const std::string& object_cache_dir,
                               std::uint64_t object_cache_bytes) {
  VideoClipsOptions o;
  o.paths = paths;
  o.frames = frames;
  o.stride = stride;
  o.fps = fps;
  o.height = height;
  o.width = width;
  o.center_crop = center_crop;
  if (sampling == "uniform") {
    o.sampling = VideoClipsOptions::Sampling::uniform;
  } else if (sampling == "random") {
    o.sampling = VideoClipsOptions::Sampling::random;
  } else {
    throw py::value_error("stoker.VideoClips: clips must be 'uniform' or 'random', not '" +
                          sampling + "'");
  }
  o.clips_per_video = clips_per_video;
  o.storage =
      object_storage_options(index_cache_dir, index_cache, object_cache_dir, object_cache_bytes);
  NativeDataset out;
  {
    py::gil_scoped_release nogil;  // indexing the files takes a while
    out.dataset = std::make_shared<VideoClips>(std::move(o));
  }
  out.element_types = {"uint8", "int64", "float64"};
  return out;
}

}  // namespace

void bind_video(py::module_& m) {
  m.def("video_clips", &make_video_clips, py::arg("paths"), py::arg("frames"), py::arg("stride"),
        py::arg("fps"), py::arg("height"), py::arg("width"), py::arg("center_crop"),
        py::arg("sampling"), py::arg("clips_per_video"), py::arg("index_cache_dir"),
        py::arg("index_cache"), py::arg("object_cache_dir") = "",
        py::arg("object_cache_bytes") = std::uint64_t{10} << 30);
  m.def("video_paths", [](const NativeDataset& d) {
    const VideoClips& v = clips_of(d);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < v.videos(); ++i) out.push_back(v.path(i));
    return out;
  });
  m.def("video_labels", [](const NativeDataset& d) {
    const VideoClips& v = clips_of(d);
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < v.videos(); ++i) out.push_back(v.label(i));
    return out;
  });
  m.def("video_classes", [](const NativeDataset& d) { return clips_of(d).classes(); });
  m.def("video_frame_times",
        [](const NativeDataset& d, std::size_t video) { return clips_of(d).frame_times(video); });
  m.def("video_keyframes",
        [](const NativeDataset& d, std::size_t video) { return clips_of(d).keyframes(video); });
  m.def("video_clip_frames", [](const NativeDataset& d, std::size_t index, std::uint64_t seed) {
    return clips_of(d).clip_frames(index, seed);
  });
  m.def("video_counters",
        [](const NativeDataset& d) { return fields_dict(clips_of(d).counters()); });
}

}  // namespace stoker::python
