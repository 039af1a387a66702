// stoker.VideoClips's C++ side (include/stoker/video.h), bound where the build found FFmpeg's
// libraries (STOKER_HAVE_VIDEO: cmake/video.cmake).
#pragma once

#include <pybind11/pybind11.h>

namespace stoker::python {

// Adds video_clips() (a NativeDataset over stoker::VideoClips, made with the GIL released) and
// the functions that read its index and counters.
void bind_video(pybind11::module_& m);

}  // namespace stoker::python
