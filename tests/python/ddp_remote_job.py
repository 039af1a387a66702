"""One rank of test_remote.py's torchrun job (gloo, CPU): reads two shuffled epochs of its
partition through the remote workers, which the ranks share (one pool, made by whichever rank
asks first), and writes what it got and which actors served it to <out>/rank<r>.json.

Usage: python -m torch.distributed.run --standalone --nproc_per_node 2 ddp_remote_job.py
           <ray address> <out>"""

import json
import sys

import numpy as np
import ray
import torch.distributed as dist

import stoker
import worker_datasets as wd


def epochs(loader, count=2):
    out = []
    for epoch in range(count):
        loader.sampler.set_epoch(epoch)
        out.extend(loader)
    return out


def main() -> None:
    address, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ray.init(address=address, log_to_driver=False)
    data = wd.Seeded(n=96)

    def loader(remote, workers):
        sampler = stoker.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                            seed=3)
        return stoker.DataLoader(data, batch_size=8, num_workers=workers, remote=remote, seed=7,
                                 sampler=sampler)

    local = loader(None, 2)
    expected = epochs(local)
    local.close()
    remote = loader(stoker.ray_workers(2), 0)
    got = epochs(remote)
    stats = remote.stats()["remote"]
    actors = [actor._actor_id.hex() for actor in remote._pipeline.remote.actors]
    same = len(got) == len(expected) and all(
        x["name"] == y["name"] and np.array_equal(x["image"], y["image"])
        and np.array_equal(x["label"], y["label"]) for x, y in zip(got, expected))
    dist.barrier()  # both ranks are done reading before either lets the actors go
    remote.close()
    dist.barrier()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(dict(same=same, batches=len(got), jobs=stats["jobs"], pids=stats["pids"],
                       actors=actors, pool=stats["pool"]), f)
    ray.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
