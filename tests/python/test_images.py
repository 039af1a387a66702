"""Native image data sets from Python: ImageFolder, record shards, the RAM cache, bad files."""

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
from stoker import transforms as T

MEAN = np.array(T.IMAGENET_MEAN, np.float32)[:, None, None]
STD = np.array(T.IMAGENET_STD, np.float32)[:, None, None]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 classes x 6 JPEGs of various sizes, plus a grayscale PNG."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "ant", "bee"]):
        (root / name).mkdir()
        for i in range(6):
            w, h = 260 + 37 * i, 300 - 11 * i
            y, x = np.mgrid[0:h, 0:w]
            img = np.stack([(x * (c + 1)) % 256, (y * 2) % 256, (x + y) % 256], -1)
            img = np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / name / f"{i:02d}.jpg", quality=90)
    Image.fromarray(np.full((280, 290), 77, np.uint8)).save(root / "bee" / "gray.png")
    return root


def val_reference(path):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    nw, nh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
    return np.asarray(img.crop((left, top, left + 224, top + 224)), np.float32).transpose(2, 0, 1)


def test_image_folder_labels_and_val_pipeline_match_pillow(folder):
    ds = stoker.ImageFolder(folder, transform=T.val())
    assert ds.classes == ["ant", "bee", "cat"]  # sorted, as torchvision's ImageFolder
    assert len(ds) == 19
    files = sorted((p for p in folder.rglob("*") if p.is_file()),
                   key=lambda p: (p.parent.name, p.name))
    loader = stoker.DataLoader(ds, batch_size=8, num_workers=2)
    images, labels = zip(*loader)
    images, labels = torch.cat(images), torch.cat(labels)
    assert images.shape == (19, 3, 224, 224) and images.dtype == torch.float32
    assert labels.tolist() == [ds.class_to_idx[p.parent.name] for p in files]
    for image, path in zip(images, files):
        pixels = (image.numpy() * STD + MEAN) * 255  # undo Normalize and ToTensor
        assert np.abs(pixels - val_reference(path)).mean() < 2.0, path


def test_train_pipeline_uint8_is_deterministic_across_workers(folder):
    pipeline = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(),
                          T.PILToTensor(layout="hwc")])
    ds = stoker.ImageFolder(folder, transform=pipeline)

    def epoch(workers):
        loader = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=4, num_workers=workers)
        return torch.cat([b[0] for b in loader])

    a, b = epoch(1), epoch(2)
    assert a.shape == (19, 96, 96, 3) and a.dtype == torch.uint8
    assert torch.equal(a, b)


def test_subset_and_concat_of_a_native_data_set_draw_new_augmentations(folder):
    """torch's wrappers read a native data set through Python: each read takes the sample's
    seed, so crops and flips change from epoch to epoch and from sample to sample."""
    pipeline = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(),
                          T.PILToTensor(layout="hwc")])
    ds = stoker.ImageFolder(folder, transform=pipeline)
    for wrapped in (torch.utils.data.Subset(ds, [0, 1, 2, 3]),
                    torch.utils.data.ConcatDataset([ds, ds]),
                    torch.utils.data.random_split(ds, [0.5, 0.5])[0]):
        loader = stoker.DataLoader(wrapped, batch_size=4, num_workers=2)
        first, second = (torch.cat([images for images, _ in loader]) for _ in range(2))
        assert not torch.equal(first, second)
    twice = torch.cat([images for images, _ in
                       stoker.DataLoader(torch.utils.data.ConcatDataset([ds, ds]),
                                         batch_size=19, num_workers=2)])
    assert not torch.equal(twice[:19], twice[19:])  # the same files, other samples


def test_records_round_trip_and_ram_cache_stops_storage_reads(folder, tmp_path):
    result = stoker.pack(folder, tmp_path / "packed")
    assert result["records"] == 19
    from_folder = stoker.ImageFolder(folder, transform=T.val())
    records = stoker.RecordDataset(tmp_path / "packed", transform=T.val(), cache_bytes=1 << 26)
    assert records.classes == from_folder.classes
    a = torch.cat([b[0] for b in stoker.DataLoader(from_folder, batch_size=8)])
    loader = stoker.DataLoader(records, batch_size=8, num_workers=2)
    b = torch.cat([b[0] for b in loader])
    assert torch.equal(a, b)
    first = records.counters()
    for _ in range(2):
        list(loader)
    later = records.counters()
    assert later["reads"] >= 3 * 19  # (the loader may already read ahead into the next epoch)
    assert later["storage_reads"] == first["storage_reads"] == 19
    assert later["cached"] == 19


def test_corrupt_file_is_named_and_skip_goes_on(folder, tmp_path):
    bad = tmp_path / "bad"
    (bad / "x").mkdir(parents=True)
    good = Image.fromarray(np.zeros((64, 64, 3), np.uint8))
    for i in range(4):
        good.save(bad / "x" / f"{i}.jpg")
    data = (bad / "x" / "2.jpg").read_bytes()
    (bad / "x" / "2.jpg").write_bytes(data[: len(data) // 3])  # truncated
    (bad / "x" / "3.jpg").write_bytes(b"not an image at all")
    ds = stoker.ImageFolder(bad, transform=T.val(64, 64))
    with pytest.raises(stoker.SampleError, match=r"2\.jpg") as info:
        list(stoker.DataLoader(ds, batch_size=4))
    assert info.value.index == 2
    loader = stoker.DataLoader(ds, batch_size=4, on_error="skip")
    (batch,) = list(loader)
    assert batch[0].shape == (4, 3, 64, 64)
    assert loader.stats()["skipped"] >= 2


def test_unsupported_pipelines_are_refused():
    with pytest.raises(ValueError, match="unsupported pipeline"):
        T.Compose([T.CenterCrop(224), T.ToTensor()]).settings()
    with pytest.raises(ValueError, match="unsupported pipeline"):
        T.Compose([T.RandomResizedCrop(224), T.ToTensor(), T.RandomHorizontalFlip()]).settings()


def test_to_tensor_is_torchvisions_to_tensor_and_normalize():
    """The native tail of a hybrid torchvision pipeline: uint8 HWC pixels to float32 CHW."""
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (40, 70, 3), dtype=np.uint8)
    expected = pixels.transpose(2, 0, 1).astype(np.float32) / 255
    np.testing.assert_allclose(stoker._stoker.to_tensor(pixels), expected, atol=1e-6)
    normalized = stoker._stoker.to_tensor(pixels, T.IMAGENET_MEAN, T.IMAGENET_STD)
    np.testing.assert_allclose(normalized, (expected - MEAN) / STD, atol=1e-5)
    # Rows need not follow each other (a crop of a larger image); pixels within a row must.
    crop = pixels[5:25, 10:50]
    np.testing.assert_allclose(stoker._stoker.to_tensor(crop), expected[:, 5:25, 10:50],
                               atol=1e-6)
    with pytest.raises(TypeError, match=r"\[H, W, 3\]"):
        stoker._stoker.to_tensor(pixels[..., :2])
    with pytest.raises(ValueError, match="contiguous"):
        stoker._stoker.to_tensor(pixels[:, ::2])
    with pytest.raises(ValueError, match="3 values"):
        stoker._stoker.to_tensor(pixels, (0.5,), (0.5,))
