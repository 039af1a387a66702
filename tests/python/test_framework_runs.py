"""Real frameworks driving stoker.DataLoader, each run beside the same run with torch's loader:
Lightning (Trainer.fit/validate/predict under ddp_spawn on CPU with gloo, a DataModule,
seed_everything(workers=True), a mid-epoch checkpoint and resume), Hugging Face datasets
(map-style with a padding collate, a streaming IterableDataset) and Accelerate under torchrun.
Every case checks that stoker is what iterated. Skipped where the framework is not installed
(scripts/test.sh installs lightning, accelerate and datasets into the test environments)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils.data as tud

import stoker

HERE = Path(__file__).resolve().parent


def batches(loader):
    return [b.flatten().long().tolist() for b in loader]


def _records(directory: Path) -> dict:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _lightning(strategy: str, out: Path, *loaders: str) -> None:
    """lightning_job.py in a process of its own (Lightning's ddp starts rank 1 as another)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    subprocess.run([sys.executable, str(HERE / "lightning_job.py"), strategy, str(out),
                    *loaders], env=env, check=True, timeout=420, cwd=out)


def test_lightning_ddp_ddp_spawn_and_ddp_fork_as_with_torch_s_loader(tmp_path):
    # fit, validate and predict under ddp with each loader; fit under ddp_spawn (the trainer,
    # stoker's loader in it, pickled into the processes it spawns) and ddp_fork.
    pytest.importorskip("lightning")
    _lightning("ddp", tmp_path, "torch", "stoker")
    for strategy in ("ddp_spawn", "ddp_fork"):
        (tmp_path / strategy).mkdir()
        _lightning(strategy, tmp_path / strategy, "stoker")
    theirs, ours = _records(tmp_path / "torch"), _records(tmp_path / "stoker")
    spawned = _records(tmp_path / "ddp_spawn" / "stoker")
    forked = _records(tmp_path / "ddp_fork" / "stoker")
    assert sorted(ours) == sorted(theirs) == [f"{stage}-{rank}.json" for stage in
                                              ("fit", "predict", "validate") for rank in (0, 1)]
    assert sorted(spawned) == sorted(forked) == ["fit-0.json", "fit-1.json"]
    for name in ours:
        assert ours[name]["loader"] == "stoker.loader.dataloader", name  # stoker iterated
        assert theirs[name]["loader"] == "torch.utils.data.dataloader", name
        assert ours[name]["samples"] == theirs[name]["samples"], name  # the same per rank
        assert ours[name]["weights"] == pytest.approx(theirs[name]["weights"], abs=1e-6)
    for name in spawned:
        for records in (spawned, forked):
            assert records[name]["loader"] == "stoker.loader.dataloader"
            assert records[name]["samples"] == theirs[name]["samples"], name
            assert records[name]["weights"] == pytest.approx(theirs[name]["weights"], abs=1e-6)
    fit0, fit1 = ours["fit-0.json"]["samples"], ours["fit-1.json"]["samples"]
    for epoch in range(2):  # each epoch: the ranks share the data set
        assert sorted(sum(fit0[epoch] + fit1[epoch], [])) == list(range(32))
    assert fit0[0] != fit0[1]  # DistributedSampler's shuffle, epoch by epoch
    # seed_everything(workers=True): Lightning's worker_init_fn ran in stoker's workers.
    # (Each rank's workers: Lightning's worker_init_fn gets rank= from the rank that set it.)
    for run in (tmp_path / "stoker", tmp_path / "ddp_spawn" / "stoker",
                tmp_path / "ddp_fork" / "stoker"):
        pids = {p.name.split("-")[1] for p in (run / "worker-inits").iterdir()}
        assert len(pids) >= 2, run  # called in the workers of both ranks


def test_lightning_mid_epoch_checkpoint_resumes_with_the_batches_still_to_come(tmp_path):
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning_job import LightningJob

    def trainer(**kwargs):
        return L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                         default_root_dir=tmp_path, enable_checkpointing="callbacks" in kwargs,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, **kwargs)

    L.seed_everything(3)
    whole = LightningJob(str(tmp_path / "whole"))
    trainer().fit(whole, datamodule=LightningJob.Data(stoker.DataLoader))
    L.seed_everything(3)
    first = LightningJob(str(tmp_path / "first"))
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3,
                                  save_top_k=-1)
    trainer(max_steps=3, callbacks=[checkpoints]).fit(
        first, datamodule=LightningJob.Data(stoker.DataLoader))
    L.seed_everything(99)  # the resumed process need not have the same global seed
    rest = LightningJob(str(tmp_path / "rest"))
    ckpt = next((tmp_path / "ckpt").iterdir())
    trainer().fit(rest, datamodule=LightningJob.Data(stoker.DataLoader), ckpt_path=str(ckpt))
    epoch = whole.samples[0]
    assert first.samples[0] == epoch[:3]
    assert rest.samples[0] == epoch[3:]  # every sample once, in the uninterrupted order
    assert rest.loader_module == "stoker.loader.dataloader"


def test_lightning_resumed_in_a_new_process_gets_every_later_batch_augmentations_included(
        tmp_path):
    # 3 epochs with seed_per_sample=True, resumed by a new process with another global seed;
    # every later batch, indices and augmentations, the uninterrupted run's (the samples'
    # seeds' base, drawn when the loader was made, comes with the state):
    # - torch's order (shuffle=True): a checkpoint after step 5 (mid-epoch 0), and one after
    #   step 6, epoch 0's last batch (Lightning counts that epoch done; the loader's state
    #   is at the epoch's end: its iterator starts the epoch Lightning's set_epoch names).
    # - stoker's order (seed=): also a checkpoint in on_train_epoch_end, whose loader state
    #   Lightning does not load (a new loader; Lightning's sampler.set_epoch gives it the
    #   epoch). With torch's order no loader can give that one: its next epoch draws from
    #   the resumed process's generator, which Lightning does not restore (docs/python.md).
    pytest.importorskip("lightning")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

    def job(*args):
        subprocess.run([sys.executable, str(HERE / "lightning_resume_job.py"), *args],
                       env=env, check=True, timeout=300, cwd=tmp_path)

    for seed, checkpoints in (("", ("mid", "last")), ("3", ("end",))):
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        job("whole", str(out), seed)
        whole = json.loads((out / "whole.json").read_text())
        assert len(whole) == 3 * 6  # 3 epochs of 24 samples in batches of 4
        for name in checkpoints:
            job("resume", str(out), str(out / f"{name}.ckpt"), seed)
            rest = json.loads((out / f"resume-{name}.ckpt.json").read_text())
            cut = 5 if name == "mid" else 6
            assert rest == whole[cut:], (seed, name)


def _pad(samples):
    """A padding collate, as for token ids of different lengths."""
    ids = [torch.tensor(s["ids"]) for s in samples]
    return {"ids": torch.nn.utils.rnn.pad_sequence(ids, batch_first=True),
            "length": torch.tensor([len(i) for i in ids]),
            "label": torch.tensor([s["label"] for s in samples])}


def test_hugging_face_map_style_data_set_with_a_padding_collate():
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({
        "ids": [list(range(1 + i % 7)) for i in range(50)],
        "label": [i % 3 for i in range(50)]})
    kwargs = dict(batch_size=8, shuffle=True, collate_fn=_pad)
    torch.manual_seed(0)
    theirs = list(tud.DataLoader(data, **kwargs))
    torch.manual_seed(0)
    loader = stoker.DataLoader(data, num_workers=2, **kwargs)
    ours = list(loader)
    assert len(ours) == len(theirs) == 7
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert loader.stats()["batches"] >= 7  # stoker's engine read them
    loader.close()


def test_hugging_face_streaming_iterable_data_set():
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"x": list(range(40))}).to_iterable_dataset(num_shards=4)
    theirs = [b["x"].tolist() for b in tud.DataLoader(data, batch_size=5, num_workers=2)]
    loader = stoker.DataLoader(data, batch_size=5, num_workers=2)
    ours = [b["x"].tolist() for b in loader]
    assert ours == theirs and sorted(sum(ours, [])) == list(range(40))
    assert loader.stats()["batches"] == 8
    loader.close()


def test_accelerate_under_torchrun_two_processes(tmp_path):
    pytest.importorskip("accelerate")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for name in ("torch", "stoker"):
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
             "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
             str(HERE / "accelerate_job.py"), name,
             str(tmp_path / name)], env=env, check=True, timeout=240)
    for rank in (0, 1):
        theirs = json.loads((tmp_path / "torch" / f"{rank}.json").read_text())
        ours = json.loads((tmp_path / "stoker" / f"{rank}.json").read_text())
        assert ours["inner"] == "stoker.loader.dataloader"
        assert theirs["inner"] == "torch.utils.data.dataloader"
        assert ours["samples"] == theirs["samples"]
        assert ours["weights"] == pytest.approx(theirs["weights"], abs=1e-6)
    both = [json.loads((tmp_path / "stoker" / f"{r}.json").read_text())["samples"]
            for r in (0, 1)]
    assert sorted(sum(both[0][0] + both[1][0], [])) == list(range(32))  # the ranks' shares
