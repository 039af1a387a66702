"""A torchrun job for tests/python/test_elastic.py: `save` reads part of an epoch on every rank
and writes the ranks' merged state (loader.global_state_dict(), a gloo all_gather); `resume`
loads it on however many ranks torchrun started and reads the rest of the epoch and the next.
Each rank records the samples it saw in OUT/<mode><rank>.json."""
import argparse
import json
import os
import pathlib

import torch
import torch.distributed as dist

import stoker


class Indices(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.tensor(i)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "resume"])
    p.add_argument("out")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stop", type=int, default=0)
    p.add_argument("--worker-type", default="thread")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = pathlib.Path(a.out)
    ds = Indices()
    sampler = stoker.DistributedSampler(ds, shuffle=True, seed=17)
    loader = stoker.DataLoader(ds, batch_size=a.batch_size, sampler=sampler, num_workers=2,
                               worker_type=a.worker_type)
    seen = []
    if a.mode == "save":
        sampler.set_epoch(1)
        it = iter(loader)
        for _ in range(a.stop + rank % 2):  # ranks a batch apart, as a preemption finds them
            seen += next(it).tolist()
        state = loader.global_state_dict()
        if rank == 0:
            (out / "state.json").write_text(json.dumps(state))
    else:
        loader.load_state_dict(json.loads((out / "state.json").read_text()))
        rest = [x for b in loader for x in b.tolist()]
        sampler.set_epoch(2)
        nxt = [x for b in loader for x in b.tolist()]
        seen = {"rest": rest, "next": nxt, "workers": loader.stats()["worker_type"]}
    (out / f"{a.mode}{rank}.json").write_text(json.dumps(seen))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
