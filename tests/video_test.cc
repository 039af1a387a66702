// stoker::VideoClips on videos this test writes with libavcodec (H.264 through libx264, B-frames
// on): which frames a clip holds (each frame's brightness encodes its number), timestamps of a
// variable-frame-rate file, the decode work per clip, the index cache, and the bad files.
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
}

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "image_fixtures.h"
#include "stoker/loader.h"
#include "stoker/video.h"
#include "support/errors.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Frame k is flat grey with luma 16 + 4 (k % 55): its RGB value tells its number back.
int luma_of(int k) { return 16 + 4 * (k % 55); }
int frame_number(double rgb_mean) {
  return static_cast<int>(std::lround((rgb_mean * 219.0 / 255.0) / 4.0));
}
// What frame_number() reads from frame k.
int seen_as(std::size_t k) { return static_cast<int>(k % 55); }

struct VideoSpec {
  int frames = 60;
  int width = 160;
  int height = 96;
  int gop = 10;
  std::vector<std::int64_t> pts_ms;  // empty: 30 frames a second
  bool faststart = false;            // the moov atom before the media data
  bool audio_only = false;
};

void check(int rc, const char* what) {
  if (rc < 0) {
    char buf[AV_ERROR_MAX_STRING_SIZE] = {};
    av_strerror(rc, buf, sizeof buf);
    throw std::runtime_error(std::string(what) + ": " + buf);
  }
}

// Writes an MP4: H.264 video (or AAC audio only) with the frames' timestamps in milliseconds.
void write_video(const fs::path& path, const VideoSpec& spec) {
  AVFormatContext* oc = nullptr;
  check(avformat_alloc_output_context2(&oc, nullptr, "mp4", path.c_str()), "output");
  std::unique_ptr<AVFormatContext, void (*)(AVFormatContext*)> out(oc, [](AVFormatContext* f) {
    if (f->pb) avio_closep(&f->pb);
    avformat_free_context(f);
  });
  const AVCodec* codec = avcodec_find_encoder_by_name(spec.audio_only ? "aac" : "libx264");
  if (!codec) throw std::runtime_error("no encoder");
  AVStream* st = avformat_new_stream(oc, nullptr);
  std::unique_ptr<AVCodecContext, void (*)(AVCodecContext*)> enc(
      avcodec_alloc_context3(codec), [](AVCodecContext* c) { avcodec_free_context(&c); });
  if (spec.audio_only) {
    enc->sample_rate = 44100;
    enc->sample_fmt = AV_SAMPLE_FMT_FLTP;
    av_channel_layout_default(&enc->ch_layout, 1);
    enc->time_base = {1, 44100};
  } else {
    enc->width = spec.width;
    enc->height = spec.height;
    enc->pix_fmt = AV_PIX_FMT_YUV420P;
    enc->time_base = {1, 1000};
    enc->framerate = {30, 1};
    enc->gop_size = spec.gop;
    enc->max_b_frames = 2;
    av_opt_set(enc->priv_data, "preset", "veryfast", 0);
    av_opt_set(enc->priv_data, "crf", "10", 0);
    av_opt_set(enc->priv_data, "x264-params", "scenecut=0:min-keyint=1", 0);
  }
  if (oc->oformat->flags & AVFMT_GLOBALHEADER) enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  check(avcodec_open2(enc.get(), codec, nullptr), "encoder");
  check(avcodec_parameters_from_context(st->codecpar, enc.get()), "parameters");
  st->time_base = enc->time_base;
  check(avio_open(&oc->pb, path.c_str(), AVIO_FLAG_WRITE), "open");
  AVDictionary* opts = nullptr;
  if (spec.faststart) av_dict_set(&opts, "movflags", "faststart", 0);
  const int header = avformat_write_header(oc, &opts);
  av_dict_free(&opts);
  check(header, "header");

  AVPacket* pkt = av_packet_alloc();
  AVFrame* frame = av_frame_alloc();
  auto drain = [&] {
    for (;;) {
      const int rc = avcodec_receive_packet(enc.get(), pkt);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return;
      check(rc, "encode");
      // A duration, or the muxer's edit list ends at the last frame's start and hides it.
      if (!spec.audio_only && pkt->duration <= 0) pkt->duration = 20;
      av_packet_rescale_ts(pkt, enc->time_base, st->time_base);
      pkt->stream_index = st->index;
      check(av_interleaved_write_frame(oc, pkt), "write");
    }
  };
  const int count = spec.audio_only ? 40 : spec.frames;
  for (int k = 0; k < count; ++k) {
    if (spec.audio_only) {
      frame->format = enc->sample_fmt;
      frame->nb_samples = enc->frame_size;
      frame->sample_rate = enc->sample_rate;
      check(av_channel_layout_copy(&frame->ch_layout, &enc->ch_layout), "layout");
      check(av_frame_get_buffer(frame, 0), "buffer");
      auto* s = reinterpret_cast<float*>(frame->data[0]);
      for (int i = 0; i < frame->nb_samples; ++i) s[i] = std::sin(0.05f * (k * 1024 + i));
      frame->pts = static_cast<std::int64_t>(k) * enc->frame_size;
    } else {
      frame->format = AV_PIX_FMT_YUV420P;
      frame->width = spec.width;
      frame->height = spec.height;
      check(av_frame_get_buffer(frame, 0), "buffer");
      for (int y = 0; y < spec.height; ++y) {
        std::memset(frame->data[0] + y * frame->linesize[0], luma_of(k), spec.width);
      }
      for (int p = 1; p < 3; ++p) {
        for (int y = 0; y < spec.height / 2; ++y) {
          std::memset(frame->data[p] + y * frame->linesize[p], 128, spec.width / 2);
        }
      }
      frame->pts = spec.pts_ms.empty() ? k * 1000 / 30 : spec.pts_ms[static_cast<std::size_t>(k)];
    }
    check(avcodec_send_frame(enc.get(), frame), "send");
    av_frame_unref(frame);
    drain();
  }
  check(avcodec_send_frame(enc.get(), nullptr), "flush");
  drain();
  av_frame_free(&frame);
  av_packet_free(&pkt);
  check(av_write_trailer(oc), "trailer");
}

VideoSpec with_frames(int n) {
  VideoSpec s;
  s.frames = n;
  return s;
}
VideoSpec faststart() {
  VideoSpec s;
  s.faststart = true;
  return s;
}
VideoSpec audio_only() {
  VideoSpec s;
  s.audio_only = true;
  return s;
}

std::string read_file(const fs::path& p) {
  std::string out(fs::file_size(p), '\0');
  std::ifstream in(p, std::ios::binary);
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}
void write_file(const fs::path& p, const std::string& data) {
  std::ofstream(p, std::ios::binary) << data;
}

VideoClipsOptions small(std::vector<std::string> paths, const fs::path& cache) {
  VideoClipsOptions o;
  o.paths = std::move(paths);
  o.frames = 8;
  o.height = 24;
  o.width = 40;
  o.storage.index_cache_dir = cache.string();
  return o;
}

struct Sample {
  std::vector<std::uint8_t> clip;
  std::int64_t label = -1;
  double start = -1;
};

Sample read_sample(const VideoClips& d, std::size_t i, std::uint64_t seed = 7) {
  const auto fields = d.fields();
  Sample s;
  s.clip.resize(fields[0].bytes());
  std::vector<std::size_t> bytes{fields[0].bytes(), fields[1].bytes(), fields[2].bytes()};
  std::byte* bases[3] = {reinterpret_cast<std::byte*>(s.clip.data()),
                         reinterpret_cast<std::byte*>(&s.label),
                         reinterpret_cast<std::byte*>(&s.start)};
  d.read(i, SampleOut(bytes, bases, 0, seed));
  return s;
}

// The frame number each clip frame shows (from its mean value).
std::vector<int> frame_numbers(const VideoClips& d, const Sample& s) {
  const auto& o = d.options();
  const std::size_t per_frame = 3u * static_cast<std::size_t>(o.height * o.width);
  std::vector<int> out;
  for (std::size_t t = 0; t < static_cast<std::size_t>(o.frames); ++t) {
    double sum = 0;
    for (std::size_t i = 0; i < per_frame; ++i) sum += s.clip[t * per_frame + i];
    out.push_back(frame_number(sum / static_cast<double>(per_frame)));
  }
  return out;
}

TEST(VideoClips, UniformClipsHoldTheFramesTheirIndexNames) {
  TempDir dir;
  write_video(dir / "a.mp4", {});
  auto o = small({(dir / "a.mp4").string()}, dir / "cache");
  o.stride = 2;
  o.clips_per_video = 3;
  VideoClips d(o);
  ASSERT_EQ(d.size(), 3u);
  const auto times = d.frame_times(0);
  ASSERT_EQ(times.size(), 60u);
  for (std::size_t k = 0; k < times.size(); ++k) {
    EXPECT_NEAR(times[k], static_cast<double>(k * 1000 / 30) / 1000.0, 1e-9);
  }
  // 60 frames, clips of 8 frames 2 apart (15 frames long): 46 starts, the first, middle, last.
  const std::vector<std::size_t> starts{0, 22, 45};
  for (std::size_t c = 0; c < 3; ++c) {
    const auto frames = d.clip_frames(c, 0);
    for (std::size_t t = 0; t < frames.size(); ++t) EXPECT_EQ(frames[t], starts[c] + 2 * t);
    const Sample s = read_sample(d, c);
    const auto seen = frame_numbers(d, s);
    for (std::size_t t = 0; t < frames.size(); ++t) {
      EXPECT_EQ(seen[t], seen_as(frames[t])) << "clip " << c << " frame " << t;
    }
    EXPECT_EQ(s.label, 0);
    EXPECT_DOUBLE_EQ(s.start, times[frames[0]]);
  }
}

TEST(VideoClips, RandomClipsArePlacedByTheSampleSeedAlone) {
  TempDir dir;
  write_video(dir / "a.mp4", {});
  auto o = small({(dir / "a.mp4").string()}, dir / "cache");
  o.sampling = VideoClipsOptions::Sampling::random;
  VideoClips d(o);
  std::set<std::size_t> firsts;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    const auto frames = d.clip_frames(0, seed);
    EXPECT_EQ(frames, d.clip_frames(0, seed));
    EXPECT_LE(frames.back(), 59u);
    firsts.insert(frames.front());
    if (seed % 8 == 0) {
      const auto seen = frame_numbers(d, read_sample(d, 0, seed));
      for (std::size_t t = 0; t < frames.size(); ++t) EXPECT_EQ(seen[t], seen_as(frames[t]));
    }
  }
  EXPECT_GT(firsts.size(), 15u);  // 53 places; 40 draws land on many of them
}

TEST(VideoClips, VariableFrameRateFramesAreChosenByTheirTimestamps) {
  TempDir dir;
  VideoSpec spec;
  spec.frames = 40;
  std::int64_t t = 0;
  for (int k = 0; k < spec.frames; ++k) {
    spec.pts_ms.push_back(t);
    t += (k % 3 == 0) ? 20 : (k % 3 == 1 ? 50 : 100);  // 50, 20 and 10 frames a second
  }
  write_video(dir / "vfr.mp4", spec);
  auto o = small({(dir / "vfr.mp4").string()}, dir / "cache");
  o.fps = 10;
  o.clips_per_video = 4;
  VideoClips d(o);
  const auto times = d.frame_times(0);
  ASSERT_EQ(times.size(), 40u);
  for (std::size_t k = 0; k < times.size(); ++k)
    EXPECT_NEAR(times[k], spec.pts_ms[k] / 1000.0, 1e-9);
  for (std::size_t c = 0; c < 4; ++c) {
    const auto frames = d.clip_frames(c, 0);
    const double start = times[frames[0]];
    const Sample s = read_sample(d, c);
    EXPECT_DOUBLE_EQ(s.start, start);
    const auto seen = frame_numbers(d, s);
    for (std::size_t f = 0; f < frames.size(); ++f) {
      // The frame on screen at the clip's time f / 10 s after its first: the last one shown at
      // or before it.
      EXPECT_EQ(seen[f], seen_as(frames[f]));
      EXPECT_LE(times[frames[f]], times[frames[0]] + 0.1 * static_cast<double>(f) + 1e-3);
      if (frames[f] + 1 < times.size()) {
        EXPECT_GT(times[frames[f] + 1], times[frames[0]] + 0.1 * static_cast<double>(f) - 1e-3);
      }
    }
  }
}

TEST(VideoClips, AClipCostsAtMostTheFramesFromItsKeyframeToItsEnd) {
  TempDir dir;
  write_video(dir / "a.mp4", {});
  auto o = small({(dir / "a.mp4").string()}, dir / "cache");
  o.sampling = VideoClipsOptions::Sampling::random;
  o.frames = 4;
  VideoClips d(o);
  const auto key = d.keyframes(0);
  std::size_t keys = 0;
  for (bool k : key) keys += k ? 1 : 0;
  EXPECT_EQ(keys, 6u);  // a keyframe every 10 frames
  for (std::uint64_t seed = 0; seed < 30; ++seed) {
    const auto frames = d.clip_frames(0, seed);
    std::size_t k = frames.front();
    while (!key[k]) --k;
    const auto before = d.counters().decoded_frames;
    read_sample(d, 0, seed);
    const auto cost = d.counters().decoded_frames - before;
    EXPECT_LE(cost, frames.back() - k + 1) << "seed " << seed;
  }
  // B-frames shown before a clip that nothing refers to are skipped, not decoded: clips read
  // each by a fresh data set (no decoder to go on from) cost less than keyframe to end.
  std::uint64_t fresh_cost = 0, fresh_bound = 0;
  for (std::uint64_t seed = 0; seed < 10; ++seed) {
    VideoClips fresh(o);
    const auto frames = fresh.clip_frames(0, seed);
    std::size_t k = frames.front();
    while (!key[k]) --k;
    read_sample(fresh, 0, seed);
    EXPECT_EQ(fresh.counters().seeks, 1u);
    fresh_cost += fresh.counters().decoded_frames;
    fresh_bound += frames.back() - k + 1;
  }
  EXPECT_LT(fresh_cost, fresh_bound);
  // Each read either seeked to its keyframe or went on from where the last one stopped.
  const auto c = d.counters();
  EXPECT_EQ(c.seeks + c.continued, 30u);
  EXPECT_EQ(c.opened, 1u);
}

TEST(VideoClips, ClipsInOrderGoOnDecodingWithoutSeekingBack) {
  TempDir dir;
  write_video(dir / "a.mp4", {});
  auto o = small({(dir / "a.mp4").string()}, dir / "cache");
  o.frames = 4;
  o.clips_per_video = 10;  // starts 0, 6, 12, ... 56
  VideoClips d(o);
  for (std::size_t c = 0; c < 10; ++c) read_sample(d, c);
  const auto c = d.counters();
  EXPECT_EQ(c.seeks + c.continued, 10u);
  EXPECT_GE(c.continued, 4u);        // clips whose keyframe the decoder had passed already
  EXPECT_LE(c.decoded_frames, 60u);  // never a frame twice
  EXPECT_GE(c.decoded_frames, 40u);
}

TEST(VideoClips, IndexesAreCachedAndUsedAgainWhileTheFileIsUnchanged) {
  TempDir dir;
  write_video(dir / "a.mp4", {});
  write_video(dir / "b.mp4", with_frames(30));
  const auto o = small({dir.path().string()}, dir / "cache");
  VideoClips first(o);
  EXPECT_EQ(first.counters().indexed, 2u);
  EXPECT_EQ(first.counters().from_cache, 0u);
  VideoClips second(o);
  EXPECT_EQ(second.counters().from_cache, 2u);
  EXPECT_EQ(second.frame_times(1), first.frame_times(1));
  EXPECT_EQ(second.keyframes(0), first.keyframes(0));
  write_video(dir / "b.mp4", with_frames(20));  // changed: indexed again
  VideoClips third(o);
  EXPECT_EQ(third.counters().from_cache, 1u);
  EXPECT_EQ(third.frame_times(1).size(), 20u);
}

TEST(VideoClips, AFolderOfClassFoldersLabelsVideosByClass) {
  TempDir dir;
  fs::create_directories(dir / "root" / "cat");
  fs::create_directories(dir / "root" / "dog" / "sub");
  write_video(dir / "root" / "dog" / "sub" / "x.mp4", with_frames(20));
  write_video(dir / "root" / "cat" / "y.mkv.mp4", with_frames(20));
  write_video(dir / "root" / "cat" / "a.mp4", with_frames(20));
  VideoClips d(small({(dir / "root").string()}, dir / "cache"));
  EXPECT_EQ(d.classes(), (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(d.videos(), 3u);
  EXPECT_EQ(fs::path(d.path(0)).filename(), "a.mp4");
  EXPECT_EQ(d.label(0), 0);
  EXPECT_EQ(d.label(1), 0);
  EXPECT_EQ(d.label(2), 1);
  EXPECT_EQ(read_sample(d, 2).label, 1);
}

// A WebDataset shard of videos: each video member is read in place (nothing extracted), gives
// the clips the same file gives, and takes its label from the sample's .cls member; its index
// is cached like a file's.
TEST(VideoClips, VideosInAWebDatasetShardAreReadInPlaceWithTheirClsLabels) {
  TempDir dir;
  fs::create_directories(dir / "files");
  write_video(dir / "files" / "s1.mp4", {});
  write_video(dir / "files" / "s2.mp4", with_frames(30));
  write_file(dir / "files" / "s1.cls", "3\n");
  write_file(dir / "files" / "s2.cls", "5");
  const std::string tar = (dir / "shard.tar").string();
  ASSERT_EQ(std::system(("tar --format=ustar -cf " + tar + " -C " + (dir / "files").string() +
                         " s1.cls s1.mp4 s2.cls s2.mp4")
                            .c_str()),
            0);
  auto o = small({tar}, dir / "cache");
  o.clips_per_video = 2;
  VideoClips shard(o);
  o.paths = {(dir / "files" / "s1.mp4").string(), (dir / "files" / "s2.mp4").string()};
  VideoClips files(o);
  ASSERT_EQ(shard.videos(), 2u);
  EXPECT_EQ(shard.path(1), tar + " member 's2.mp4'");
  EXPECT_EQ(shard.label(0), 3);
  EXPECT_EQ(shard.label(1), 5);
  EXPECT_EQ(shard.frame_times(1), files.frame_times(1));
  for (std::size_t i = 0; i < shard.size(); ++i) {
    const Sample a = read_sample(shard, i), b = read_sample(files, i);
    EXPECT_EQ(a.clip, b.clip) << i;
    EXPECT_EQ(a.label, shard.label(i / 2));
    EXPECT_DOUBLE_EQ(a.start, b.start);
  }
  o.paths = {tar};
  EXPECT_EQ(VideoClips(o).counters().from_cache, 2u);
  write_file(dir / "files" / "s2.cls", "five");
  ASSERT_EQ(std::system(("tar --format=ustar -cf " + tar + " -C " + (dir / "files").string() +
                         " s1.mp4 s2.cls s2.mp4")
                            .c_str()),
            0);
  const std::string e = error_of([&] { VideoClips d(o); });
  EXPECT_NE(e.find(tar + " member 's2.cls': not an integer label ('five')"), std::string::npos)
      << e;
}

TEST(VideoClips, AVideoShorterThanAClipRepeatsItsLastFrame) {
  TempDir dir;
  write_video(dir / "short.mp4", with_frames(5));
  VideoClips d(small({(dir / "short.mp4").string()}, dir / "cache"));
  EXPECT_EQ(frame_numbers(d, read_sample(d, 0)), (std::vector<int>{0, 1, 2, 3, 4, 4, 4, 4}));
}

// ---- bad files: a clear error naming the file, at construction for what the index sees

TEST(VideoClips, BadFilesAreRefusedAtConstructionNamingFileAndReason) {
  TempDir dir;
  write_video(dir / "good.mp4", {});
  write_video(dir / "fast.mp4", faststart());
  const std::string good = read_file(dir / "good.mp4");
  const std::string fast = read_file(dir / "fast.mp4");
  struct Case {
    std::string name, data, reason;
  };
  std::string no_moov = good;
  const auto moov = no_moov.find("moov");
  ASSERT_NE(moov, std::string::npos);
  no_moov.replace(moov, 4, "zzzz");  // (FFmpeg finds a moov renamed "free")
  write_video(dir / "audio.mp4", audio_only());
  const std::vector<Case> cases{
      {"truncated.mp4", fast.substr(0, fast.size() * 6 / 10), "truncated"},
      {"cut_before_moov.mp4", good.substr(0, good.size() * 6 / 10), "moov atom"},
      {"no_moov.mp4", no_moov, "moov atom"},
      {"empty.mp4", "", "cannot open"},
      {"text.mp4", "this is not a video\n", "cannot open"},
      {"audio.mp4", read_file(dir / "audio.mp4"), "no video stream (audio only)"},
  };
  for (const Case& c : cases) {
    const fs::path p = dir / c.name;
    if (c.name != "audio.mp4") write_file(p, c.data);
    const std::string e = error_of([&] { VideoClips d(small({p.string()}, dir / "cache")); });
    EXPECT_NE(e.find(p.string() + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(c.reason), std::string::npos) << c.name << ": " << e;
  }
}

TEST(VideoClips, AVideoStreamWithoutFramesIsRefused) {
  TempDir dir;
  write_video(dir / "zero.mp4", with_frames(0));
  const std::string p = (dir / "zero.mp4").string();
  const std::string e = error_of([&] { VideoClips d(small({p}, dir / "cache")); });
  EXPECT_NE(e.find(p + ": "), std::string::npos) << e;
  EXPECT_TRUE(e.find("no frames") != std::string::npos || e.find("no streams") != std::string::npos)
      << e;
}

// A stream whose packets are garbage: the index (packets, timestamps) is fine; the read fails
// with the file named, and through the loader it is a SampleError that on_error=skip skips.
TEST(VideoClips, AStreamThatDoesNotDecodeFailsItsReadsNamingTheFile) {
  TempDir dir;
  write_video(dir / "good.mp4", with_frames(30));
  std::string bad = read_file(dir / "good.mp4");
  const auto mdat = bad.find("mdat");
  const auto moov = bad.find("moov");
  ASSERT_NE(mdat, std::string::npos);
  ASSERT_GT(moov, mdat);
  // The second half of the frames' data replaced by noise: the first keyframes still decode.
  std::uint64_t x = 12345;
  for (std::size_t i = mdat + (moov - mdat) / 2; i + 8 < moov; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    bad[i] = static_cast<char>(x >> 56);
  }
  write_file(dir / "bad.mp4", bad);
  auto o = small({(dir / "good.mp4").string(), (dir / "bad.mp4").string()}, dir / "cache");
  // The demuxer's parser may see the damage already (no keyframe left): then the index refuses
  // the file; else its reads fail. Either way the file is named, and nothing crashes or hangs.
  std::shared_ptr<VideoClips> d;
  const std::string at_open = error_of([&] { d = std::make_shared<VideoClips>(o); });
  if (!d) {
    EXPECT_NE(at_open.find((dir / "bad.mp4").string() + ": "), std::string::npos) << at_open;
    return;
  }
  const std::string e = error_of([&] { read_sample(*d, 1); });
  EXPECT_NE(e.find((dir / "bad.mp4").string() + ": "), std::string::npos) << e;
  EXPECT_NO_THROW(read_sample(*d, 0));

  LoaderOptions lo;
  lo.dataset = d;
  lo.batch_size = 2;
  lo.workers = 2;
  lo.on_error = ErrorPolicy::skip;
  Loader loader(lo);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  ASSERT_EQ(batch->skipped().size(), 1u);
  EXPECT_EQ(batch->skipped()[0].index, 1u);
  EXPECT_NE(batch->skipped()[0].reason.find("bad.mp4"), std::string::npos);
}

}  // namespace
}  // namespace stoker
