"""stoker's image pipelines against torchvision's (Pillow) on real photographs, in both modes:
the default (DCT-domain scaling of large JPEGs) and exact=True (no scaling).

The photos are Debian's desktop backgrounds (lomiri-wallpapers-16.04 and mate-backgrounds:
photographs of 1.3 to 16 megapixels), fetched with `apt-get download` into a cache under the
build tree (STOKER_PHOTO_CACHE, default <dir of STOKER_BIN>/photo-cache) and reused; without
network or apt the tests are skipped, saying why.

Run as a script to print the per-image table, and with --speed the single-thread decode
rate of both modes (docs/image.md):
    STOKER_BIN=build/stoker .venv-test/bin/python tests/image/test_real_photos.py [--speed]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from test_pillow import val_reference

ROOT = Path(__file__).resolve().parents[2]
STOKER = os.environ.get("STOKER_BIN", str(ROOT / "build" / "stoker"))
CACHE = Path(os.environ.get("STOKER_PHOTO_CACHE", Path(STOKER).resolve().parent / "photo-cache"))
PACKAGES = {  # package: directory of photographs inside it
    "lomiri-wallpapers-16.04": "usr/share/backgrounds",
    "mate-backgrounds": "usr/share/backgrounds/mate/nature",
}
LIMIT = 1.0  # mean absolute difference per value over the photos, in 8-bit levels
EXACT_LIMIT = 0.05  # exact=True: Pillow's output up to libjpeg-turbo's edge upsampling
TRAIN_SEEDS = range(3)  # RandomResizedCrop draws per photo (stoker reports the box and flip)


def fetch_photos():
    """The photographs' paths, or a reason why they cannot be had."""
    photos = []
    for package, inside in PACKAGES.items():
        done = CACHE / package / ".extracted"
        if not done.exists():
            if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
                return None, "apt-get and dpkg-deb are needed to fetch the photographs"
            work = CACHE / package
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            r = subprocess.run(["apt-get", "download", package], cwd=work, capture_output=True,
                               text=True, timeout=600)
            debs = list(work.glob("*.deb"))
            if r.returncode != 0 or not debs:
                return None, (f"cannot fetch {package} with apt-get download (no network?): "
                              f"{r.stderr.strip()[-300:]}")
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(work / "root")], check=True)
            debs[0].unlink()
            done.touch()
        photos += sorted((CACHE / package / "root" / inside).glob("*.jpg"))
    if not photos:
        return None, f"no photographs found in {CACHE}"
    return photos, None


def stoker_decode(path, out, *args):
    r = subprocess.run([STOKER, "decode", str(path), "--out", str(out), *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(out), json.loads(r.stdout)


def crop_reference(img, box, flip, size=224):
    """torchvision: F.resized_crop(img, top, left, h, w, size) (+ hflip) on a PIL image."""
    x, y, w, h = box
    ref = np.asarray(img.crop((x, y, x + w, y + h)).resize((size, size), Image.BILINEAR),
                     dtype=np.float64)
    return ref[:, ::-1] if flip else ref


def mad(a, b):
    return float(np.abs(a.astype(np.float64) - b).mean())


def measure(photos):
    """{(pipeline, mode): [(photo name, megapixels, mean absolute difference), ...]}."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npy"
        for path in photos:
            img = Image.open(path).convert("RGB")
            mp = img.size[0] * img.size[1] / 1e6
            ref = val_reference(img)
            for mode, flags in (("default", []), ("exact", ["--exact"])):
                mine, _ = stoker_decode(path, out, "--pipeline", "val", *flags)
                results.setdefault(("val", mode), []).append((path.name, mp, mad(mine, ref)))
            for seed in TRAIN_SEEDS:
                ref = None
                for mode, flags in (("default", []), ("exact", ["--exact"])):
                    mine, info = stoker_decode(path, out, "--pipeline", "train", "--seed",
                                               str(seed), *flags)
                    if ref is None:
                        ref = crop_reference(img, info["crop"], info["flip"])
                    results.setdefault(("train", mode), []).append(
                        (f"{path.name}#{seed}", mp, mad(mine, ref)))
    return results


def summary(results):
    lines = []
    for (pipeline, mode), rows in sorted(results.items()):
        values = [d for _, _, d in rows]
        worst = max(rows, key=lambda r: r[2])
        lines.append(f"{pipeline:5} {mode:7} n={len(values):3} mean={np.mean(values):.3f} "
                     f"max={worst[2]:.3f} ({worst[0]}, {worst[1]:.1f} MP)")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def results():
    photos, reason = fetch_photos()
    if photos is None:
        pytest.skip(reason)
    r = measure(photos)
    print("\n" + summary(r))
    return r


@pytest.mark.parametrize("pipeline", ["val", "train"])
def test_default_mode_stays_within_one_level_of_torchvision(results, pipeline):
    rows = results[(pipeline, "default")]
    mean = float(np.mean([d for _, _, d in rows]))
    assert mean < LIMIT, summary(results)
    assert max(d for _, _, d in rows) < LIMIT, summary(results)


@pytest.mark.parametrize("pipeline", ["val", "train"])
def test_exact_mode_is_pillows_output(results, pipeline):
    rows = results[(pipeline, "exact")]
    mean = float(np.mean([d for _, _, d in rows]))
    assert mean < EXACT_LIMIT, summary(results)
    assert max(d for _, _, d in rows) < LIMIT, summary(results)


def speed(photos, repeat=5):
    """Images per second on one thread (file in memory), per pipeline and mode, for the
    baseline and the progressive JPEGs apart: the photos' count over the sum of their decode
    times."""
    seconds, counts = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npy"
        for path in photos:
            with Image.open(path) as im:
                kind = "progressive" if im.info.get("progressive") else "baseline"
            counts[kind] = counts.get(kind, 0) + 1
            for pipeline in ("val", "train"):
                for mode, flags in (("default", []), ("exact", ["--exact"])):
                    _, info = stoker_decode(path, out, "--pipeline", pipeline, "--repeat",
                                            str(repeat), *flags)
                    key = (kind, pipeline, mode)
                    seconds[key] = seconds.get(key, 0.0) + 1.0 / info["images_per_second"]
    for (kind, pipeline, mode), s in sorted(seconds.items()):
        print(f"{kind:11} ({counts[kind]:2} photos) {pipeline:5} {mode:7} "
              f"{counts[kind] / s:6.1f} images/s")


if __name__ == "__main__":
    found, why = fetch_photos()
    if found is None:
        sys.exit(why)
    if "--speed" in sys.argv:
        speed(found)
        sys.exit(0)
    res = measure(found)
    for key, rows in sorted(res.items()):
        for name, mp, d in rows:
            print(f"{key[0]:5} {key[1]:7} {mp:5.1f} MP {d:6.3f} {name}")
    print(summary(res))
