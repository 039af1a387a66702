"""torchvision's ImageFolder through stoker.DataLoader: run natively when stoker implements the
whole pipeline, in Python otherwise. Needs torchvision (skipped without it; the README's
benchmark environment .venv-vision has it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
tvt = torchvision.transforms
Image = pytest.importorskip("PIL.Image")

import stoker  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tvfolder")
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:300, 0:360]
    for i in range(12):
        d = root / f"c{i % 3}"
        d.mkdir(exist_ok=True)
        rgb = np.stack([128 + 90 * np.sin(0.02 * (c + 1) * xx + 0.03 * yy + i) for c in range(3)],
                       axis=-1) + rng.normal(0, 8, (300, 360, 3))
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(d / f"{i:03d}.jpg",
                                                                     quality=92)
    return root


def val_pipeline(*extra):
    return tvt.Compose([tvt.Resize(256), tvt.CenterCrop(224), *extra, tvt.ToTensor(),
                        tvt.Normalize(MEAN, STD)])


def test_val_pipeline_runs_natively_with_torchvisions_pixels(folder):
    dataset = torchvision.datasets.ImageFolder(folder, transform=val_pipeline())
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=2)
    assert loader.stats()["pipeline"].startswith("native:")
    assert loader.dataset is dataset  # torch's attribute is the user's data set
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    images, labels = torch.cat(images), torch.cat(labels)
    expected = torch.stack([dataset[i][0] for i in range(len(dataset))])
    assert labels.tolist() == [dataset.targets[i] for i in range(len(dataset))]
    assert images.shape == expected.shape and images.dtype == expected.dtype
    # Mean absolute difference per image, in pixel levels of 255 (undo Normalize's std).
    std = torch.tensor(STD).view(1, 3, 1, 1)
    mad = ((images - expected).abs() * std * 255).mean(dim=(1, 2, 3))
    assert float(mad.max()) < 1.0, mad


def test_train_pipeline_runs_natively(folder):
    pipeline = tvt.Compose([tvt.RandomResizedCrop(160), tvt.RandomHorizontalFlip(),
                            tvt.ToTensor(), tvt.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(folder, transform=pipeline)
    loader = stoker.DataLoader(dataset, batch_size=5, shuffle=True, num_workers=2, seed=3)
    assert loader.stats()["pipeline"].startswith("native:")
    shapes = [tuple(x.shape) for x, _ in loader]
    assert shapes == [(5, 3, 160, 160), (5, 3, 160, 160), (2, 3, 160, 160)]


@pytest.mark.parametrize("extra, reason", [
    ((tvt.ColorJitter(0.4, 0.4, 0.4),), "ColorJitter is not implemented natively"),
    ((tvt.Lambda(lambda im: im),), "Lambda is not implemented natively"),
])
def test_unsupported_transform_runs_in_python_between_native_ends(folder, extra, reason):
    dataset = torchvision.datasets.ImageFolder(folder, transform=val_pipeline(*extra))
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=2)
    pipeline = loader.stats()["pipeline"]
    assert pipeline.startswith("python: hybrid: native decode + Resize + CenterCrop, then ")
    assert pipeline.endswith(f"in Python, then native ToTensor + Normalize ({reason})")
    assert sum(len(y) for _, y in loader) == len(dataset)


def _times_ten(y):  # a spawned worker unpickles it by name (a lambda would not do)
    return 10 * y


@pytest.mark.parametrize("worker_type, context", [
    ("thread", None), ("process", "fork"), ("process", "spawn")])
def test_hybrid_pipeline_gives_torchvisions_pixels(folder, worker_type, context):
    """A deterministic crop natively, Grayscale in Python, ToTensor + Normalize natively: the
    same images and labels as torchvision's own pipeline, in every kind of worker (a spawned
    worker opens the folder again)."""
    dataset = torchvision.datasets.ImageFolder(
        folder, transform=val_pipeline(tvt.Grayscale(3)), target_transform=_times_ten)
    loader = stoker.DataLoader(dataset, batch_size=5, num_workers=2 if context != "spawn" else 1,
                               worker_type=worker_type, multiprocessing_context=context)
    assert "then Grayscale in Python, then native ToTensor + Normalize" in \
        loader.stats()["pipeline"]
    images = torch.cat([x for x, _ in loader])
    labels = torch.cat([y for _, y in loader])
    expected = torch.stack([dataset[i][0] for i in range(len(dataset))])
    assert labels.tolist() == [10 * t for t in dataset.targets]
    std = torch.tensor(STD).view(1, 3, 1, 1)
    mad = ((images - expected).abs() * std * 255).mean(dim=(1, 2, 3))
    assert float(mad.max()) < 1.0, mad
    loader.close()


def test_hybrid_ends_are_the_pipelines_own(folder):
    """Only the steps stoker implements, where they are: a converted head hands Python a tensor
    (no native tail); a pipeline with no native crop decodes in Python."""
    after_normalize = tvt.Compose([tvt.RandomResizedCrop(64), tvt.ToTensor(),
                                   tvt.Normalize(MEAN, STD), tvt.RandomErasing(p=1.0)])
    dataset = torchvision.datasets.ImageFolder(folder, transform=after_normalize)
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=1)
    assert loader.stats()["pipeline"].startswith(
        "python: hybrid: native decode + RandomResizedCrop + ToTensor + Normalize, then "
        "RandomErasing in Python (")
    x, _ = next(iter(loader))
    assert x.shape == (4, 3, 64, 64) and bool((x == 0).any())  # erased patches
    no_crop = tvt.Compose([tvt.Lambda(lambda im: im.resize((50, 40))), tvt.ToTensor()])
    dataset = torchvision.datasets.ImageFolder(folder, transform=no_crop)
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=1)
    assert loader.stats()["pipeline"].startswith(
        "python: hybrid: Lambda in Python, then native ToTensor (")
    x, _ = next(iter(loader))
    torch.testing.assert_close(x, torch.stack([dataset[i][0] for i in range(4)]),
                               atol=1e-6, rtol=0)


def test_native_false_and_target_transform_opt_out(folder):
    dataset = torchvision.datasets.ImageFolder(folder, transform=val_pipeline())
    assert stoker.DataLoader(dataset, batch_size=4, native=False).stats()["pipeline"].startswith(
        "python: ImageFolder.__getitem__")
    jittered = torchvision.datasets.ImageFolder(folder, transform=val_pipeline(tvt.ColorJitter(0.4)))
    assert stoker.DataLoader(jittered, batch_size=4, native=False).stats()["pipeline"].startswith(
        "python: ImageFolder.__getitem__")
    relabelled = torchvision.datasets.ImageFolder(folder, transform=val_pipeline(),
                                                  target_transform=lambda y: y + 1)
    pipeline = stoker.DataLoader(relabelled, batch_size=4).stats()["pipeline"]
    assert pipeline.startswith("python: hybrid: native decode + Resize + CenterCrop + ToTensor + "
                               "Normalize, then target_transform in Python (")
    labels = torch.cat([y for _, y in stoker.DataLoader(relabelled, batch_size=4)])
    assert labels.tolist() == [t + 1 for t in relabelled.targets]


def test_a_sample_list_edited_after_loading_runs_in_python(folder):
    """The native folder must read the data set's own files in its order: a list reordered
    (or filtered) after the data set was made is read by the user's code."""
    dataset = torchvision.datasets.ImageFolder(folder, transform=val_pipeline())
    dataset.samples[0], dataset.samples[1] = dataset.samples[1], dataset.samples[0]
    dataset.imgs = dataset.samples
    loader = stoker.DataLoader(dataset, batch_size=4, num_workers=1)
    assert loader.stats()["pipeline"] == (
        "python: ImageFolder.__getitem__ in workers (the data set's sample list differs from its "
        "folder (changed after loading))")
    x, _ = next(iter(loader))
    torch.testing.assert_close(x[0], dataset[0][0])
