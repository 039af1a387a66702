"""Bad files through the Python package: under on_error='raise' the SampleError names the
sample, the file and the reason; under 'skip' the epoch has all its rows and skipped_samples()
lists exactly the bad files. The full corpus, with the batches' skipped lists checked sample by
sample, is tests/corrupt_data_test.cc."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker import transforms as T


def jpeg(w=160, h=120, seed=0, **opts):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x % 256, y % 256, (x * y) % 256], -1) + rng.normal(0, 5, (h, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90, **opts)
    return buf.getvalue()


def sof_size(data, w, h):
    """The JPEG with its frame header claiming w x h."""
    i = data.index(b"\xff\xc0") if b"\xff\xc0" in data else data.index(b"\xff\xc2")
    return data[:i + 5] + struct.pack(">HH", h, w) + data[i + 9:]


def png_size(data, w, h):
    """The PNG with its IHDR claiming w x h, CRC fixed."""
    ihdr = b"IHDR" + struct.pack(">II", w, h) + data[24:29]
    return data[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


def png():
    buf = io.BytesIO()
    Image.new("RGB", (50, 40), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


GOOD = jpeg()
BAD = {  # name: (bytes, reason in the message)
    "empty.jpg": (b"", "empty file"),
    "random.jpg": (np.random.default_rng(1).bytes(2000), "not an image"),
    "text.jpg": (b"just some text\n" * 20, "not an image"),
    "truncated_header.jpg": (GOOD[:120], "truncated JPEG"),
    "truncated_half.jpg": (GOOD[:len(GOOD) // 2], "truncated JPEG"),
    "truncated_progressive.jpg": (jpeg(progressive=True)[:900], "truncated JPEG"),
    # Cut short and ended with an end marker (a partial download): libjpeg warns that the data
    # segment ended early and would fill the rest with gray.
    "cut_then_end_marker.jpg": (GOOD[:len(GOOD) // 2] + b"\xff\xd9",
                                "corrupt JPEG (Corrupt JPEG data: premature end of data segment)"),
    "huge.jpg": (sof_size(GOOD, 60000, 60000), "over the limit"),
    "zero.jpg": (sof_size(GOOD, 0, 0), "Empty JPEG image"),
    "huge.png": (png_size(png(), 60000, 60000), "over the limit"),
    "truncated.png": (png()[:60], "PNG"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_raise_names_the_file_and_the_reason(tmp_path, name):
    data, reason = BAD[name]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a_good.jpg").write_bytes(GOOD)
    bad = tmp_path / "x" / ("b_" + name)
    bad.write_bytes(data)
    ds = stoker.ImageFolder(tmp_path, transform=T.val(40, 32))
    with pytest.raises(stoker.SampleError) as info:
        list(stoker.DataLoader(ds, batch_size=2))
    assert info.value.index == 1
    assert str(bad) in str(info.value) and reason in str(info.value), str(info.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_finishes_the_epoch_with_every_row(tmp_path, workers):
    (tmp_path / "x").mkdir()
    for i in range(12):
        (tmp_path / "x" / f"good{i}.jpg").write_bytes(jpeg(seed=i))
    for name, (data, _) in BAD.items():
        (tmp_path / "x" / name).write_bytes(data)
    ds = stoker.ImageFolder(tmp_path, transform=T.val(40, 32))
    loader = stoker.DataLoader(ds, batch_size=4, num_workers=workers, on_error="skip")
    for _ in range(2):
        rows = sum(images.shape[0] for images, _ in loader)
        assert rows == len(ds) == 12 + len(BAD)
    # Counts failures, replacements that failed too included; the report lists each bad file
    # once, by index (ImageFolder's order: sorted by name), path and reason.
    assert loader.stats()["skipped"] >= 2 * len(BAD)
    assert loader.stats()["bad_samples"] == len(BAD)
    report = loader.skipped_samples()
    files = sorted((tmp_path / "x").iterdir())
    assert [s.index for s in report] == [i for i, f in enumerate(files) if f.name in BAD]
    for s in report:
        assert s.name == str(files[s.index])
        assert BAD[files[s.index].name][1] in s.reason, s


class BrokenFiles:
    """A Python data set over files, torchvision's DatasetFolder-style ``samples``."""

    def __init__(self, root):
        self.samples = [(str(p), 0) for p in sorted(root.iterdir())]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path = self.samples[index][0]
        if "bad" in path:
            raise OSError(f"cannot decode {path}")
        return np.full(3, index, dtype=np.int64)


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_skipped_samples_of_a_python_data_set_name_its_files(tmp_path, worker_type):
    for i in range(12):
        (tmp_path / (f"bad{i}.bin" if i % 4 == 1 else f"good{i}.bin")).write_bytes(b"x")
    ds = BrokenFiles(tmp_path)
    loader = stoker.DataLoader(ds, batch_size=3, num_workers=2, worker_type=worker_type,
                               on_error="skip", shuffle=True, seed=3)
    for batch in loader:
        assert all("bad" not in ds.samples[int(i)][0] for i in batch[:, 0])
    bad = [i for i, (path, _) in enumerate(ds.samples) if "bad" in path]
    report = loader.skipped_samples()
    assert [s.index for s in report] == bad
    assert all(s.name == ds.samples[s.index][0] and "cannot decode" in s.reason for s in report)
