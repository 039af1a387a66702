"""Video clips per second: stoker.VideoClips in stoker.DataLoader against PyAV in torch's
DataLoader at its best num_workers, in one run, on clips this bench makes with FFmpeg's test
source (testsrc2, H.264 through libx264, 640x360 at 30 fps, and a variable-frame-rate set:
frames dropped from the 30 fps stream with their timestamps kept). 16-frame clips, resized to
224x224 uint8 [T, 3, H, W]: random clips over many files and uniform clips over few files.
Besides clips/s, the CPU time a clip costs (the process's threads and its worker processes),
which a machine shared with other work changes less than the wall-clock rate.

torchcodec is not measured where it cannot load: its wheels from the package index link
PyTorch's CUDA libraries (libtorch_cuda.so), which a CPU build of torch does not have.

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


class PyAVClips(torch.utils.data.Dataset):
    """What users write with PyAV: open the file, seek to the clip's start, decode T frames
    from there, each converted and resized by libswscale (frame.reformat)."""

    def __init__(self, paths, clips, per_video, seed=0):
        import av
        self.av = av
        self.paths, self.clips, self.per_video, self.seed = paths, clips, per_video, seed
        self.durations = []
        for p in paths:
            with av.open(p) as f:
                s = f.streams.video[0]
                self.durations.append(float(s.duration * s.time_base))
        self.epoch = 0

    def __len__(self):
        return len(self.paths) * self.per_video

    def __getitem__(self, i):
        v, k = divmod(i, self.per_video)
        room = max(0.0, self.durations[v] - (T + 1) / 30)
        if self.clips == "random":
            start = random.Random(hash((self.seed, self.epoch, i))).random() * room
        else:
            start = room / 2 if self.per_video == 1 else k * room / (self.per_video - 1)
        out = np.empty((T, SIZE, SIZE, 3), np.uint8)
        with self.av.open(self.paths[v]) as f:
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
        while 0 < n < T:  # a clip past the end repeats its last frame
            out[n] = out[n - 1]
            n += 1
        return torch.from_numpy(out).permute(0, 3, 1, 2), v


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
        ("random clips, many files (640x360 30 fps)", cfr, "random", per_random),
        ("uniform clips, few files (640x360 30 fps)", cfr[:few], "uniform", per_uniform),
        ("random clips, variable frame rate", vfr, "random", per_random),
    ]
    print(f"{T}-frame clips resized to {SIZE}x{SIZE}, batch 8, {args.epochs} epochs each; "
          f"{os.cpu_count()} cores")
    for name, paths, clips, per in workloads:
        ds = stoker.VideoClips(paths, frames=T, size=SIZE, clips=clips, clips_per_video=per,
                               index_cache=os.path.join(args.dir, "index"))
        loader = stoker.DataLoader(ds, batch_size=8, shuffle=clips == "random")
        s, s_cpu = rate(loader, args.epochs)
        workers = loader.num_workers if hasattr(loader, "num_workers") else "auto"
        counters = ds.counters()
        del loader
        best, best_w, best_cpu = 0.0, None, 0.0
        for w in args.workers:
            pyav = PyAVClips(paths, clips, per)
            tl = torch.utils.data.DataLoader(pyav, batch_size=8, num_workers=w,
                                             shuffle=clips == "random",
                                             persistent_workers=False)
            r, r_cpu = rate(tl, args.epochs)
            if r > best:
                best, best_w, best_cpu = r, w, r_cpu
        print(f"{name}: {len(ds)} clips/epoch")
        print(f"  stoker.VideoClips  {s:8.1f} clips/s  {s_cpu:6.1f} CPU ms/clip  "
              f"(stoker.DataLoader, workers {workers}; "
              f"decoded {counters['decoded_frames']} frames, {counters['seeks']} seeks, "
              f"{counters['continued']} continued)")
        print(f"  PyAV               {best:8.1f} clips/s  {best_cpu:6.1f} CPU ms/clip  "
              f"(torch DataLoader, best num_workers {best_w} of {args.workers})")
        print(f"  stoker / PyAV: {s / best:.2f}x the clips/s, {best_cpu / s_cpu:.2f}x fewer CPU "
              f"ms a clip")


if __name__ == "__main__":
    main()
