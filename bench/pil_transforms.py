"""torchvision's ImageNet training transforms written with PIL and torch ops, for the
baselines of benchmarks whose environment has no torchvision (it comes only as a large CUDA
build): RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, with
torchvision's random draws."""

from __future__ import annotations

import math
import random

import numpy as np
import torch

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class TrainTransform:
    """Called with a PIL image; returns float32 [3, size, size]."""

    def __init__(self, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def params(self, width: int, height: int) -> tuple[int, int, int, int]:
        """torchvision.transforms.RandomResizedCrop.get_params: (top, left, h, w)."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*log_ratio))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return random.randint(0, height - h), random.randint(0, width - w), h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img):
        from PIL import Image

        img = img.convert("RGB")
        top, left, h, w = self.params(*img.size)
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous().float().div_(255)
        return x.sub_(self.mean).div_(self.std)  # ToTensor copies the pixels, then Normalize
