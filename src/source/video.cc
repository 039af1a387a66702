// VideoClips (include/stoker/video.h): the index of each file (demuxed packets, cached on
// disk), the clips planned from it, and their reads: seek to the keyframe, decode to the last
// frame, frames chosen by presentation timestamp, resized by stoker's resampling plane by plane
// and converted to RGB at the output's size straight into the batch slab (libswscale converts
// formats other than planar 8-bit YUV to RGB first).
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "image/resample.h"
#include "io/file.h"
#include "io/remote.h"  // default_cache_dir
#include "source/file_util.h"
#include "source/index_cache.h"
#include "source/resolve.h"
#include "source/tar_index.h"
#include "stoker/frontend/mutex.h"
#include "stoker/video.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, buf, sizeof buf);
  return buf;
}

constexpr const char* kVideoExtensions[] = {".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"};

bool has_video_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* e : kVideoExtensions) {
    if (ext == e) return true;
  }
  return false;
}

// The video files below `dir`, recursively, sorted by path.
std::vector<std::string> videos_below(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(
           dir, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_directory(ec) && has_video_extension(it->path()))
      out.push_back(it->path().string());
  }
  if (ec) throw std::runtime_error(dir.string() + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---------------------------------------------------------------------------- the index

struct Keyframe {
  std::int64_t pts = 0;      // its presentation timestamp
  std::int64_t seek_ts = 0;  // what av_seek_frame is given to land on it (its pts, else dts)
};

struct VideoIndex {
  int stream = -1;
  int tb_num = 1, tb_den = 1;
  int width = 0, height = 0;
  std::vector<std::int64_t> pts;  // every frame's presentation timestamp, ascending
  std::vector<std::uint8_t> key;  // per frame: a keyframe
  std::vector<Keyframe> keys;     // ascending by pts

  double seconds(std::int64_t t) const { return static_cast<double>(t) * tb_num / tb_den; }
  // The keyframe at or before frame `f` (the first keyframe if none is).
  std::size_t key_before(std::size_t f) const {
    const std::int64_t p = pts[f];
    auto it = std::upper_bound(keys.begin(), keys.end(), p,
                               [](std::int64_t v, const Keyframe& k) { return v < k.pts; });
    return it == keys.begin() ? 0 : static_cast<std::size_t>(it - keys.begin() - 1);
  }
};

struct FileStat {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
};

FileStat stat_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) detail::throw_errno(path, "cannot stat");
  return {static_cast<std::uint64_t>(st.st_size),
          static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// Where a video's bytes are: a file of its own, a member of a tar (a WebDataset shard) read in
// place, or an object (or a member of a tar object) read through the object cache.
struct VideoBytes {
  std::string file;  // a local file's path ("" for an object)
  bool member = false;
  std::uint64_t offset = 0;  // a member's data in the tar
  std::uint64_t size = 0;    // and its bytes
  std::optional<detail::RemoteObject> object;
  io::FilePtr io;  // a member's or an object's bytes, read by FFmpeg through MemberIO
  bool custom_io() const { return io != nullptr; }
};

// A tar member or an object as FFmpeg's input (a custom AVIOContext): reads and seeks within
// its File (a slice of the tar, an object read through the object cache).
struct MemberIO {
  io::FilePtr file;
  std::uint64_t size = 0, pos = 0;
};

int member_read(void* opaque, std::uint8_t* buf, int n) {
  auto* m = static_cast<MemberIO*>(opaque);
  const std::uint64_t left = m->size - m->pos;
  if (left == 0 || n <= 0) return AVERROR_EOF;
  const auto want =
      static_cast<std::size_t>(std::min<std::uint64_t>(left, static_cast<unsigned>(n)));
  std::size_t got = 0;
  try {  // the store's retries happen here; what is left after them is the read's error
    got = m->file->read_at(m->pos, reinterpret_cast<std::byte*>(buf), want);
  } catch (const std::exception&) {
    return AVERROR(EIO);
  }
  if (got == 0) return AVERROR_EOF;  // the tar is shorter than its index says
  m->pos += got;
  return static_cast<int>(got);
}

std::int64_t member_seek(void* opaque, std::int64_t offset, int whence) {
  auto* m = static_cast<MemberIO*>(opaque);
  const auto size = static_cast<std::int64_t>(m->size);
  if (whence & AVSEEK_SIZE) return size;
  whence &= ~AVSEEK_FORCE;
  std::int64_t base = 0;
  if (whence == SEEK_CUR) {
    base = static_cast<std::int64_t>(m->pos);
  } else if (whence == SEEK_END) {
    base = size;
  } else if (whence != SEEK_SET) {
    return AVERROR(EINVAL);
  }
  if (offset > size - base || base + offset < 0) return AVERROR(EINVAL);
  m->pos = static_cast<std::uint64_t>(base + offset);
  return base + offset;
}

// Frees a member's AVIOContext (its buffer and its MemberIO); null: nothing.
void free_member_io(AVIOContext* pb) {
  if (pb == nullptr) return;
  delete static_cast<MemberIO*>(pb->opaque);
  av_freep(&pb->buffer);
  avio_context_free(&pb);
}

// Closes an input and, for a tar member, its AVIOContext (FFmpeg leaves a custom one to us).
void close_format(AVFormatContext*& f) {
  if (f == nullptr) return;
  AVIOContext* pb = (f->flags & AVFMT_FLAG_CUSTOM_IO) ? f->pb : nullptr;
  avformat_close_input(&f);
  free_member_io(pb);
}

struct FormatCloser {
  void operator()(AVFormatContext* f) const { close_format(f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFree>;

FormatPtr open_format(const std::string& path, const VideoBytes& at) {
  AVFormatContext* raw = nullptr;
  AVIOContext* pb = nullptr;
  if (at.custom_io()) {
    auto io = std::make_unique<MemberIO>();
    io->file = at.io;
    io->size = at.io->size();
    constexpr int kBuffer = 64 << 10;
    auto* buffer = static_cast<unsigned char*>(av_malloc(kBuffer));
    if (buffer == nullptr) throw std::bad_alloc();
    pb = avio_alloc_context(buffer, kBuffer, 0, io.get(), member_read, nullptr, member_seek);
    if (pb == nullptr) {
      av_free(buffer);
      throw std::bad_alloc();
    }
    io.release();  // pb->opaque: freed with pb
    raw = avformat_alloc_context();
    if (raw == nullptr) {
      free_member_io(pb);
      throw std::bad_alloc();
    }
    raw->pb = pb;
    raw->flags |= AVFMT_FLAG_CUSTOM_IO;
  }
  const int rc =
      avformat_open_input(&raw, at.custom_io() ? path.c_str() : at.file.c_str(), nullptr, nullptr);
  if (rc < 0) {
    free_member_io(pb);  // avformat_open_input freed the context, not a custom AVIOContext
    std::string why = av_error(rc);
    if (rc == AVERROR_INVALIDDATA) {
      why += " (not a video FFmpeg can read: a truncated file, an MP4 without its moov atom?)";
    }
    throw std::runtime_error(path + ": cannot open: " + why);
  }
  return FormatPtr(raw);
}

// The file's video stream (not a cover picture): its index, or an error naming what it has.
int video_stream(AVFormatContext* fmt, const std::string& path) {
  int audio = 0;
  for (unsigned i = 0; i < fmt->nb_streams; ++i) {
    const AVStream* st = fmt->streams[i];
    if (st->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
        !(st->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
      return static_cast<int>(i);
    }
    if (st->codecpar->codec_type == AVMEDIA_TYPE_AUDIO) ++audio;
  }
  if (audio > 0) throw std::runtime_error(path + ": no video stream (audio only)");
  if (fmt->nb_streams == 0) {
    throw std::runtime_error(path +
                             ": no streams (an empty video, a truncated file, an MP4 "
                             "without its moov atom?)");
  }
  throw std::runtime_error(path + ": no video stream (" + std::to_string(fmt->nb_streams) +
                           " other streams; a truncated file, an MP4 without its moov atom?)");
}

// Demuxes every packet of the file's video stream (nothing decoded).
VideoIndex build_index(const std::string& path, const VideoBytes& at) {
  FormatPtr fmt = open_format(path, at);
  int s = video_stream(fmt.get(), path);
  AVStream* st = fmt->streams[s];
  if (st->codecpar->width <= 0 || st->codecpar->codec_id == AV_CODEC_ID_NONE) {
    const int rc = avformat_find_stream_info(fmt.get(), nullptr);
    if (rc < 0) throw std::runtime_error(path + ": cannot read its streams: " + av_error(rc));
  }
  const AVCodec* codec = avcodec_find_decoder(st->codecpar->codec_id);
  if (codec == nullptr) {
    throw std::runtime_error(path + ": no decoder for its video codec " +
                             avcodec_get_name(st->codecpar->codec_id));
  }
  for (unsigned i = 0; i < fmt->nb_streams; ++i) {
    if (static_cast<int>(i) != s) fmt->streams[i]->discard = AVDISCARD_ALL;
  }
  VideoIndex index;
  index.stream = s;
  index.tb_num = st->time_base.num;
  index.tb_den = st->time_base.den;
  index.width = st->codecpar->width;
  index.height = st->codecpar->height;
  if (index.tb_num <= 0 || index.tb_den <= 0) {
    throw std::runtime_error(path + ": its video stream has no time base");
  }

  struct Packet {
    std::int64_t pts;
    std::int64_t seek_ts;
    bool key;
  };
  std::vector<Packet> packets;
  std::int64_t demuxed = 0;  // packets of the stream, discarded ones included
  PacketPtr pkt(av_packet_alloc());
  if (!pkt) throw std::bad_alloc();
  for (;;) {
    const int rc = av_read_frame(fmt.get(), pkt.get());
    if (rc == AVERROR_EOF) break;
    if (rc < 0) throw std::runtime_error(path + ": cannot read its packets: " + av_error(rc));
    if (pkt->stream_index == s) {
      ++demuxed;
      if (pkt->flags & AV_PKT_FLAG_CORRUPT) {
        av_packet_unref(pkt.get());
        throw std::runtime_error(path + ": packet " + std::to_string(demuxed) +
                                 " is corrupt or cut short (a truncated file?)");
      }
      if (!(pkt->flags & AV_PKT_FLAG_DISCARD)) {  // not shown (an edit list's pre-roll)
        const std::int64_t pts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
        if (pts == AV_NOPTS_VALUE) {
          av_packet_unref(pkt.get());
          throw std::runtime_error(path + ": its video packets have no timestamps");
        }
        const std::int64_t seek = pts;
        packets.push_back({pts, seek, (pkt->flags & AV_PKT_FLAG_KEY) != 0});
      }
    }
    av_packet_unref(pkt.get());
  }
  // A container that lists its samples (MP4's moov) names more than a cut-short file holds.
  const int listed = avformat_index_get_entries_count(st);
  if (fmt->iformat && std::strstr(fmt->iformat->name, "mp4") != nullptr && listed > demuxed) {
    throw std::runtime_error(path + ": truncated: its index lists " + std::to_string(listed) +
                             " video frames, the file holds " + std::to_string(demuxed));
  }
  if (packets.empty()) throw std::runtime_error(path + ": no frames in its video stream");
  std::sort(packets.begin(), packets.end(),
            [](const Packet& a, const Packet& b) { return a.pts < b.pts; });
  for (const Packet& p : packets) {
    if (!index.pts.empty() && index.pts.back() == p.pts) continue;  // a repeated timestamp
    index.pts.push_back(p.pts);
    index.key.push_back(p.key ? 1 : 0);
    if (p.key) index.keys.push_back({p.pts, p.seek_ts});
  }
  if (index.keys.empty()) throw std::runtime_error(path + ": no keyframe in its video stream");
  return index;
}

// ---------------------------------------------------------------------------- index cache

// A video's packets in the index cache (index_cache.h's entries, kind "STKVID02"), keyed by
// the file (its size and mtime) or the object (its ETag), with a member's place.
constexpr std::string_view kCacheMagic = "STKVID02";

std::string cache_file(const std::string& dir, const std::string& path) {
  return detail::index_cache_file(dir, path, "vidx");
}

void save_index(const std::string& file, const std::string& path, const FileStat& st,
                const VideoIndex& x) {
  detail::IndexWriter w;
  w.put(static_cast<std::int32_t>(x.stream));
  w.put(static_cast<std::int32_t>(x.tb_num));
  w.put(static_cast<std::int32_t>(x.tb_den));
  w.put(static_cast<std::int32_t>(x.width));
  w.put(static_cast<std::int32_t>(x.height));
  w.put(static_cast<std::uint64_t>(x.pts.size()));
  for (std::size_t i = 0; i < x.pts.size(); ++i) {
    w.put(x.pts[i]);
    w.put(x.key[i]);
  }
  w.put(static_cast<std::uint64_t>(x.keys.size()));
  for (const Keyframe& k : x.keys) {
    w.put(k.pts);
    w.put(k.seek_ts);
  }
  detail::save_index_entry(file, kCacheMagic, {path, st.size, st.mtime_ns}, w.data);
}

bool load_index(const std::string& file, const std::string& path, const FileStat& st,
                VideoIndex& x) {
  const auto body = detail::load_index_entry(file, kCacheMagic, {path, st.size, st.mtime_ns});
  if (!body) return false;
  detail::IndexReader in(*body);
  std::uint64_t frames = 0, keys = 0;
  std::int32_t stream = 0, num = 0, den = 0, w = 0, h = 0;
  if (!in.get(stream) || !in.get(num) || !in.get(den) || !in.get(w) || !in.get(h) ||
      !in.get(frames) || frames > in.left() / 9 || num <= 0 || den <= 0) {
    return false;
  }
  x.stream = stream;
  x.tb_num = num;
  x.tb_den = den;
  x.width = w;
  x.height = h;
  x.pts.resize(frames);
  x.key.resize(frames);
  for (std::size_t i = 0; i < frames; ++i) {
    if (!in.get(x.pts[i]) || !in.get(x.key[i])) return false;
  }
  if (!in.get(keys) || keys > in.left() / 16 || keys == 0 || frames == 0) return false;
  x.keys.resize(keys);
  for (Keyframe& k : x.keys) {
    if (!in.get(k.pts) || !in.get(k.seek_ts)) return false;
  }
  return in.done();
}

// ---------------------------------------------------------------------------- decoders

template <class T>
std::span<T> sized(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return {v.data(), n};
}

// One plane's resize: the filter of each axis over the crop's box, in the plane's own pixels.
struct PlaneResize {
  std::vector<std::int32_t> xs, xc, xw, ys, yc, yw;
  std::vector<std::int16_t> xw16;  // a YUV plane's: cx's weights in 16 bits
  image::AxisCoeffs cx, cy;
  // The vertical pass first where it leaves fewer rows to the (costlier) horizontal one.
  bool vertical_first = false;
};

// A libswscale context converting frames to RGB, with the YUV matrix and range it was set to.
class ColourConverter {
 public:
  ColourConverter() = default;
  ColourConverter(const ColourConverter&) = delete;
  ColourConverter& operator=(const ColourConverter&) = delete;
  ~ColourConverter() { sws_freeContext(ctx_); }

  // The context for w x h frames of `from` to `to` (same size), with the YUV matrix `cs`
  // (SWS_CS_*) and range (full or limited); nullptr where libswscale cannot convert `from`.
  SwsContext* get(int w, int h, AVPixelFormat from, AVPixelFormat to, int cs, int full) {
    ctx_ =
        sws_getCachedContext(ctx_, w, h, from, w, h, to, SWS_BILINEAR, nullptr, nullptr, nullptr);
    const std::array<int, 6> details{w, h, from, to, cs, full};
    if (ctx_ != nullptr && (ctx_ != set_ || details != details_)) {
      sws_setColorspaceDetails(ctx_, sws_getCoefficients(cs), full,
                               sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
      set_ = ctx_;
      details_ = details;
    }
    return ctx_;
  }

 private:
  SwsContext* ctx_ = nullptr;
  const SwsContext* set_ = nullptr;  // the context the details below were set on
  std::array<int, 6> details_{};
};

// An open file and its decoder, kept between the reads of its clips.
struct Decoder {
  std::size_t video = 0;
  AVFormatContext* fmt = nullptr;
  AVCodecContext* codec = nullptr;
  AVPacket* pkt = nullptr;
  AVFrame* frame = nullptr;
  ColourConverter to_rgb;  // a frame not in planar 8-bit YUV to RGB at its own size
  // The last frame output since the last seek (INT64_MIN: none; the next read seeks).
  std::int64_t last_pts = std::numeric_limits<std::int64_t>::min();
  bool drained = false;  // the end of the file was sent: only a seek goes on from here
  std::uint64_t used = 0;

  // Resampling: the coefficients for RGB or Y ([0]) and for U and V ([1]), for the frame's
  // size, format and chroma siting in `resize_for`; scratch, reused.
  std::array<PlaneResize, 2> planes;
  std::array<int, 4> resize_for{};
  std::vector<std::uint8_t> rgb, rows, line, yuv;
  std::vector<std::int32_t> acc;

  Decoder() = default;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder() {
    av_frame_free(&frame);
    av_packet_free(&pkt);
    avcodec_free_context(&codec);
    close_format(fmt);
  }
};

std::unique_ptr<Decoder> open_decoder(const std::string& path, const VideoBytes& at,
                                      std::size_t video, const VideoIndex& index) {
  auto d = std::make_unique<Decoder>();
  d->video = video;
  FormatPtr fmt = open_format(path, at);
  if (index.stream < 0 || static_cast<unsigned>(index.stream) >= fmt->nb_streams) {
    throw std::runtime_error(path + ": the file changed since it was indexed");
  }
  for (unsigned i = 0; i < fmt->nb_streams; ++i) {
    if (static_cast<int>(i) != index.stream) fmt->streams[i]->discard = AVDISCARD_ALL;
  }
  const AVStream* st = fmt->streams[index.stream];
  d->fmt = fmt.release();
  const AVCodec* codec = avcodec_find_decoder(st->codecpar->codec_id);
  if (codec == nullptr) {
    throw std::runtime_error(path + ": no decoder for its video codec " +
                             avcodec_get_name(st->codecpar->codec_id));
  }
  d->codec = avcodec_alloc_context3(codec);
  d->pkt = av_packet_alloc();
  d->frame = av_frame_alloc();
  if (!d->codec || !d->pkt || !d->frame) throw std::bad_alloc();
  int rc = avcodec_parameters_to_context(d->codec, st->codecpar);
  if (rc < 0) throw std::runtime_error(path + ": bad codec parameters: " + av_error(rc));
  d->codec->pkt_timebase = st->time_base;
  d->codec->thread_count = 1;  // the loader's worker threads are the parallelism
  d->codec->flags |= AV_CODEC_FLAG_OUTPUT_CORRUPT;  // corrupt frames come out flagged: reported
  rc = avcodec_open2(d->codec, codec, nullptr);
  if (rc < 0) throw std::runtime_error(path + ": cannot open its decoder: " + av_error(rc));
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------- the data set

struct VideoClips::Impl {
  VideoClipsOptions o;
  std::vector<std::string> paths;  // names: a file's path, or "<tar> member '<name>'"
  std::vector<VideoBytes> bytes;   // where each video's bytes are
  std::vector<std::int64_t> labels;
  std::vector<std::string> classes;
  std::vector<VideoIndex> index;
  std::size_t clip_bytes = 0;

  std::atomic<std::uint64_t> decoded{0}, seeks{0}, continued{0}, opened{0};
  std::uint64_t indexed = 0, from_cache = 0;

  // Idle decoders: taken by a read, given back after it (a failed read drops its decoder).
  detail::Mutex mutex;
  std::vector<std::unique_ptr<Decoder>> idle STOKER_GUARDED_BY(mutex);
  std::uint64_t uses STOKER_GUARDED_BY(mutex) = 0;
  std::size_t max_idle = 8;

  void list_videos();
  void add_file(std::string path, std::int64_t label);
  // A local tar is opened for each read (a data set of many shards holds no descriptor each).
  void add_tar(const std::string& tar, const io::FilePtr& shard);
  void add_url(const std::string& url);
  void make_indexes();

  struct Plan {
    std::size_t video = 0;
    std::vector<std::size_t> frames;  // per clip frame, an index into the video's frames
  };
  void plan(std::size_t sample, std::uint64_t seed, Plan& p) const;

  std::unique_ptr<Decoder> take(std::size_t video, std::int64_t key_pts, std::int64_t first_pts);
  void give_back(std::unique_ptr<Decoder> d);
  void decode_clip(Decoder& d, const Plan& p, std::span<std::byte> out);
  void write_frame(Decoder& d, std::span<std::byte> out);
};

void VideoClips::Impl::list_videos() {
  if (o.paths.empty()) throw std::invalid_argument("stoker::VideoClips: no paths");
  std::error_code ec;
  // One directory holding no video itself, only folders: the class-folder layout.
  if (o.paths.size() == 1 && fs::is_directory(o.paths[0], ec)) {
    const fs::path root(o.paths[0]);
    bool direct = false;
    std::vector<std::string> dirs;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (e.is_directory(ec)) {
        dirs.push_back(e.path().filename().string());
      } else if (has_video_extension(e.path())) {
        direct = true;
      }
    }
    if (ec) throw std::runtime_error(root.string() + ": cannot list: " + ec.message());
    if (!direct && !dirs.empty()) {
      std::sort(dirs.begin(), dirs.end());
      std::string empty;
      for (std::size_t c = 0; c < dirs.size(); ++c) {
        std::vector<std::string> v = videos_below(root / dirs[c]);
        if (v.empty()) empty += (empty.empty() ? "" : ", ") + dirs[c];
        for (auto& p : v) add_file(std::move(p), static_cast<std::int64_t>(c));
      }
      if (!empty.empty()) {
        throw std::runtime_error(root.string() + ": found no video file for the classes " + empty);
      }
      classes = std::move(dirs);
      return;
    }
  }
  for (const std::string& p : o.paths) {
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> v = videos_below(p);
      if (v.empty()) throw std::runtime_error(p + ": no video files (.mp4 .mkv .webm .mov ...)");
      for (auto& f : v) add_file(std::move(f), -1);
    } else if (const auto kind = detail::path_kind(p, "");
               kind == detail::PathKind::object || kind == detail::PathKind::prefix) {
      add_url(p);
    } else if (!fs::exists(p, ec)) {
      throw std::runtime_error(p + ": no such file or directory");
    } else if (fs::path(p).extension() == ".tar") {
      add_tar(p, detail::Resolver::open(p, false));
    } else {
      add_file(p, -1);
    }
  }
  // Without a class or a .cls member: the video's index.
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0) labels[i] = static_cast<std::int64_t>(i);
  }
}

void VideoClips::Impl::add_file(std::string path, std::int64_t label) {
  VideoBytes at;
  at.file = path;
  bytes.push_back(std::move(at));
  paths.push_back(std::move(path));
  labels.push_back(label);
}

// An object (a video, or a .tar shard), or an s3:// prefix: every video and .tar object below
// it, at any depth, in key order.
void VideoClips::Impl::add_url(const std::string& url) {
  ObjectStorageOptions storage = o.storage;
  storage.index_cache = false;  // each process lists for itself (no node turn)
  detail::Resolver resolver(storage, "video");
  const std::string ext = fs::path(url).extension().string();
  std::vector<io::FilePtr> objects;
  if (ext == ".tar" || has_video_extension(fs::path(url))) {
    objects = resolver.objects({url}, ext).at(0);
  } else {
    for (auto& object : resolver.list_all(url)) {
      const fs::path name(object.url);
      if (name.extension() == ".tar" || has_video_extension(name)) {
        objects.push_back(resolver.open(object));
      }
    }
    if (objects.empty()) {
      throw std::runtime_error(url + ": no video or .tar objects under this prefix");
    }
  }
  for (auto& file : objects) {
    if (fs::path(file->name()).extension() == ".tar") {
      add_tar(file->name(), file);
    } else {
      VideoBytes at;
      at.size = file->size();
      at.object = *file->object();
      at.io = std::move(file);
      paths.push_back(at.object->url);
      bytes.push_back(std::move(at));
      labels.push_back(-1);
    }
  }
}

// A WebDataset shard: each member with a video extension is a video, its label the integer in
// the sample's `.cls` member (the same key: the name up to the first dot of its last path
// component) when there is one.
void VideoClips::Impl::add_tar(const std::string& tar, const io::FilePtr& shard) {
  std::optional<detail::RemoteObject> object;
  if (shard->object() != nullptr) object = *shard->object();
  const std::vector<detail::TarMember> members = detail::index_tar(*shard);
  const auto key_of = [](const std::string& name) {
    const std::size_t slash = name.rfind('/');
    const std::size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
    return name.substr(0, dot);
  };
  std::unordered_map<std::string, const detail::TarMember*> cls;
  for (const auto& m : members) {
    if (m.name.size() > 4 && m.name.ends_with(".cls")) cls.emplace(key_of(m.name), &m);
  }
  const std::size_t before = paths.size();
  for (const auto& m : members) {
    if (!has_video_extension(fs::path(m.name))) continue;
    std::int64_t label = -1;
    const std::string name = tar + " member '" + m.name + "'";
    if (auto it = cls.find(key_of(m.name)); it != cls.end()) {
      std::string text(static_cast<std::size_t>(std::min<std::uint64_t>(it->second->size, 32)),
                       '\0');
      const bool read =
          shard->read_at(it->second->offset, reinterpret_cast<std::byte*>(text.data()),
                         text.size()) == text.size();
      const auto first = text.find_first_not_of(" \t\r\n");
      const auto last = text.find_last_not_of(" \t\r\n");
      const std::string digits =
          first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
      const char* end = digits.data() + digits.size();
      if (!read || digits.empty() || std::from_chars(digits.data(), end, label).ptr != end) {
        throw std::runtime_error(tar + " member '" + it->second->name +
                                 "': not an integer label ('" + digits + "')");
      }
    }
    VideoBytes at;
    at.file = object ? std::string() : tar;
    at.member = true;
    at.offset = m.offset;
    at.size = m.size;
    at.object = object;
    at.io = io::slice(shard, m.offset, m.size, name);
    bytes.push_back(std::move(at));
    paths.push_back(name);
    labels.push_back(label);
  }
  if (paths.size() == before) {
    throw std::runtime_error(tar + ": no video members (.mp4 .mkv .webm .mov ...)");
  }
}

void VideoClips::Impl::make_indexes() {
  index.resize(paths.size());
  const std::string dir = detail::index_cache_dir(o.storage, "video");
  std::vector<std::string> errors(paths.size());
  std::vector<std::uint8_t> cached(paths.size(), 0);
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < paths.size();) {
      try {
        const VideoBytes& at = bytes[i];
        // Keyed by the file (its size and time) or the object (its ETag), and a member's place
        // and length.
        std::string abs;
        FileStat st;
        if (at.object) {
          abs = at.object->url;
          st.mtime_ns = detail::etag_stamp(at.object->etag);
        } else {
          abs = fs::absolute(at.file).lexically_normal().string();
          st = stat_file(at.file);
        }
        if (at.member) abs += "#" + std::to_string(at.offset);
        if (at.custom_io()) st.size = at.size;
        const std::string file = dir.empty() ? std::string() : cache_file(dir, abs);
        if (!file.empty() && load_index(file, abs, st, index[i])) {
          cached[i] = 1;
          continue;
        }
        index[i] = build_index(paths[i], at);
        if (!file.empty()) save_index(file, abs, st, index[i]);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
  };
  unsigned threads = o.index_threads > 0 ? static_cast<unsigned>(o.index_threads)
                                         : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, paths.size()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  std::size_t failed = 0;
  std::string first;
  for (const std::string& e : errors) {
    if (e.empty()) continue;
    if (failed++ == 0) first = e;
  }
  if (failed > 0) {
    throw std::runtime_error(first + (failed > 1 ? " (and " + std::to_string(failed - 1) +
                                                       " more files that cannot be read)"
                                                 : std::string()));
  }
  from_cache = static_cast<std::uint64_t>(std::count(cached.begin(), cached.end(), 1));
  indexed = paths.size() - from_cache;
}

void VideoClips::Impl::plan(std::size_t sample, std::uint64_t seed, Plan& p) const {
  const auto per = static_cast<std::size_t>(o.clips_per_video);
  p.video = sample / per;
  const std::size_t k = sample % per;
  const VideoIndex& x = index.at(p.video);
  const std::size_t n = x.pts.size();
  const auto frames = static_cast<std::size_t>(o.frames);
  p.frames.resize(frames);
  const bool random = o.sampling == VideoClipsOptions::Sampling::random;
  // The clip's place in [0, 1): evenly spaced, or drawn from the sample's seed.
  auto place = [&](std::size_t positions) -> std::size_t {
    if (positions <= 1) return 0;
    if (random) return static_cast<std::size_t>(splitmix64(seed) % positions);
    if (per == 1) return (positions - 1) / 2;
    return k * (positions - 1) / (per - 1);
  };
  if (o.fps <= 0) {
    const std::size_t span = (frames - 1) * static_cast<std::size_t>(o.stride);
    const std::size_t first = place(n > span ? n - span : 1);
    for (std::size_t t = 0; t < frames; ++t) {
      p.frames[t] = std::min(n - 1, first + t * static_cast<std::size_t>(o.stride));
    }
    return;
  }
  // By time: the clip starts at a frame's presentation time, and clip frame t is the frame on
  // screen at start + t / fps: the last whose presentation time is at or before it. The clip
  // starts at the frames that leave it room before the last frame's time (at least the first).
  const double tick = static_cast<double>(x.tb_num) / x.tb_den;  // seconds per unit
  const double span = (static_cast<double>(frames) - 1) / o.fps / tick;
  const auto latest = static_cast<double>(x.pts.back()) - span;
  std::size_t starts = 1;
  while (starts < n && static_cast<double>(x.pts[starts]) <= latest) ++starts;
  const std::size_t first = place(starts);
  const std::int64_t start = x.pts[first];
  for (std::size_t t = 0; t < frames; ++t) {
    const auto at =
        start + static_cast<std::int64_t>(std::floor(static_cast<double>(t) / o.fps / tick + 1e-9));
    const auto it = std::upper_bound(x.pts.begin(), x.pts.end(), at);
    p.frames[t] = static_cast<std::size_t>(it - x.pts.begin() - 1);  // >= first
  }
}

std::unique_ptr<Decoder> VideoClips::Impl::take(std::size_t video, std::int64_t key_pts,
                                                std::int64_t first_pts) {
  std::unique_ptr<Decoder> out;
  {
    detail::MutexLock lock(mutex);
    std::size_t best = idle.size();
    for (std::size_t i = 0; i < idle.size(); ++i) {
      const Decoder& d = *idle[i];
      if (d.video != video) continue;
      const bool ahead = !d.drained && d.last_pts >= key_pts && d.last_pts < first_pts;
      if (best == idle.size() || ahead) best = i;
      if (ahead) break;
    }
    if (best < idle.size()) {
      out = std::move(idle[best]);
      idle.erase(idle.begin() + static_cast<std::ptrdiff_t>(best));
    }
  }
  if (!out) {
    out = open_decoder(paths[video], bytes[video], video, index[video]);
    opened.fetch_add(1, std::memory_order_relaxed);
  }
  return out;
}

void VideoClips::Impl::give_back(std::unique_ptr<Decoder> d) {
  std::unique_ptr<Decoder> evicted;  // closed after the lock is released
  detail::MutexLock lock(mutex);
  d->used = ++uses;
  idle.push_back(std::move(d));
  if (idle.size() > max_idle) {
    auto oldest = std::min_element(idle.begin(), idle.end(),
                                   [](const auto& a, const auto& b) { return a->used < b->used; });
    evicted = std::move(*oldest);
    idle.erase(oldest);
  }
}

// An FFmpeg enum field as the int it holds: a damaged stream can leave a value outside the
// enum's range there (the fuzzer found colorspace 27), and loading that as the enum is
// undefined behaviour.
namespace {
template <typename Enum>
int enum_value(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &field, sizeof v);
  return v;
}

// An 8-bit planar YUV frame (what software H.264, HEVC, VP9 and AV1 decoders give), whose
// planes are resized before the colour conversion: that then runs at the output's size.
bool planar_yuv8(const AVPixFmtDescriptor* d, const AVFrame* f) {
  constexpr auto kNot = AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_BE | AV_PIX_FMT_FLAG_HWACCEL |
                        AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_ALPHA;
  if (d == nullptr || d->nb_components != 3 || (d->flags & AV_PIX_FMT_FLAG_PLANAR) == 0 ||
      (d->flags & kNot) != 0 || d->log2_chroma_w > 2 || d->log2_chroma_h > 2) {
    return false;
  }
  for (int c = 0; c < 3; ++c) {
    const AVComponentDescriptor& k = d->comp[c];
    if (k.plane != c || k.depth != 8 || k.step != 1 || k.shift != 0 || k.offset != 0 ||
        f->linesize[c] <= 0) {
      return false;
    }
  }
  return true;
}

// The box [x0, x1) x [y0, y1) of a w x h frame resized into a W x H output: the largest
// centered box of the output's aspect ratio (a crop), or the whole frame.
std::array<double, 4> source_box(int w, int h, int W, int H, bool crop) {
  std::array<double, 4> box{0, static_cast<double>(w), 0, static_cast<double>(h)};
  if (!crop) return box;
  const double want = static_cast<double>(W) / H;
  if (static_cast<double>(w) / h > want) {
    const double cw = h * want;
    box[0] = std::round((w - cw) / 2);
    box[1] = box[0] + std::round(cw);
  } else {
    const double ch = w / want;
    box[2] = std::round((h - ch) / 2);
    box[3] = box[2] + std::round(ch);
  }
  return box;
}

// The box in a chroma plane's own pixels, where a chroma sample sits (AVChromaLocation) between
// the `sub` luma samples it covers: at the first (co-sited; H.264's default horizontally), in
// the middle (MPEG-2's vertically), or at the last. Pixel centers at +0.5 on either grid.
std::array<double, 4> chroma_box(const std::array<double, 4>& box, int loc, int sub_x, int sub_y) {
  // In 1/256 of a luma sample past the first one (FFmpeg's chroma positions); unnamed: left
  // and center, H.264's and MPEG-2's 4:2:0.
  const bool centered_x =
      loc == AVCHROMA_LOC_CENTER || loc == AVCHROMA_LOC_TOP || loc == AVCHROMA_LOC_BOTTOM;
  const int x = centered_x ? 128 : 0;
  const int y = loc == AVCHROMA_LOC_TOPLEFT || loc == AVCHROMA_LOC_TOP         ? 0
                : loc == AVCHROMA_LOC_BOTTOMLEFT || loc == AVCHROMA_LOC_BOTTOM ? 256
                                                                               : 128;
  auto to = [](double v, int pos, int sub) {
    return sub == 1 ? v : (v - 0.5 - pos / 256.0) / sub + 0.5;
  };
  return {to(box[0], x, sub_x), to(box[1], x, sub_x), to(box[2], y, sub_y), to(box[3], y, sub_y)};
}

// r's filters for resizing `box` of a w x h plane to W x H; `one_channel`: a YUV plane.
void plan_resize(PlaneResize& r, int w, int h, const std::array<double, 4>& box, int W, int H,
                 bool one_channel) {
  auto axis = [](std::vector<std::int32_t>& s, std::vector<std::int32_t>& c,
                 std::vector<std::int32_t>& wt, int taps, int in, double a, double b, int outn) {
    image::AxisCoeffs ax;
    ax.taps = taps;
    ax.start = sized(s, static_cast<std::size_t>(outn));
    ax.count = sized(c, static_cast<std::size_t>(outn));
    ax.weights = sized(wt, static_cast<std::size_t>(outn) * static_cast<std::size_t>(taps));
    image::bilinear_axis(in, a, b, outn, 0, ax);
    return ax;
  };
  const int x_taps =
      one_channel ? image::plane_taps(box[0], box[1], W) : image::bilinear_taps(box[0], box[1], W);
  r.cx = axis(r.xs, r.xc, r.xw, x_taps, w, box[0], box[1], W);
  r.cy = axis(r.ys, r.yc, r.yw, image::bilinear_taps(box[2], box[3], H), h, box[2], box[3], H);
  r.vertical_first = one_channel && H < r.cy.last - r.cy.first;
  if (one_channel) image::plane_weights(r.cx, sized(r.xw16, r.cx.weights.size()));
}

// One plane (`linesize` bytes a row, `w` pixels wide) resized by r into `out` (W x H, W bytes a
// row), its two passes in r's order.
void resize_plane(const std::uint8_t* plane, std::size_t linesize, int w, const PlaneResize& r,
                  std::uint8_t* out, std::vector<std::uint8_t>& tmp,
                  std::vector<std::int32_t>& acc) {
  const image::AxisCoeffs &cx = r.cx, &cy = r.cy;
  const std::size_t W = cx.start.size(), H = cy.start.size();
  const std::uint8_t* top = plane + static_cast<std::size_t>(cy.first) * linesize;
  if (r.vertical_first) {
    const auto span = static_cast<std::size_t>(cx.last - cx.first);
    std::uint8_t* rows = sized(tmp, H * span).data();
    image::resample_plane_columns(top + cx.first, linesize, cy, span, rows, span, sized(acc, span));
    for (std::size_t y = 0; y < H; ++y) {
      image::resample_plane_row(rows + y * span, static_cast<int>(span), cx, r.xw16, out + y * W);
    }
  } else {
    const auto n = static_cast<std::size_t>(cy.last - cy.first);
    std::uint8_t* rows = sized(tmp, n * W).data();
    for (std::size_t y = 0; y < n; ++y) {
      image::resample_plane_row(top + y * linesize + cx.first, w - cx.first, cx, r.xw16,
                                rows + y * W);
    }
    image::resample_plane_columns(rows, W, cy, W, out, W, sized(acc, W));
  }
}

// libswscale's YUV to RGB matrix `cs` (SWS_CS_*) for limited or full range, as
// sws_setColorspaceDetails derives it (no brightness, contrast or saturation change).
image::YuvMatrix yuv_matrix(int cs, bool full) {
  const int* t = sws_getCoefficients(cs);  // crv, cbu, cgu, cgv: limited range's
  image::YuvMatrix m;
  std::int64_t k[4] = {t[0], t[1], t[2], t[3]};
  if (full) {
    for (auto& v : k) v = v * 224 / 255;
  } else {
    m.cy = (1 << 16) * 255 / 219;
    m.oy = 16;
  }
  m.crv = static_cast<std::int32_t>(k[0]);
  m.cbu = static_cast<std::int32_t>(k[1]);
  m.cgu = static_cast<std::int32_t>(k[2]);
  m.cgv = static_cast<std::int32_t>(k[3]);
  return m;
}

}  // namespace

void VideoClips::Impl::write_frame(Decoder& d, std::span<std::byte> out) {
  const AVFrame* f = d.frame;
  const int w = f->width, h = f->height;
  const std::string& path = paths[d.video];
  if (w <= 0 || h <= 0) throw std::runtime_error(path + ": a decoded frame has no pixels");
  const auto fmt = static_cast<AVPixelFormat>(f->format);
  const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(fmt);
  const bool planar = planar_yuv8(desc, f);
  // YUV to RGB with the frame's own matrix and range (BT.601 where it names none or one this
  // FFmpeg does not know).
  const int spc = enum_value(f->colorspace);
  const int cs =
      spc >= 0 && spc < AVCOL_SPC_NB && spc != AVCOL_SPC_UNSPECIFIED ? spc : SWS_CS_DEFAULT;
  const int full = enum_value(f->color_range) == AVCOL_RANGE_JPEG ? 1 : 0;

  const int W = o.width, H = o.height;
  const std::array<int, 4> resize_for{w, h, f->format, enum_value(f->chroma_location)};
  if (d.resize_for != resize_for) {
    const auto box = source_box(w, h, W, H, o.center_crop);
    plan_resize(d.planes[0], w, h, box, W, H, planar);
    if (planar) {
      const int sx = desc->log2_chroma_w, sy = desc->log2_chroma_h;
      plan_resize(d.planes[1], AV_CEIL_RSHIFT(w, sx), AV_CEIL_RSHIFT(h, sy),
                  chroma_box(box, resize_for[3], 1 << sx, 1 << sy), W, H, true);
    }
    d.resize_for = resize_for;
  }

  auto* rgb_out = reinterpret_cast<std::uint8_t*>(out.data());
  const auto plane_out = static_cast<std::size_t>(W) * static_cast<std::size_t>(H);
  if (planar) {
    // Y, U and V resized to the output's size (4:4:4), then converted into its R, G, B planes.
    std::uint8_t* yuv = sized(d.yuv, 3 * plane_out).data();
    for (int c = 0; c < 3; ++c) {
      const int pw = c == 0 ? w : AV_CEIL_RSHIFT(w, desc->log2_chroma_w);
      resize_plane(f->data[c], static_cast<std::size_t>(f->linesize[c]), pw,
                   d.planes[c == 0 ? 0 : 1], yuv + c * plane_out, d.rows, d.acc);
    }
    const std::uint8_t* const src[3] = {yuv, yuv + plane_out, yuv + 2 * plane_out};
    std::uint8_t* const dst[3] = {rgb_out, rgb_out + plane_out, rgb_out + 2 * plane_out};
    image::yuv_to_rgb(src, plane_out, yuv_matrix(cs, full != 0), dst);
    return;
  }

  // Any other format: converted to RGB at its own size, then resized.
  SwsContext* sws = d.to_rgb.get(w, h, fmt, AV_PIX_FMT_RGB24, cs, full);
  if (sws == nullptr) {
    const char* name = av_get_pix_fmt_name(fmt);
    throw std::runtime_error(path + ": cannot convert its pixel format " +
                             (name ? name : "unknown") + " to RGB");
  }
  const image::AxisCoeffs &cx = d.planes[0].cx, &cy = d.planes[0].cy;
  const int stride = FFALIGN(w * 3, 64);
  const std::size_t rgb_bytes =
      static_cast<std::size_t>(stride) * static_cast<std::size_t>(h) + image::row_padding(cx) + 64;
  std::uint8_t* dst[4] = {sized(d.rgb, rgb_bytes).data(), nullptr, nullptr, nullptr};
  const int dst_stride[4] = {stride, 0, 0, 0};
  if (sws_scale(sws, f->data, f->linesize, 0, h, dst, dst_stride) != h) {
    throw std::runtime_error(path + ": cannot convert a frame to RGB");
  }
  const std::size_t row_bytes = static_cast<std::size_t>(W) * 4;  // RGBx
  std::uint8_t* rows =
      sized(d.rows, static_cast<std::size_t>(cy.last - cy.first) * row_bytes).data();
  for (int y = cy.first; y < cy.last; ++y) {
    image::resample_row(d.rgb.data() + static_cast<std::size_t>(y) * stride +
                            static_cast<std::size_t>(cx.first) * 3,
                        cx, rows + static_cast<std::size_t>(y - cy.first) * row_bytes);
  }
  image::OutputArgs args;
  args.out = out;
  args.dtype = DType::u8;
  args.layout = ImageLayout::chw;
  args.width = W;
  args.height = H;
  image::resample_columns(rows, row_bytes, cy, args, sized(d.acc, row_bytes),
                          sized(d.line, row_bytes));
}

void VideoClips::Impl::decode_clip(Decoder& d, const Plan& p, std::span<std::byte> out) {
  const VideoIndex& x = index[d.video];
  const std::string& path = paths[d.video];
  const std::size_t frame_bytes = clip_bytes / p.frames.size();
  const std::int64_t first_pts = x.pts[p.frames.front()];
  const std::size_t key = x.key_before(p.frames.front());
  auto at = [&](std::int64_t pts) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.3f s", x.seconds(pts));
    return std::string(buf);
  };

  // Seeks to keyframe `k` (the one before the clip; an earlier one if that landed late).
  std::size_t seek_key = key;
  bool just_seeked = false;
  auto seek = [&](std::size_t k) {
    const int rc = av_seek_frame(d.fmt, x.stream, x.keys[k].seek_ts, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) {
      throw std::runtime_error(path + ": cannot seek to " + at(x.keys[k].pts) + ": " +
                               av_error(rc));
    }
    avcodec_flush_buffers(d.codec);
    d.last_pts = std::numeric_limits<std::int64_t>::min();
    d.drained = false;
    just_seeked = true;
    seeks.fetch_add(1, std::memory_order_relaxed);
  };
  const bool ahead = !d.drained && d.last_pts >= x.keys[key].pts && d.last_pts < first_pts;
  if (ahead) {
    continued.fetch_add(1, std::memory_order_relaxed);
  } else {
    seek(key);
  }

  std::size_t t = 0;  // the next clip frame to fill
  for (;;) {
    // Frames the decoder has ready, in presentation order.
    for (;;) {
      const int rc = avcodec_receive_frame(d.codec, d.frame);
      if (rc == AVERROR(EAGAIN)) break;
      if (rc == AVERROR_EOF) {
        throw std::runtime_error(path + ": the stream ended before the frame at " +
                                 at(x.pts[p.frames[t]]) + " (a truncated file?)");
      }
      if (rc < 0) throw std::runtime_error(path + ": a frame does not decode: " + av_error(rc));
      decoded.fetch_add(1, std::memory_order_relaxed);
      std::int64_t pts = d.frame->best_effort_timestamp;
      if (pts == AV_NOPTS_VALUE) pts = d.frame->pts;
      const bool corrupt = (d.frame->flags & AV_FRAME_FLAG_CORRUPT) || d.frame->decode_error_flags;
      const std::int64_t want = x.pts[p.frames[t]];
      if (just_seeked && pts > want) {  // landed after the clip's first frame: seek earlier
        av_frame_unref(d.frame);
        if (seek_key == 0) {
          throw std::runtime_error(path + ": seeking does not reach the frame at " + at(want));
        }
        seek(--seek_key);
        continue;
      }
      just_seeked = false;
      d.last_pts = pts;
      if (pts < want) {
        av_frame_unref(d.frame);
        continue;
      }
      if (pts > want) {
        av_frame_unref(d.frame);
        throw std::runtime_error(path + ": the frame at " + at(want) +
                                 " does not decode (the decoder went on to " + at(pts) + ")");
      }
      if (corrupt) {
        av_frame_unref(d.frame);
        throw std::runtime_error(path + ": the frame at " + at(want) + " is corrupt");
      }
      write_frame(d, out.subspan(t * frame_bytes, frame_bytes));
      // Clip frames showing the same video frame (a clip longer than the video, or fps above
      // the file's) are copies.
      for (++t; t < p.frames.size() && p.frames[t] == p.frames[t - 1]; ++t) {
        std::memcpy(out.data() + t * frame_bytes, out.data() + (t - 1) * frame_bytes, frame_bytes);
      }
      av_frame_unref(d.frame);
      if (t == p.frames.size()) return;
    }
    if (d.drained) {
      throw std::runtime_error(path + ": the stream ended before the frame at " +
                               at(x.pts[p.frames[t]]) + " (a truncated file?)");
    }
    const int rc = av_read_frame(d.fmt, d.pkt);
    if (rc == AVERROR_EOF) {
      d.drained = true;
      const int sent = avcodec_send_packet(d.codec, nullptr);
      if (sent < 0 && sent != AVERROR_EOF) {
        throw std::runtime_error(path + ": cannot drain its decoder: " + av_error(sent));
      }
      continue;
    }
    if (rc < 0) throw std::runtime_error(path + ": cannot read a packet: " + av_error(rc));
    if (d.pkt->stream_index != x.stream) {
      av_packet_unref(d.pkt);
      continue;
    }
    // A frame shown before the clip that no other frame refers to is not decoded at all (the
    // decoder runs on this thread: the setting holds for this packet alone).
    const std::int64_t pkt_pts = d.pkt->pts != AV_NOPTS_VALUE ? d.pkt->pts : d.pkt->dts;
    d.codec->skip_frame =
        pkt_pts != AV_NOPTS_VALUE && pkt_pts < first_pts ? AVDISCARD_NONREF : AVDISCARD_DEFAULT;
    const int sent = avcodec_send_packet(d.codec, d.pkt);
    av_packet_unref(d.pkt);
    if (sent < 0) {
      throw std::runtime_error(path + ": a packet does not decode: " + av_error(sent));
    }
  }
}

VideoClips::VideoClips(VideoClipsOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.o = std::move(options);
  const VideoClipsOptions& o = m.o;
  if (o.frames < 1) throw std::invalid_argument("stoker::VideoClips: frames must be at least 1");
  if (o.stride < 1) throw std::invalid_argument("stoker::VideoClips: stride must be at least 1");
  if (!(o.fps >= 0) || !std::isfinite(o.fps)) {
    throw std::invalid_argument("stoker::VideoClips: fps must be positive (or 0: by stride)");
  }
  if (o.clips_per_video < 1) {
    throw std::invalid_argument("stoker::VideoClips: clips_per_video must be at least 1");
  }
  if (o.height < 1 || o.width < 1 || o.height > 16384 || o.width > 16384) {
    throw std::invalid_argument("stoker::VideoClips: height and width must be in 1..16384");
  }
  m.clip_bytes = static_cast<std::size_t>(o.frames) * 3 * static_cast<std::size_t>(o.height) *
                 static_cast<std::size_t>(o.width);
  m.max_idle = std::max<std::size_t>(8, 2 * std::thread::hardware_concurrency());
  m.list_videos();
  m.make_indexes();
}

VideoClips::~VideoClips() = default;

std::size_t VideoClips::size() const {
  return impl_->paths.size() * static_cast<std::size_t>(impl_->o.clips_per_video);
}

std::vector<FieldSpec> VideoClips::fields() const {
  const VideoClipsOptions& o = impl_->o;
  return {{"clip", DType::u8, {o.frames, 3, o.height, o.width}},
          {"label", DType::i64, {}},
          {"start_pts", DType::f64, {}}};
}

void VideoClips::read(std::size_t index, const SampleOut& out) const {
  Impl& m = *impl_;
  if (index >= size()) throw std::out_of_range("stoker::VideoClips: index out of range");
  thread_local Impl::Plan plan;
  m.plan(index, out.seed(), plan);
  const VideoIndex& x = m.index[plan.video];
  const std::int64_t first = x.pts[plan.frames.front()];
  std::unique_ptr<Decoder> d =
      m.take(plan.video, x.keys[x.key_before(plan.frames.front())].pts, first);
  m.decode_clip(*d, plan, out.bytes(0));  // a failure drops the decoder
  m.give_back(std::move(d));
  out.as<std::int64_t>(1)[0] = m.labels[plan.video];
  out.as<double>(2)[0] = x.seconds(first);
}

std::vector<std::string> VideoClips::cheaper_reads() const {
  // A clip's decode starts at the keyframe before its first frame: the frames before that
  // frame are decoded for nothing, and each frame costs its whole size before the resize.
  return {
      "videos re-encoded with keyframes closer together (ffmpeg -g), so that a clip's "
      "decode starts nearer its first frame",
      "fewer frames a clip, or a smaller output size",
      "videos stored at the resolution trained on (a smaller decode)"};
}

std::string VideoClips::sample_name(std::size_t index) const {
  const auto per = static_cast<std::size_t>(impl_->o.clips_per_video);
  if (index >= size()) return {};
  return impl_->paths[index / per] + " (clip " + std::to_string(index % per) + ")";
}

const VideoClipsOptions& VideoClips::options() const { return impl_->o; }
std::size_t VideoClips::videos() const { return impl_->paths.size(); }
const std::string& VideoClips::path(std::size_t video) const { return impl_->paths.at(video); }
std::int64_t VideoClips::label(std::size_t video) const { return impl_->labels.at(video); }
std::vector<std::string> VideoClips::classes() const { return impl_->classes; }

std::vector<double> VideoClips::frame_times(std::size_t video) const {
  const VideoIndex& x = impl_->index.at(video);
  std::vector<double> out;
  out.reserve(x.pts.size());
  for (const std::int64_t p : x.pts) out.push_back(x.seconds(p));
  return out;
}

std::vector<bool> VideoClips::keyframes(std::size_t video) const {
  const VideoIndex& x = impl_->index.at(video);
  return {x.key.begin(), x.key.end()};
}

std::vector<std::size_t> VideoClips::clip_frames(std::size_t index, std::uint64_t seed) const {
  if (index >= size()) throw std::out_of_range("stoker::VideoClips: index out of range");
  Impl::Plan p;
  impl_->plan(index, seed, p);
  return p.frames;
}

VideoClips::Counters VideoClips::counters() const {
  const Impl& m = *impl_;
  Counters c;
  c.decoded_frames = m.decoded.load(std::memory_order_relaxed);
  c.seeks = m.seeks.load(std::memory_order_relaxed);
  c.continued = m.continued.load(std::memory_order_relaxed);
  c.opened = m.opened.load(std::memory_order_relaxed);
  c.indexed = m.indexed;
  c.from_cache = m.from_cache;
  return c;
}

}  // namespace stoker
