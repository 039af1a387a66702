"""Lightning's resume across processes, for test_framework_runs.py: Trainer.fit over 3 epochs
of a shuffled stoker.DataLoader (2 worker processes, seed_per_sample=True, a __getitem__ that
draws from torch's, random's and numpy's generators), recording each training step's batch.

    lightning_resume_job.py whole OUT [SEED]  # the uninterrupted run; saves OUT/mid.ckpt
        # after step 5 (epoch 0, mid-epoch), OUT/last.ckpt after step 6 (epoch 0's last
        # batch) and OUT/end.ckpt as epoch 0 ends (on_train_epoch_end)
    lightning_resume_job.py resume OUT CKPT [SEED]  # a new process resumes from CKPT

SEED: the loader's seed= (stoker's own order), else torch's order (shuffle=True).

Each writes OUT/<mode>-<ckpt name>.json: the batches (sample indices and draws) in the order
the training steps saw them."""

import json
import os
import random
import sys

import lightning as L
import numpy as np
import torch

import stoker

EPOCHS, MID_STEP, LAST_STEP = 3, 5, 6


class Augmented(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        noise = torch.rand(2) + random.random() + float(np.random.rand())
        return torch.tensor([float(i)]), noise


class Job(L.LightningModule):
    def __init__(self, seed=None):
        super().__init__()
        self.seed = seed
        self.layer = torch.nn.Linear(1, 1)
        self.batches: list = []

    def training_step(self, batch, index):
        x, noise = batch
        self.batches.append([x.flatten().tolist(), noise.flatten().tolist()])
        return ((self.layer(x / 24) - noise[:, :1]) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return stoker.DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=2,
                                 seed_per_sample=True, seed=self.seed)


class SaveAt(L.Callback):
    """Saves OUT/mid.ckpt and OUT/last.ckpt after steps MID_STEP and LAST_STEP, and
    OUT/end.ckpt as epoch 0 ends."""

    def __init__(self, out: str):
        self.out = out

    def on_train_batch_end(self, trainer, *args):
        for step, name in ((MID_STEP, "mid.ckpt"), (LAST_STEP, "last.ckpt")):
            if trainer.global_step == step:
                trainer.save_checkpoint(os.path.join(self.out, name))

    def on_train_epoch_end(self, trainer, module):
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(os.path.join(self.out, "end.ckpt"))


def main(mode: str, out: str, ckpt=None, seed=None) -> None:
    L.seed_everything(3 if mode == "whole" else 99)  # the resumed process's own global seed
    job = Job(None if seed in (None, "") else int(seed))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[SaveAt(out)] if mode == "whole" else [])
    trainer.fit(job, ckpt_path=ckpt or None)
    name = f"{mode}-{os.path.basename(ckpt)}" if ckpt else mode
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(job.batches, f)


if __name__ == "__main__":
    mode, out, *rest = sys.argv[1:]
    if mode == "whole":
        main(mode, out, None, *rest)
    else:
        main(mode, out, *rest)
