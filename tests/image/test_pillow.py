"""stoker's image pipelines against Pillow, which is what torchvision's transforms run on PIL
images (RandomResizedCrop = crop + resize(BILINEAR), Resize = resize(BILINEAR), CenterCrop).

Calls the `stoker` command line (`stoker decode`, a hidden test helper, and `stoker pack`):
STOKER_BIN names it (default: build/stoker in the repository).
"""

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
STOKER = os.environ.get("STOKER_BIN", str(ROOT / "build" / "stoker"))
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
LIMIT = 2.0  # mean absolute difference per value, in 8-bit levels (2/255 of the range)


def photo(width, height, seed, mode="RGB"):
    """Photo-like content: smooth shapes, gradients and a little noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(5, 40), rng.uniform(5, 40), rng.uniform(0, 6)
        img[..., c] = 128 + 70 * np.sin(x / fx + ph) * np.cos(y / fy - ph) + 40 * (x / width - 0.5)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(10, 80)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] += rng.uniform(-60, 60, 3)
    img += rng.normal(0, 6, img.shape)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return im.convert(mode) if mode != "RGB" else im


def decode(path, *args):
    out = Path(str(path) + ".npy")
    r = subprocess.run([STOKER, "decode", str(path), "--out", str(out), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(out), json.loads(r.stdout)


def val_reference(img, resize=256, size=224):
    """torchvision: Resize(resize) then CenterCrop(size), on a PIL image."""
    w, h = img.size
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    r = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return np.asarray(r.crop((left, top, left + size, top + size)), dtype=np.float64)


def crop_reference(img, box, size=224):
    """torchvision: F.resized_crop(img, top, left, h, w, size) on a PIL image."""
    x, y, w, h = box
    return np.asarray(img.crop((x, y, x + w, y + h)).resize((size, size), Image.BILINEAR),
                      dtype=np.float64)


def mad(a, b):
    return float(np.abs(a.astype(np.float64) - b).mean())


CASES = [  # (name, width, height, save options, mode)
    ("landscape", 500, 375, dict(quality=90), "RGB"),
    ("portrait", 333, 500, dict(quality=90), "RGB"),
    ("small", 300, 300, dict(quality=90), "RGB"),
    ("444", 457, 341, dict(quality=90, subsampling=0), "RGB"),
    ("progressive", 480, 360, dict(quality=85, progressive=True), "RGB"),
    ("gray", 420, 315, dict(quality=90), "L"),
    ("cmyk", 400, 300, dict(quality=90), "CMYK"),
    ("large", 1400, 1050, dict(quality=90), "RGB"),  # DCT-domain scaling on this one
    ("png", 380, 290, dict(), "RGB"),
    ("palette", 360, 270, dict(), "P"),  # 8-bit palette PNG
]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    out = {}
    for i, (name, w, h, opts, mode) in enumerate(CASES):
        path = d / (name + (".png" if name in ("png", "palette") else ".jpg"))
        photo(w, h, seed=i, mode=mode).save(path, **opts)
        out[name] = path
    return out


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_val_pipeline_matches_pillow(images, name):
    path = images[name]
    mine, info = decode(path, "--pipeline", "val")
    ref = val_reference(Image.open(path).convert("RGB"))
    assert mine.shape == (224, 224, 3) and mine.dtype == np.uint8
    assert (info["width"], info["height"]) == Image.open(path).size
    assert mad(mine, ref) < LIMIT, name


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_random_resized_crop_with_a_fixed_box_matches_pillow(images, name):
    path = images[name]
    img = Image.open(path).convert("RGB")
    w, h = img.size
    boxes = [(0, 0, w, h), (w // 7, h // 5, w // 2, h // 3), (w - 150, h - 120, 150, 120),
             (w // 3, 0, w // 2, h)]
    for box in boxes:
        mine, _ = decode(path, "--pipeline", "train", "--crop", *map(str, box))
        assert mad(mine, crop_reference(img, box)) < LIMIT, (name, box)


def test_random_draw_and_flip_match_pillow_on_the_reported_box(images):
    img = Image.open(images["landscape"]).convert("RGB")
    flips = 0
    for seed in range(12):
        mine, info = decode(images["landscape"], "--pipeline", "train", "--seed", str(seed))
        ref = crop_reference(img, info["crop"])
        if info["flip"]:
            ref = ref[:, ::-1]
            flips += 1
        assert mad(mine, ref) < LIMIT, (seed, info)
    assert 0 < flips < 12


def test_normalized_float_chw_output(images):
    path = images["landscape"]
    mine, _ = decode(path, "--pipeline", "val", "--dtype", "f32", "--layout", "chw")
    assert mine.shape == (3, 224, 224) and mine.dtype == np.float32
    ref = val_reference(Image.open(path).convert("RGB"))
    ref = ((ref.astype(np.float32) / 255.0 - MEAN) / STD).transpose(2, 0, 1)
    assert float(np.abs(mine - ref).mean()) < LIMIT / 255.0 / STD.min()


def test_bad_files_name_the_path_and_reason(tmp_path, images):
    cases = {
        "empty.jpg": (b"", "empty file"),
        "text.jpg": (b"hello, world" * 10, "not an image"),
        "truncated.jpg": (images["landscape"].read_bytes()[:5000], "truncated JPEG"),
        "anim.gif": (b"GIF89a" + bytes(100), "unsupported image format GIF"),
    }
    for name, (data, reason) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        r = subprocess.run([STOKER, "decode", str(p)], capture_output=True, text=True)
        assert r.returncode != 0
        assert str(p) in r.stderr and reason in r.stderr, r.stderr


def read_shard(path):
    """A reader written from docs/record_format.md alone."""
    data = path.read_bytes()
    magic, version, header_bytes, records, index_offset, index_bytes = struct.unpack_from(
        "<8sIIQQQ", data, 0)
    assert magic == b"STOKREC\n" and version == 1 and header_bytes == 64
    shard, shards = struct.unpack_from("<II", data, 56)
    assert shard < shards
    index = data[index_offset:index_offset + index_bytes]
    (classes,), at = struct.unpack_from("<I", index, 0), 4
    names = []
    for _ in range(classes):
        (n,) = struct.unpack_from("<I", index, at)
        names.append(index[at + 4:at + 4 + n].decode())
        at += 4 + n
    out = []
    for r in range(records):
        offset, length, label, _, _, _ = struct.unpack_from("<QQqQII", index, at + 40 * r)
        out.append((data[offset:offset + length], label))
    return names, out


def test_pack_round_trips_byte_for_byte(tmp_path, images):
    src = tmp_path / "folder"
    files = []
    for cls, names in {"n01": ["landscape", "gray"], "n02": ["portrait", "png", "small"]}.items():
        (src / cls).mkdir(parents=True)
        for n in names:
            p = src / cls / images[n].name
            p.write_bytes(images[n].read_bytes())
            files.append((p, cls))
    files.sort(key=lambda f: (f[1], str(f[0])))
    r = subprocess.run([STOKER, "pack", str(src), str(tmp_path / "packed")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    shards = sorted((tmp_path / "packed").glob("*.stkr"))
    assert len(shards) == 1
    classes, records = read_shard(shards[0])
    assert classes == ["n01", "n02"]
    assert [(p.read_bytes(), classes.index(c)) for p, c in files] == records
