"""Video clips per second: stoker.VideoClips in stoker.DataLoader against PyAV in torch's
DataLoader at its best num_workers, in one run, on clips this bench makes with FFmpeg's test
source (testsrc2, H.264 through libx264, 640x360 at 30 fps, and a variable-frame-rate set:
frames dropped from the 30 fps stream with their timestamps kept). 16-frame clips, resized to
224x224 uint8 [T, 3, H, W]: random clips over many files and uniform clips over few files.
Besides clips/s, the CPU time a clip costs (the process's threads and its worker processes),
which a machine shared with other work changes less than the wall-clock rate.

Beside PyAV, where they import: SPDL (`spdl.io.demux_video` + `decode_packets` with its FFmpeg
filter doing the resize, in SPDL's own thread pipeline at its best concurrency, as SPDL's
examples load clips) and torchcodec (`VideoDecoder` with approximate seeking (exact for variable frame rates) and its
decoder-native `Resize`, `get_frames_played_in_range`, in torch's DataLoader at its best
num_workers: its fastest CPU path). The baselines that read a time range read T frames' worth
of it (at 30 fps, or at the variable-frame-rate set's sparsest) and keep the first T. torchcodec's wheels from the package index link PyTorch's
CUDA libraries (libtorch_cuda.so): with a CPU build of torch it does not load and is skipped,
named.

    python bench/video_bench.py [--smoke] [--workers 1 2 4] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import stoker

T, SIZE = 16, 224


def make_videos(d, n, seconds, vfr, w=640, h=360):
    """n H.264 files of `seconds` seconds (each a different stretch of testsrc2) under d."""
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        out = os.path.join(d, f"{i:04d}.mp4")
        if os.path.exists(out):
            continue
        vf = f"select='lt(mod(n\\,10)\\,{4 + i % 5})'" if vfr else "null"
        cmd = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
               f"testsrc2=size={w}x{h}:rate=30", "-ss", str(i % 7), "-t", str(seconds),
               "-vf", vf, "-c:v", "libx264", "-preset", "veryfast", "-g", "30",
               "-pix_fmt", "yuv420p"]
        cmd += ["-fps_mode", "vfr"] if vfr else []
        subprocess.run(cmd + [out + ".tmp.mp4"], check=True)
        os.replace(out + ".tmp.mp4", out)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".mp4")
                  and not f.endswith(".tmp.mp4"))


def durations_of(paths):
    """Each video's duration in seconds (PyAV reads the container's header)."""
    import av
    out = []
    for p in paths:
        with av.open(p) as f:
            s = f.streams.video[0]
            out.append(float(s.duration * s.time_base))
    return out


class Clips(torch.utils.data.Dataset):
    """The clips every baseline reads: clip i is (video, start in seconds), random starts
    drawn per (seed, epoch, i), uniform ones spread over the video. A subclass reads it."""

    def __init__(self, paths, clips, per_video, durations, seed=0, vfr=False):
        self.paths, self.clips, self.per_video, self.seed = paths, clips, per_video, seed
        self.durations = durations
        self.epoch = 0
        # The seconds a window of T frames spans (the baselines that read a time range): T
        # frames at 30 fps, or at the variable-frame-rate set's sparsest (4 of every 10 kept).
        self.window_s = (T + 0.5) / 30 * (10 / 4 if vfr else 1)
        self.vfr = vfr

    def __len__(self):
        return len(self.paths) * self.per_video

    def clip(self, i):
        v, k = divmod(i, self.per_video)
        room = max(0.0, self.durations[v] - (T + 1) / 30)
        if self.clips == "random":
            start = random.Random(hash((self.seed, self.epoch, i))).random() * room
        else:
            start = room / 2 if self.per_video == 1 else k * room / (self.per_video - 1)
        return v, start


def pad_clip(out, n):
    """A clip past the end repeats its last frame."""
    while 0 < n < T:
        out[n] = out[n - 1]
        n += 1
    return out


class PyAVClips(Clips):
    """What users write with PyAV: open the file, seek to the clip's start, decode T frames
    from there, each converted and resized by libswscale (frame.reformat)."""

    def __getitem__(self, i):
        import av
        v, start = self.clip(i)
        out = np.empty((T, SIZE, SIZE, 3), np.uint8)
        with av.open(self.paths[v]) as f:
            s = f.streams.video[0]
            f.seek(int(start / s.time_base), stream=s, backward=True)
            n = 0
            for frame in f.decode(s):
                if frame.time is None or frame.time < start - 1e-6:
                    continue
                out[n] = frame.reformat(width=SIZE, height=SIZE, format="rgb24").to_ndarray()
                n += 1
                if n == T:
                    break
        return torch.from_numpy(pad_clip(out, n)).permute(0, 3, 1, 2), v


class TorchcodecClips(Clips):
    """torchcodec at its fastest: VideoDecoder with seek_mode='approximate' (no scan of the
    whole file per decoder; 'exact' for variable frame rates, where the approximate index
    asks for frames the file does not have) and its decoder-native Resize (FFmpeg's scaler,
    bilinear with antialiasing), the first T frames played from the clip's start."""

    def __getitem__(self, i):
        from torchcodec.decoders import VideoDecoder
        from torchcodec.transforms import Resize
        v, start = self.clip(i)
        dec = VideoDecoder(self.paths[v], dimension_order="NCHW",
                           seek_mode="exact" if self.vfr else "approximate",
                           transforms=[Resize((SIZE, SIZE))])
        end = min(start + self.window_s, self.durations[v])
        out = dec.get_frames_played_in_range(start, end).data[:T]
        if out.shape[0] < T:
            out = torch.cat([out, out[-1:].expand(T - out.shape[0], -1, -1, -1)])
        return out, v


def spdl_clip(paths, clips):
    """One clip by SPDL: demux the packets of the clip's window (from the keyframe before
    it), decode them through FFmpeg's filter graph (scaled to SIZE x SIZE, rgb24; SPDL keeps
    the frames within the window), convert to one array of the first T."""
    import spdl.io
    filt = spdl.io.get_video_filter_desc(scale_width=SIZE, scale_height=SIZE, scale_mode=None,
                                         pix_fmt="rgb24")

    def load(i):
        v, start = clips.clip(i)
        end = min(start + clips.window_s, clips.durations[v])
        packets = spdl.io.demux_video(paths[v], timestamp=(start, end))
        frames = spdl.io.decode_packets(packets, filter_desc=filt)
        out = np.empty((T, SIZE, SIZE, 3), np.uint8)
        got = spdl.io.to_numpy(spdl.io.convert_frames(frames))[:T]
        out[:len(got)] = got
        return torch.from_numpy(pad_clip(out, len(got))).permute(0, 3, 1, 2), v
    return load


class SpdlLoader:
    """SPDL's own pipeline (spdl.pipeline.PipelineBuilder): clip indices in (shuffled for
    random clips), `concurrency` clips loaded at once on its thread pool (SPDL's decoding
    releases the GIL), batches of 8 stacked."""

    def __init__(self, clips, shuffle, concurrency):
        self.clips, self.shuffle, self.concurrency = clips, shuffle, concurrency
        self.load = spdl_clip(clips.paths, clips)

    def __iter__(self):
        from spdl.pipeline import PipelineBuilder
        order = list(range(len(self.clips)))
        if self.shuffle:
            random.Random(self.clips.epoch).shuffle(order)
        self.clips.epoch += 1

        def collate(items):
            return torch.stack([c for c, _ in items]), torch.tensor([v for _, v in items])
        pipeline = (PipelineBuilder().add_source(order)
                    .pipe(self.load, concurrency=self.concurrency, output_order="input")
                    .aggregate(8).pipe(collate).add_sink(4)
                    .build(num_threads=self.concurrency))
        with pipeline.auto_stop():
            yield from pipeline


def importable(name):
    """None when `name` imports, else why not (one line)."""
    try:
        __import__(name)
        return None
    except Exception as e:  # noqa: BLE001 - a wheel that does not load says why
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def cpu_seconds():
    """CPU time of this process (its threads) and of its waited-for children (the worker
    processes of torch's DataLoader, joined at the end of each epoch)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def rate(loader, epochs):
    """(clips per second, CPU milliseconds per clip) over `epochs` epochs."""
    clips = 0
    cpu, start = cpu_seconds(), time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            clips += batch[0].shape[0]
    return clips / (time.perf_counter() - start), 1000 * (cpu_seconds() - cpu) / clips


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny data, one worker count: checks "
                    "the harness, measures nothing")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4],
                    help="torch DataLoader num_workers tried for PyAV (its best is reported)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "stoker-bench-video"))
    args = ap.parse_args()
    if not shutil.which("ffmpeg"):
        sys.exit("video_bench: needs the ffmpeg command (apt install ffmpeg)")
    if args.smoke:
        args.workers, args.epochs = [1], 1
        args.dir += "-smoke"
    many, few, secs = (4, 2, 2) if args.smoke else (32, 3, 10)
    cfr = make_videos(os.path.join(args.dir, "cfr"), many, secs, vfr=False)
    vfr = make_videos(os.path.join(args.dir, "vfr"), many // 2, secs, vfr=True)
    per_random, per_uniform = (2, 4) if args.smoke else (2, 16)
    workloads = [
        ("random clips, many files (640x360 30 fps)", cfr, "random", per_random, False),
        ("uniform clips, few files (640x360 30 fps)", cfr[:few], "uniform", per_uniform, False),
        ("random clips, variable frame rate", vfr, "random", per_random, True),
    ]
    print(f"{T}-frame clips resized to {SIZE}x{SIZE}, batch 8, {args.epochs} epochs each; "
          f"{os.cpu_count()} cores")
    why_not = {"PyAV": importable("av"), "SPDL": importable("spdl.io"),
               "torchcodec": importable("torchcodec.decoders")}
    for peer, why in why_not.items():
        if why:
            print(f"{peer}: not measured ({why})")
    for name, paths, clips, per, is_vfr in workloads:
        ds = stoker.VideoClips(paths, frames=T, size=SIZE, clips=clips, clips_per_video=per,
                               index_cache=os.path.join(args.dir, "index"))
        loader = stoker.DataLoader(ds, batch_size=8, shuffle=clips == "random")
        s, s_cpu = rate(loader, args.epochs)
        workers = loader.num_workers if hasattr(loader, "num_workers") else "auto"
        counters = ds.counters()
        del loader
        durations = durations_of(paths)
        print(f"{name}: {len(ds)} clips/epoch")
        print(f"  {'stoker.VideoClips':18} {s:8.1f} clips/s  {s_cpu:6.1f} CPU ms/clip  "
              f"(stoker.DataLoader, workers {workers}; "
              f"decoded {counters['decoded_frames']} frames, {counters['seeks']} seeks, "
              f"{counters['continued']} continued)")
        peers = {
            "PyAV": lambda w: torch.utils.data.DataLoader(
                PyAVClips(paths, clips, per, durations, vfr=is_vfr), batch_size=8, num_workers=w,
                shuffle=clips == "random", persistent_workers=False),
            "torchcodec": lambda w: torch.utils.data.DataLoader(
                TorchcodecClips(paths, clips, per, durations, vfr=is_vfr), batch_size=8, num_workers=w,
                shuffle=clips == "random", persistent_workers=False),
            "SPDL": lambda w: SpdlLoader(Clips(paths, clips, per, durations, vfr=is_vfr),
                                         clips == "random", concurrency=w),
        }
        for peer, make in peers.items():
            if why_not[peer]:
                continue
            best, best_w, best_cpu = 0.0, None, 0.0
            for w in args.workers:
                r, r_cpu = rate(make(w), args.epochs)
                if r > best:
                    best, best_w, best_cpu = r, w, r_cpu
            how = ("its thread pipeline, best concurrency" if peer == "SPDL"
                   else "torch DataLoader, best num_workers")
            print(f"  {peer:18} {best:8.1f} clips/s  {best_cpu:6.1f} CPU ms/clip  "
                  f"({how} {best_w} of {args.workers})")
            print(f"    stoker / {peer}: {s / best:.2f}x the clips/s, {best_cpu / s_cpu:.2f}x "
                  f"fewer CPU ms a clip")

if __name__ == "__main__":
    main()
