"""transforms' `exact` setting and the transform spec the C++ side parses."""

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import transforms as T


def val_reference(path, resize=256, size=224):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    nw, nh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size)), np.float64)


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """One 2400x1600 JPEG: 1600 / 256 = 6.25, so the default mode decodes it at 1/2."""
    root = tmp_path_factory.mktemp("large")
    (root / "x").mkdir()
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:1600, 0:2400].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / 13.0) * np.cos(y / 7.0), (x + y) % 256,
                    128 + 90 * np.sin((x - y) / 5.0)], -1)
    img = np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(root / "x" / "big.jpg", quality=92)
    return root


def first_image(root, transform):
    ds = stoker.ImageFolder(root, transform=transform)
    (images, _), = list(stoker.DataLoader(ds, batch_size=1))
    return images[0].permute(1, 2, 0).numpy().astype(np.float64)  # HWC uint8 -> float


def test_exact_gives_pillows_pixels_and_the_default_scales(large):
    ref = val_reference(large / "x" / "big.jpg")
    pipeline = [T.Resize(256), T.CenterCrop(224), T.PILToTensor()]
    exact = first_image(large, T.Compose(pipeline, exact=True))
    default = first_image(large, T.Compose(pipeline))
    assert np.abs(exact - ref).mean() < 0.05
    # DCT-scaled: close to torchvision's output, but not its pixels (so `exact` reached C++).
    assert 0 < np.abs(default - ref).mean() < 1.0


def test_spec_carries_every_setting():
    assert T.val(exact=True).settings()["exact"] is True
    assert "exact=1" in T.train(exact=True).spec() and "exact=0" in T.train().spec()
    spec = T.Compose([T.RandomResizedCrop(96, scale=(np.float64(0.25), 0.5), ratio=(0.5, 2)),
                      T.PILToTensor(layout="hwc")]).spec()
    assert sorted(spec.split()) == sorted(["flip=0", "scale=0.25,0.5", "ratio=0.5,2", "resize=96",
                            "dtype=uint8", "layout=hwc", "mean=0.0,0.0,0.0", "std=1.0,1.0,1.0",
                            "exact=0", "crop=random_resized", "size=96"])


def test_bad_settings_are_refused_by_the_parser(large):
    with pytest.raises(ValueError, match="scale"):
        stoker.ImageFolder(large, transform=T.Compose([T.RandomResizedCrop(64, scale=(0.9, 0.1)),
                                                       T.ToTensor()]))
    with pytest.raises(ValueError, match="resize"):
        stoker.ImageFolder(large, transform=T.Compose([T.Resize(32), T.CenterCrop(64),
                                                       T.ToTensor()]))


def _png(width, height, depth, color, rows, extra=b"", interlace=0):
    """A PNG written chunk by chunk (PIL cannot write 16-bit RGB or gAMA): `rows` are the raw
    scanlines (filter byte 0 is added)."""
    import struct
    import zlib

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    raw = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color, 0, 0,
                                         interlace))
            + extra + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _gama(gamma):
    import struct
    import zlib

    data = struct.pack(">I", int(gamma * 100000))
    return (struct.pack(">I", 4) + b"gAMA" + data
            + struct.pack(">I", zlib.crc32(b"gAMA" + data) & 0xFFFFFFFF))


def _png_cases():
    rng = np.random.default_rng(5)
    w = h = 32  # square: Resize and CenterCrop to its size touch no pixel
    rgb8 = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    rgba8 = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    gray8 = rng.integers(0, 256, (h, w), dtype=np.uint8)
    rgb16 = rng.integers(0, 65536, (h, w, 3)).astype(">u2")
    rgba16 = rng.integers(0, 65536, (h, w, 4)).astype(">u2")
    la16 = rng.integers(0, 65536, (h, w, 2)).astype(">u2")
    return {
        # Pillow ignores gAMA: the file's values, unconverted.
        "rgb_gamma1": _png(w, h, 8, 2, [r.tobytes() for r in rgb8], _gama(1.0)),
        "rgba_gamma08": _png(w, h, 8, 6, [r.tobytes() for r in rgba8], _gama(0.8)),
        "gray_gamma1": _png(w, h, 8, 0, [r.tobytes() for r in gray8], _gama(1.0)),
        # 16-bit color: the high byte of each sample.
        "rgb16": _png(w, h, 16, 2, [r.tobytes() for r in rgb16]),
        "rgba16_gamma1": _png(w, h, 16, 6, [r.tobytes() for r in rgba16], _gama(1.0)),
        "la16": _png(w, h, 16, 4, [r.tobytes() for r in la16]),
        # 2- and 4-bit gray, scaled to 8 bits.
        "gray2": _png(w, h, 2, 0, [np.packbits(np.unpackbits(
            (gray8[y] >> 6)[:, None], axis=1)[:, 6:].reshape(-1)).tobytes() for y in range(h)]),
        "gray4": _png(w, h, 4, 0, [bytes((a & 0xF0) | (b >> 4) for a, b in
                                         zip(gray8[y, 0::2], gray8[y, 1::2])) for y in range(h)]),
    }


@pytest.mark.parametrize("name", sorted(_png_cases()))
def test_png_flavours_give_pillows_pixels_exactly(tmp_path, name):
    (tmp_path / "x").mkdir()
    path = tmp_path / "x" / f"{name}.png"
    path.write_bytes(_png_cases()[name])
    with Image.open(path) as im:
        ref = np.asarray(im.convert("RGB"), np.float64)
    size = ref.shape[0]
    mine = first_image(tmp_path, T.Compose([T.Resize(size), T.CenterCrop(size),
                                            T.PILToTensor()], exact=True))
    assert mine.shape == ref.shape
    assert np.abs(mine - ref).max() == 0, name


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
def test_a_jpeg_crop_has_the_whole_images_pixels_at_its_edges(tmp_path, subsampling):
    # Crops whose columns start on, and end inside, an iMCU: libjpeg's upsampling of a cropped
    # span repeats its edge chroma sample, which the decoder keeps away from the crop.
    (tmp_path / "x").mkdir()
    rng = np.random.default_rng(subsampling)
    y, x = np.mgrid[0:240, 0:320]
    img = np.stack([(x * 7) % 256, (y * 5 + x) % 256, (x * y) % 256], -1) + rng.normal(0, 20, (240, 320, 3))
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
        tmp_path / "x" / "a.jpg", quality=92, subsampling=subsampling)
    with Image.open(tmp_path / "x" / "a.jpg") as im:
        whole = np.asarray(im.convert("RGB"), np.float64)
    for size in (240, 224, 200, 96):  # CenterCrop only: columns 40.., 48.., 60.., 112..
        mine = first_image(tmp_path, T.Compose([T.Resize(240), T.CenterCrop(size),
                                                T.PILToTensor()], exact=True))
        top, left = int(round((240 - size) / 2.0)), int(round((320 - size) / 2.0))
        ref = whole[top:top + size, left:left + size]
        assert np.abs(mine - ref).max() <= 1, (subsampling, size)
