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
