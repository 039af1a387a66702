"""torchvision's image data sets, run natively when stoker implements their whole pipeline.

``stoker.DataLoader(torchvision.datasets.ImageFolder(root, transform=Compose([...])))`` reads
the folder in C++ (stoker.ImageFolder) when every step of the transform is one stoker runs
(see stoker.transforms) with the same arguments; no Python runs per sample. Anything else (a
transform stoker does not implement, a custom loader, a target_transform, file types other than
JPEG and PNG, a changed sample list) runs the user's own code in workers. Random draws of the
native path are stoker's own (a pure function of seed, epoch and sample index), not torch's.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import numpy as np

from .. import _stoker
from .. import transforms as T
from .native import ImageFolder

_NATIVE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def _bilinear_antialiased(step) -> Optional[str]:
    """Why `step` does not resample as stoker does (bilinear, antialiased), or None."""
    interpolation = getattr(step, "interpolation", None)
    if interpolation is not None and getattr(interpolation, "value", interpolation) != "bilinear":
        return f"{type(step).__name__} with {interpolation} interpolation"
    if getattr(step, "antialias", True) is False:
        return f"{type(step).__name__} with antialias=False"
    return None


def _square(size) -> Optional[int]:
    if isinstance(size, int):
        return size
    if isinstance(size, (tuple, list)) and len(size) == 2 and size[0] == size[1]:
        return int(size[0])
    if isinstance(size, (tuple, list)) and len(size) == 1:
        return int(size[0])
    return None


def _translate(step, tv) -> "tuple[object | None, str]":
    """stoker's equivalent of one torchvision transform, or (None, why not)."""
    name = type(step).__name__
    if type(step) is tv.RandomResizedCrop:
        size = _square(step.size)
        why = _bilinear_antialiased(step)
        if size is None or why:
            return None, why or f"RandomResizedCrop to a non-square size {step.size}"
        return T.RandomResizedCrop(size, tuple(step.scale), tuple(step.ratio)), ""
    if type(step) is tv.RandomHorizontalFlip:
        if step.p != 0.5:
            return None, f"RandomHorizontalFlip(p={step.p})"
        return T.RandomHorizontalFlip(), ""
    if type(step) is tv.Resize:
        why = _bilinear_antialiased(step)
        size = step.size
        if isinstance(size, (tuple, list)) and len(size) == 1:
            size = size[0]
        if not isinstance(size, int) or step.max_size is not None or why:
            return None, why or f"Resize({step.size}) (stoker resizes the shorter side to an int)"
        return T.Resize(size), ""
    if type(step) is tv.CenterCrop:
        size = _square(step.size)
        if size is None:
            return None, f"CenterCrop to a non-square size {step.size}"
        return T.CenterCrop(size), ""
    if type(step) is tv.ToTensor:
        return T.ToTensor(), ""
    if type(step) is tv.PILToTensor:
        return T.PILToTensor(), ""
    if type(step) is tv.Normalize:
        return T.Normalize(tuple(float(m) for m in step.mean), tuple(float(s) for s in step.std)), ""
    return None, f"{name} is not implemented natively"


def _folder_check(dataset) -> "tuple[object | None, str]":
    """torchvision's transforms module if `dataset` is an ImageFolder whose files stoker can
    decode (default loader, JPEG and PNG), or (None, why not). Only when torchvision has been
    imported by the program."""
    datasets = sys.modules.get("torchvision.datasets")
    tv = sys.modules.get("torchvision.transforms")
    if datasets is None or tv is None:
        return None, "not a torchvision data set"
    folder = sys.modules.get("torchvision.datasets.folder")
    if type(dataset) not in (datasets.ImageFolder, datasets.DatasetFolder):
        return None, f"{type(dataset).__name__} is not torchvision's ImageFolder"
    if folder is None or dataset.loader not in (folder.default_loader, folder.pil_loader):
        return None, "the data set has a custom loader"
    if dataset.transform is None:
        return None, "the data set has no transform (samples are PIL images)"
    samples = getattr(dataset, "samples", None)
    if not samples:
        return None, "the data set has no sample list"
    odd = next((p for p, _ in samples if not p.lower().endswith(_NATIVE_EXTENSIONS)), None)
    if odd is not None:
        return None, f"{odd}: stoker decodes JPEG and PNG natively, not this file type"
    return tv, ""


def _native_folder(dataset, pipeline) -> "tuple[ImageFolder | None, str]":
    """stoker.ImageFolder over `dataset`'s root with `pipeline`, if it reads the same samples."""
    try:
        pipeline.settings()
        native = ImageFolder(dataset.root, transform=pipeline)
    except ValueError as e:
        return None, str(e).removeprefix("stoker: ")
    except (OSError, RuntimeError) as e:
        return None, f"stoker cannot read the folder natively: {e}"
    if len(native) != len(dataset.samples) or native.classes != list(dataset.classes) or \
            not _same_samples(native, dataset.samples):
        return None, "the data set's sample list differs from its folder (changed after loading)"
    return native, ""


def _same_samples(native: ImageFolder, samples: list, checks: int = 1024) -> bool:
    """Whether `native` reads the files of `samples` in their order, checked at up to `checks`
    evenly spaced indices (a sample list filtered or edited after loading shifts them)."""
    step = max(1, len(samples) // checks)
    for i in range(0, len(samples), step):
        name = native._handle.sample_name(i)
        if os.path.normpath(name) != os.path.normpath(samples[i][0]):
            return False
    return True


def _steps(dataset, tv) -> list:
    return (list(dataset.transform.transforms) if type(dataset.transform) is tv.Compose
            else [dataset.transform])


def native_equivalent(dataset) -> "tuple[ImageFolder | None, str]":
    """A stoker.ImageFolder that yields what `dataset` yields, and why; or (None, why not)."""
    tv, why = _folder_check(dataset)
    if tv is None:
        return None, why
    if dataset.target_transform is not None:
        return None, "the data set has a target_transform"
    translated = []
    for step in _steps(dataset, tv):
        native, why = _translate(step, tv)
        if native is None:
            return None, why
        translated.append(native)
    native, why = _native_folder(dataset, T.Compose(translated))
    if native is None:
        return None, why
    return native, "torchvision ImageFolder with a pipeline stoker runs in C++"


def hybrid_equivalent(dataset) -> "tuple[HybridFolder | None, str]":
    """For an ImageFolder whose pipeline has steps stoker does not implement: a data set that
    decodes and crops natively (the pipeline's leading crop and flip), runs the steps stoker
    does not implement in Python on the cropped image, and ends with a native ToTensor (+
    Normalize) when the pipeline does; or (None, why not). It runs in workers as any Python
    data set does."""
    tv, why = _folder_check(dataset)
    if tv is None:
        return None, why
    steps = _steps(dataset, tv)
    translated = [_translate(step, tv)[0] for step in steps]
    # The native head: the longest prefix stoker runs (a crop form, then optionally ToTensor
    # [+ Normalize] or PILToTensor).
    head = 0
    for k in range(len(steps), 0, -1):
        if all(t is not None for t in translated[:k]):
            try:
                T.Compose(translated[:k]).settings()
            except ValueError:
                continue
            head = k
            break
    if head == len(steps) and dataset.target_transform is None:
        return None, "the whole pipeline runs natively"
    head_converts = head > 0 and isinstance(translated[head - 1],
                                            (T.ToTensor, T.Normalize, T.PILToTensor))
    # The native tail, on the PIL image the Python steps leave: ToTensor [+ Normalize].
    tail, mean, std = len(steps), (), ()
    if not head_converts:
        if len(steps) - head >= 3 and type(steps[-2]) is tv.ToTensor and \
                type(steps[-1]) is tv.Normalize:
            tail = len(steps) - 2
            mean = tuple(float(m) for m in steps[-1].mean)
            std = tuple(float(v) for v in steps[-1].std)
        elif len(steps) - head >= 2 and type(steps[-1]) is tv.ToTensor:
            tail = len(steps) - 1
    if head == 0 and tail == len(steps):
        return None, _translate(steps[0], tv)[1] or "no step at either end runs natively"
    native = None
    if head > 0:
        head_steps = list(translated[:head])
        if not head_converts:
            head_steps.append(T.PILToTensor(layout="hwc"))  # pixels for a PIL image
        native, why = _native_folder(dataset, T.Compose(head_steps))
        if native is None:
            return None, why
    python = [type(s).__name__ for s in steps[head:tail]]
    parts = []
    if head > 0:
        parts.append("native decode + " + " + ".join(type(s).__name__ for s in steps[:head]))
    parts.append(" + ".join(python or ["target_transform"]) + " in Python")
    if tail < len(steps):
        parts.append("native " + " + ".join(type(s).__name__ for s in steps[tail:]))
    return (HybridFolder(dataset, native, tv.Compose(steps[head:tail]), head_converts,
                         (mean, std) if tail < len(steps) else None),
            "hybrid: " + ", then ".join(parts))


class HybridFolder:
    """What hybrid_equivalent makes: torchvision's ImageFolder with the ends of its pipeline
    native. Samples are (image, target) as the data set's. The native head draws its random
    crop and flip from the sample's seed (stoker's draws, as on the native path); the Python
    steps draw from torch's generator (seeded per worker, as torch's workers are)."""

    wraps_user_dataset = True  # get_worker_info().dataset is the user's ImageFolder

    def __init__(self, dataset, native: "ImageFolder | None", middle, head_converts: bool,
                 tail: "tuple[tuple, tuple] | None") -> None:
        self.dataset = dataset
        self._root = native.root if native is not None else None
        self._spec = native.transform if native is not None else None
        self._native = native
        self._middle = middle
        self._head_converts = head_converts
        self._tail = tail

    def __len__(self) -> int:
        return len(self.dataset.samples)

    def __getstate__(self):  # a spawned worker opens the folder again
        return {**self.__dict__, "_native": None}

    def __getitem__(self, index: int):
        path, target = self.dataset.samples[index]
        if self._root is not None:
            if self._native is None:
                self._native = ImageFolder(self._root, transform=self._spec)
            image = self._native._handle.read(index, _stoker.sample_seed() or 0)[0]
            if self._head_converts:
                image = sys.modules["torch"].from_numpy(image)
            else:
                from PIL import Image

                image = Image.fromarray(image)
        else:
            image = self.dataset.loader(path)
        image = self._middle(image)
        if self._tail is not None:
            if getattr(image, "mode", None) == "RGB":
                image = sys.modules["torch"].from_numpy(
                    _stoker.to_tensor(np.asarray(image), *self._tail))
            else:  # not 8-bit RGB: torchvision's own steps
                tv = sys.modules["torchvision.transforms"]
                mean, std = self._tail
                image = tv.ToTensor()(image)
                if mean:
                    image = tv.Normalize(mean, std)(image)
        if self.dataset.target_transform is not None:
            target = self.dataset.target_transform(target)
        return image, target
