"""torchvision's image data sets, run natively when stoker implements their whole pipeline.

``stoker.DataLoader(torchvision.datasets.ImageFolder(root, transform=Compose([...])))`` reads
the folder in C++ (stoker.ImageFolder) when every step of the transform is one stoker runs
(see stoker.transforms) with the same arguments; no Python runs per sample. Anything else (a
transform stoker does not implement, a custom loader, a target_transform, file types other than
JPEG and PNG, a changed sample list) runs the user's own code in workers. Random draws of the
native path are stoker's own (a pure function of seed, epoch and sample index), not torch's.
"""

from __future__ import annotations

import sys
from typing import Optional

from . import transforms as T
from ._datasets import ImageFolder

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


def native_equivalent(dataset) -> "tuple[ImageFolder | None, str]":
    """A stoker.ImageFolder that yields what `dataset` yields, and why; or (None, why not).

    Only torchvision.datasets.ImageFolder (or DatasetFolder with torchvision's default image
    loader) is recognised, and only when torchvision has been imported by the program."""
    datasets = sys.modules.get("torchvision.datasets")
    tv = sys.modules.get("torchvision.transforms")
    if datasets is None or tv is None:
        return None, "not a torchvision data set"
    folder = sys.modules.get("torchvision.datasets.folder")
    if type(dataset) not in (datasets.ImageFolder, datasets.DatasetFolder):
        return None, f"{type(dataset).__name__} is not torchvision's ImageFolder"
    if folder is None or dataset.loader not in (folder.default_loader, folder.pil_loader):
        return None, "the data set has a custom loader"
    if dataset.target_transform is not None:
        return None, "the data set has a target_transform"
    if dataset.transform is None:
        return None, "the data set has no transform (samples are PIL images)"
    steps = (list(dataset.transform.transforms) if type(dataset.transform) is tv.Compose
             else [dataset.transform])
    translated = []
    for step in steps:
        native, why = _translate(step, tv)
        if native is None:
            return None, why
        translated.append(native)
    try:
        pipeline = T.Compose(translated)
        pipeline.settings()
    except ValueError as e:
        return None, str(e).removeprefix("stoker: ")
    samples = getattr(dataset, "samples", None)
    if not samples:
        return None, "the data set has no sample list"
    odd = next((p for p, _ in samples if not p.lower().endswith(_NATIVE_EXTENSIONS)), None)
    if odd is not None:
        return None, f"{odd}: stoker decodes JPEG and PNG natively, not this file type"
    try:
        native = ImageFolder(dataset.root, transform=pipeline)
    except (OSError, RuntimeError, ValueError) as e:
        return None, f"stoker cannot read the folder natively: {e}"
    if len(native) != len(samples) or native.classes != list(dataset.classes):
        return None, "the data set's sample list differs from its folder (changed after loading)"
    return native, "torchvision ImageFolder with a pipeline stoker runs in C++"
