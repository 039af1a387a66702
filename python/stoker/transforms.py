"""torchvision's ImageNet transforms, run in C++ by stoker's image data sets.

Write the pipeline as you would with torchvision; stoker fuses it into one pass (decode only
the part of the JPEG the crop needs, DCT-domain downscaling, resize, flip, normalize, layout):

    train = transforms.Compose([transforms.RandomResizedCrop(224),
                                transforms.RandomHorizontalFlip(),
                                transforms.ToTensor(),
                                transforms.Normalize(mean, std)])
    val = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224),
                              transforms.ToTensor(), transforms.Normalize(mean, std)])

Supported: [RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip()?] or
[Resize(n), CenterCrop(size)], followed by ToTensor() + Normalize(mean, std)?
(float32 CHW) or PILToTensor(layout='chw'|'hwc') (uint8, for normalizing on the GPU).
Random choices are a pure function of (loader seed, epoch, sample index).

Fidelity: by default a large JPEG is decoded at 1/2, 1/4 or 1/8 scale in the DCT domain while
the scaled image stays at least three times the crop's resized size (within 1/255 mean
absolute difference of torchvision's output on real photos, docs/image.md). `exact=True`
(Compose(..., exact=True), train(exact=True), val(exact=True)) never scales: torchvision's
pixels, bit for bit in almost every case, at a lower speed on large photos.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Sequence

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _size(size, what: str) -> int:
    if isinstance(size, (tuple, list)):
        if len(size) == 1:
            size = size[0]
        elif len(size) == 2 and size[0] == size[1]:
            size = size[0]
        else:
            raise ValueError(f"stoker: {what} makes square images; got size {tuple(size)}")
    size = int(size)
    if size < 1:
        raise ValueError(f"stoker: {what} size must be positive, not {size}")
    return size


@dataclass(frozen=True)
class RandomResizedCrop:
    size: int
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3.0 / 4.0, 4.0 / 3.0)

    def __post_init__(self):
        object.__setattr__(self, "size", _size(self.size, "RandomResizedCrop"))


@dataclass(frozen=True)
class RandomHorizontalFlip:
    p: float = 0.5

    def __post_init__(self):
        if self.p != 0.5:
            raise ValueError("stoker: RandomHorizontalFlip supports p=0.5")


@dataclass(frozen=True)
class Resize:
    size: int

    def __post_init__(self):
        if isinstance(self.size, (tuple, list)) and len(self.size) != 1:
            raise ValueError("stoker: Resize takes the shorter side's length (an int)")
        object.__setattr__(self, "size", _size(self.size, "Resize"))


@dataclass(frozen=True)
class CenterCrop:
    size: int

    def __post_init__(self):
        object.__setattr__(self, "size", _size(self.size, "CenterCrop"))


@dataclass(frozen=True)
class ToTensor:
    """float32 CHW in [0, 1] (then Normalize, if given)."""


@dataclass(frozen=True)
class PILToTensor:
    """uint8 pixels, CHW (torchvision's PILToTensor) or HWC."""

    layout: str = "chw"


@dataclass(frozen=True)
class Normalize:
    mean: Sequence[float]
    std: Sequence[float]


@dataclass(frozen=True)
class Compose:
    transforms: list = field(default_factory=list)
    exact: bool = False  # no DCT-domain scaling: torchvision's pixels (see the module's doc)

    def settings(self) -> dict:
        """ImageTransform's settings (include/stoker/image.h) for this pipeline."""
        steps = list(self.transforms)
        names = [type(t).__name__ for t in steps]
        s = {"flip": False, "scale": (0.08, 1.0), "ratio": (3.0 / 4.0, 4.0 / 3.0), "resize": 0,
             "dtype": "uint8", "layout": "chw", "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0),
             "exact": bool(self.exact)}
        if steps and isinstance(steps[0], RandomResizedCrop):
            s.update(crop="random_resized", size=steps[0].size, scale=tuple(steps[0].scale),
                     ratio=tuple(steps[0].ratio))
            s["resize"] = s["size"]
            steps = steps[1:]
            if steps and isinstance(steps[0], RandomHorizontalFlip):
                s["flip"] = True
                steps = steps[1:]
        elif len(steps) >= 2 and isinstance(steps[0], Resize) and isinstance(steps[1], CenterCrop):
            s.update(crop="resize_center", resize=steps[0].size, size=steps[1].size)
            steps = steps[2:]
        else:
            raise ValueError(f"stoker: unsupported pipeline {names}: it must start with "
                             "RandomResizedCrop(+RandomHorizontalFlip) or Resize+CenterCrop")
        if steps and isinstance(steps[0], ToTensor):
            s["dtype"] = "float32"
            steps = steps[1:]
            if steps and isinstance(steps[0], Normalize):
                s["mean"] = tuple(float(m) for m in steps[0].mean)
                s["std"] = tuple(float(v) for v in steps[0].std)
                steps = steps[1:]
        elif steps and isinstance(steps[0], PILToTensor):
            s["layout"] = steps[0].layout
            steps = steps[1:]
        if steps:
            raise ValueError(f"stoker: unsupported pipeline {names}: after the crop comes "
                             "ToTensor() [+ Normalize] or PILToTensor(), and nothing else")
        return s

    def spec(self) -> str:
        """The settings as ImageTransform::parse reads them (the form the C++ side takes)."""
        def num(v):  # numpy scalars too; repr(float) reads back to the same double
            if isinstance(v, numbers.Integral):
                return str(int(v))
            if isinstance(v, numbers.Real):
                return repr(float(v))
            return str(v)

        out = []
        for key, value in self.settings().items():
            if key == "resize" and value == 0:
                continue
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, (tuple, list)):
                value = ",".join(num(v) for v in value)
            out.append(f"{key}={num(value)}")
        return " ".join(out)


def train(size: int = 224, exact: bool = False) -> Compose:
    """torchvision's ImageNet train pipeline."""
    return Compose([RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(),
                    Normalize(IMAGENET_MEAN, IMAGENET_STD)], exact=exact)


def val(resize: int = 256, size: int = 224, exact: bool = False) -> Compose:
    """torchvision's ImageNet val pipeline."""
    return Compose([Resize(resize), CenterCrop(size), ToTensor(),
                    Normalize(IMAGENET_MEAN, IMAGENET_STD)], exact=exact)
