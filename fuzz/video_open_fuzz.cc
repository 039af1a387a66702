// Fuzzes stoker::VideoClips over one video file (FFmpeg's libraries read it; built where they
// are found): indexing it (frame times, keyframes), placing clips, and decoding every clip by
// frame stride and by frame rate, with uniform and random clips. Any outcome but success or
// std::exception is a bug.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "mem_file.h"
#include "stoker/video.h"

namespace {

// Reads every clip (at most 8) of the video at `path` with these options; every failure is an
// exception.
void read_clips(const std::string& path, int stride, double fps,
                stoker::VideoClipsOptions::Sampling sampling) {
  try {
    stoker::VideoClipsOptions o;
    o.paths = {path};
    o.frames = 3;
    o.stride = stride;
    o.fps = fps;
    o.sampling = sampling;
    o.clips_per_video = 2;
    o.height = 8;
    o.width = 12;
    o.storage.index_cache = false;
    o.index_threads = 1;
    stoker::VideoClips d(o);
    const auto fields = d.fields();
    std::vector<std::vector<std::byte>> out;
    std::vector<std::size_t> bytes;
    std::vector<std::byte*> bases;
    for (const auto& f : fields) {
      out.emplace_back(f.bytes());
      bytes.push_back(f.bytes());
    }
    for (auto& b : out) bases.push_back(b.data());
    if (d.frame_times(0).size() != d.keyframes(0).size()) __builtin_trap();
    for (std::size_t i = 0; i < d.size() && i < 8; ++i) {
      (void)d.sample_name(i);
      try {
        for (const std::size_t f : d.clip_frames(i, 7)) {
          if (f >= d.frame_times(0).size()) __builtin_trap();  // a frame the video lacks
        }
        d.read(i, stoker::SampleOut(bytes, bases.data(), 0, 1));
      } catch (const std::exception&) {
      }
    }
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const MemFile file("fuzz.mp4", data, size);  // the data set reads files
  if (!file.ok()) return 0;
  using Sampling = stoker::VideoClipsOptions::Sampling;
  read_clips(file.path(), 1, 0, Sampling::uniform);
  read_clips(file.path(), 2, 7.5, Sampling::random);
  return 0;
}
