// Video clips: a map-style data set of short clips cut from video files, decoded with FFmpeg's
// libraries (libavformat, libavcodec; libswscale converts pixel formats only) straight into the
// batch slab, resized by stoker's own resampling (Pillow's antialiased bilinear filter).
//
// At construction every file is demuxed once (packets only, nothing decoded), in parallel, into
// an index of its frames' presentation timestamps and keyframes, kept in memory and cached on
// disk beside the other indexes (keyed by path, size and modification time). A clip is a list
// of frames of that index; its read seeks to the keyframe at or before the clip's first frame and
// decodes up to its last frame, selecting frames by presentation timestamp (so variable-frame-
// rate files give the right frames). Decoders are kept open between reads (a pool per data set,
// at most a few per worker thread) and continue from where they stopped when the next clip of the
// same file lies ahead; all are freed with the data set. docs/formats.md, "Video".
//
// Built when FFmpeg's development packages are found (cmake/video.cmake: STOKER_HAVE_VIDEO).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/object_storage.h"

namespace stoker {

struct VideoClipsOptions {
  // Video files, or directories: a directory's video files (.mp4 .m4v .mov .mkv .webm .avi), in
  // sorted order; a directory whose sub-directories hold videos is read as torchvision's
  // ImageFolder layout (root/<class>/<video>, classes sorted, the label the class's index).
  // A .tar file is a WebDataset shard: its video members are read in place, each labelled by
  // its sample's .cls member when it has one. Otherwise the label is the video's index. URLs
  // (docs/storage.md): an s3:// or http(s):// video or .tar object, or an s3:// prefix (every
  // video and .tar object below it, in key order), read through the object cache.
  std::vector<std::string> paths;

  int frames = 16;  // frames per clip
  // The frames of a clip: every `stride`-th frame of the video from the clip's first, or, when
  // `fps` > 0, the frames shown at the times start + k / fps (the last frame whose presentation
  // time is at or before each), whatever the file's own frame rate.
  int stride = 1;
  double fps = 0;

  enum class Sampling : std::uint8_t {
    uniform,  // clips_per_video clips evenly spaced over each video (the same every epoch)
    random,   // clips_per_video clips per video each epoch, placed by the sample's seed
  };
  Sampling sampling = Sampling::uniform;
  int clips_per_video = 1;

  // Output: uint8 [frames, 3, height, width] RGB. `center_crop`: the frames are cropped to the
  // output's aspect ratio (the largest centered box) before they are resized; otherwise the
  // whole frame is resized.
  int height = 224;
  int width = 224;
  bool center_crop = false;

  int index_threads = 0;  // threads that index the files at construction; 0: one per core

  // The index cache (storage.index_cache_dir: "" the default place, $STOKER_CACHE_DIR/video,
  // else $XDG_CACHE_HOME/stoker/video, else ~/.cache/stoker/video; storage.index_cache false:
  // none) and, for URLs, the object cache (storage.object_cache_dir, object_cache_bytes).
  ObjectStorageOptions storage;
};

// Fields: "clip" (u8 [frames, 3, height, width]), "label" (i64) and "start_pts" (f64: the
// presentation time of the clip's first frame, in seconds). size() is videos x clips_per_video;
// sample i is clip i % clips_per_video of video i / clips_per_video.
//
// Errors: a file the index cannot read (not a video, a truncated MP4, a missing moov atom, no
// video stream such as an audio-only file, no frames, no decoder for its codec) throws
// std::runtime_error from the constructor naming the file and the reason; a clip that fails to
// decode throws std::runtime_error from read() naming the file and the reason (the loader's
// on_error then applies). A video shorter than a clip gives clips that repeat its last frame.
//
// Thread safety: read() may be called from any thread.
class VideoClips final : public Dataset {
 public:
  explicit VideoClips(VideoClipsOptions options);
  ~VideoClips() override;
  VideoClips(const VideoClips&) = delete;
  VideoClips& operator=(const VideoClips&) = delete;

  std::size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void read(std::size_t index, const SampleOut& out) const override;
  std::string sample_name(std::size_t index) const override;
  std::vector<std::string> cheaper_reads() const override;

  const VideoClipsOptions& options() const;
  std::size_t videos() const;
  const std::string& path(std::size_t video) const;
  std::int64_t label(std::size_t video) const;
  std::vector<std::string> classes() const;  // empty unless the class-folder layout

  // The index of a video: its frames' presentation times in seconds, ascending, and which of
  // them are keyframes (the same length).
  std::vector<double> frame_times(std::size_t video) const;
  std::vector<bool> keyframes(std::size_t video) const;

  // The frames (indices into frame_times(video)) that sample `index` read with `seed` shows,
  // one per clip frame.
  std::vector<std::size_t> clip_frames(std::size_t index, std::uint64_t seed) const;

  struct Counters {
    std::uint64_t decoded_frames = 0;  // frames the decoders output (the decode work)
    std::uint64_t seeks = 0;           // reads that seeked to a keyframe
    std::uint64_t continued = 0;       // reads that went on decoding from a previous read
    std::uint64_t opened = 0;          // decoders opened (a file each)
    std::uint64_t indexed = 0;         // files indexed at construction (not from the cache)
    std::uint64_t from_cache = 0;      // indexes read from the cache
  };
  Counters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// VideoClips::Counters' field table for the front ends (as encoded.h's; src/field_tables.cc
// checks that it names every member).
template <class Visit>
void for_each_field(const VideoClips::Counters& c, Visit&& visit) {
  visit("decoded_frames", c.decoded_frames);
  visit("seeks", c.seeks);
  visit("continued", c.continued);
  visit("opened", c.opened);
  visit("indexed", c.indexed);
  visit("from_cache", c.from_cache);
}

}  // namespace stoker
