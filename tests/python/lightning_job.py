"""A LightningModule and DataModule for test_framework_runs.py (importable by the processes
that ddp_spawn starts): records, per stage and rank, the batches each epoch saw, the trained
weights and which loader class iterated; and each call of Lightning's worker_init_fn."""

import json
import os
import threading

import lightning as L
import lightning.fabric.utilities.data as lightning_data
import torch

from framework_datasets import Indices, exit_before_finalizing


def counted_worker_init(worker_id, *args, **kwargs):
    """Lightning's pl_worker_init_function (what seed_everything(workers=True) sets as the
    loaders' worker_init_fn), leaving a file in $LIGHTNING_JOB_INITS at each call, from any
    worker thread or process."""
    name = f"init-{os.getpid()}-{threading.get_ident()}-{worker_id}"
    with open(os.path.join(os.environ["LIGHTNING_JOB_INITS"], name), "w"):
        pass
    return _pl_worker_init_function(worker_id, *args, **kwargs)


_pl_worker_init_function = lightning_data.pl_worker_init_function
lightning_data.pl_worker_init_function = counted_worker_init


class LightningJob(L.LightningModule):
    def __init__(self, out: str):
        super().__init__()
        self.out = out
        self.layer = torch.nn.Linear(1, 1)
        self.samples: list = []  # per epoch, the batches (sample indices)
        self.loader_module = None

    def _see(self, batch, loader):
        if not self.samples:  # resumed mid-epoch: the epoch did not start here
            self.samples.append([])
        self.samples[-1].append(batch.flatten().long().tolist())
        self.loader_module = type(loader).__module__  # the real class: stoker's or torch's

    def on_train_epoch_start(self):
        self.samples.append([])

    def training_step(self, batch, index):
        self._see(batch, self.trainer.train_dataloader)
        x = batch / 32
        return ((self.layer(x) - 3 * x) ** 2).mean()

    def on_validation_epoch_start(self):
        self.samples_before, self.samples = self.samples, [[]]

    def validation_step(self, batch, index):
        self._see(batch, self.trainer.val_dataloaders)

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking and self.trainer.state.fn == "validate":
            self._write("validate")
        self.samples = self.samples_before

    def on_predict_epoch_start(self):
        self.samples = [[]]

    def predict_step(self, batch, index):
        self._see(batch, self.trainer.predict_dataloaders)
        return self.layer(batch)

    def on_predict_epoch_end(self):
        self._write("predict")

    def on_train_end(self):
        self._write("fit")

    def _write(self, stage):
        os.makedirs(self.out, exist_ok=True)
        weights = [p.detach().flatten().tolist() for p in self.layer.parameters()]
        with open(os.path.join(self.out, f"{stage}-{self.global_rank}.json"), "w") as f:
            json.dump({"samples": self.samples, "weights": sum(weights, []),
                       "loader": self.loader_module}, f)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(L.LightningDataModule):
        def __init__(self, loader_type):
            super().__init__()
            self.loader_type = loader_type

        def train_dataloader(self):
            return self.loader_type(Indices(32), batch_size=4, shuffle=True)

        def val_dataloader(self):
            return self.loader_type(Indices(16), batch_size=4)

        def predict_dataloader(self):
            return self.loader_type(Indices(16), batch_size=4)


def run(strategy: str, loader_name: str, out: str, stages=("fit", "validate", "predict")):
    """Trainer.fit/validate/predict on 2 CPU processes (gloo), seed_everything(workers=True),
    the DataModule with `loader_name`'s DataLoader; each rank writes its records to `out`."""
    import torch.utils.data as tud

    import stoker

    loader_type = {"torch": tud.DataLoader, "stoker": stoker.DataLoader}[loader_name]
    os.environ["LIGHTNING_JOB_INITS"] = os.path.join(out, "worker-inits")
    os.makedirs(os.environ["LIGHTNING_JOB_INITS"], exist_ok=True)
    L.seed_everything(7, workers=True)
    model = LightningJob(out)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    data = LightningJob.Data(loader_type)
    trainer.fit(model, datamodule=data)
    if "validate" in stages:
        trainer.validate(model, datamodule=data, verbose=False)
    if "predict" in stages:
        trainer.predict(model, datamodule=data)


if __name__ == "__main__":
    # lightning_job.py STRATEGY OUT LOADER...: under "ddp" Lightning starts rank 1 by running
    # this command again; each loader's records go to OUT/<loader>.
    import sys

    strategy, out = sys.argv[1], sys.argv[2]
    for name in sys.argv[3:]:
        run(strategy, name, os.path.join(out, name),
            ("fit", "validate", "predict") if strategy == "ddp" else ("fit",))
    exit_before_finalizing()
