"""The seeds' own scripts: they run on stoker with nothing changed but the import."""

import pathlib
import subprocess
import sys

import numpy as np
import torch
import torch.utils.data as tud
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

import stoker

ROOT = pathlib.Path(__file__).resolve().parents[2]


class ImageLike(tud.Dataset):
    """(image tensor, class index) like torchvision's ImageFolder with ToTensor."""

    def __len__(self):
        return 200

    def __getitem__(self, i):
        return torch.full((3, 8, 8), i / 200), i % 7


def test_seed000_loader_construction_as_written():
    # pytorch/examples imagenet main.py, as seed 000 quotes it, with and without a
    # distributed sampler, and its timing loop (15 batches of 4 epochs).
    train_dataset = ImageLike()
    for train_sampler in (None, TorchDistributedSampler(train_dataset, num_replicas=2, rank=1)):
        for pin_memory in (False, True):
            kwargs = {"num_workers": 4, "pin_memory": pin_memory}
            train_loader = stoker.DataLoader(
                train_dataset, batch_size=16, shuffle=(train_sampler is None),
                sampler=train_sampler, **kwargs)
            for epoch in range(4):
                for batch_idx, (data, target) in enumerate(train_loader):
                    if batch_idx == 15:
                        break
                    assert data.shape[1:] == (3, 8, 8) and len(target) == len(data) <= 16
                    assert target.dtype == torch.int64
    val_loader = stoker.DataLoader(ImageLike(), batch_size=32, shuffle=False, num_workers=4,
                                   pin_memory=True)
    targets = np.concatenate([t.numpy() for _, t in val_loader])
    assert targets.tolist() == [i % 7 for i in range(200)]


def test_seed003_script_runs_with_only_the_import_changed():
    script = ROOT / "examples" / "seed003_prefetch.py"
    text = script.read_text()
    assert "from stoker import DataLoader" in text
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Optimization Speedup:" in result.stdout
