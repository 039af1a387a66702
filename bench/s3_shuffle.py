"""Data larger than the object cache: stoker.WebDataset("s3://...") and stoker.ParquetDataset(
"s3://...") shuffled through an object cache of a tenth and a hundredth of the data set, against
reading it in order through the same cache, the global shuffle it had before (each sample's
block fetched when it is read), and a stream's shuffle (webdataset's shardshuffle=100 +
shuffle(5000)); bytes fetched, requests, throughput, each sample once over 4 simulated ranks,
and the shuffle's quality.

    python bench/s3_shuffle.py [--images 2000] [--rows 50000] [--ratios 10 100] [--sets ...]
        [--static] [--rounds 3]
    python bench/s3_shuffle.py --smoke

The server: SeaweedFS (`weed mini`, STOKER_WEED or PATH) behind nginx (`--proxy nginx`, the
default where Debian's nginx and libnginx-mod-http-lua are installed) or tests/support/
fault_proxy.py (`--proxy fault`) adding `--latency-ms` (20) to every request. The Python proxy
serves about 600 requests a second on two cores, so a shuffle that makes a GET a sample measures
it rather than stoker; nginx serves over twice that on the same machine. `--static`: nginx
serves the objects' GETs from files itself (SeaweedFS keeps the listings), a request costing
the shared cores tens of microseconds instead of SeaweedFS's milliseconds: a remote bucket's
cost to the node, which is the request's latency and the client's own work. Four data sets, sorted
by label (100 classes, so that a batch's distinct labels say how well the order mixes), each
sample with its id, in 20 files:
- jpeg: `--images` generated 256x256 JPEGs (about 40 KB) in WebDataset shards, read with
  T.train(224);
- rows: `--rows` rows of 2 KB (an npy member) in WebDataset shards;
- pq-jpeg, pq-rows: the same as Parquet files (an image column; a fixed-size list of 2,000
  bytes), row groups of 10 images or 50 rows: the row group is Parquet's storage block, so
  the window holds what the cache holds of whole row groups.
Each configuration reads one epoch (batch 32, 2 worker threads) with the indexes cached and a
fresh object cache of the data set's bytes / ratio (for Parquet, its row-group cache too); auto
and in order alternate `--rounds` times (3; the median rate):
- auto: shuffle=True (the loader chooses: stats()["shuffle"] says what and why);
- global: shuffle="global" (the order before this choice existed), JPEGs at ratio 10 only;
- in order: shuffle=False;
- 4 ranks: stoker.DistributedSampler(num_replicas=4) for ranks 0-3, four loaders read at once
  from threads of one process (one node's ranks, one object cache);
- two nodes: 4 ranks as 2 nodes of 2, each node its own object cache (each Parquet rank its
  own row-group cache), told their node (LOCAL_WORLD_SIZE=2: each node a run of blocks of its
  own) and not (`two_nodes_strided`: the order strided over all ranks as one node's, so each
  node reads from every block); each node's bytes against its half of the data set
  (WebDataset sets);
- no object cache (object_cache_bytes=0; WebDataset sets): in order and shuffled, each sample
  its own range, the neighbours a batch names in a shard fetched by one GET.
Figures: bytes fetched / the data set's bytes, GETs counted at the proxy / the data set's
storage blocks, samples/s and auto / in order, the CPU seconds of the loader's process and of
the server (SeaweedFS and the proxy share the loader's cores here: a GET costs SeaweedFS about
2.5 ms of CPU, so an order that makes a GET a sample pays the server's work too); each sample
once (ids); the shuffle's entropy (stoker.shuffle_quality: steps in sample and shard ids) as a
share of a full shuffle's, and a batch's distinct labels against i.i.d. draws; a stream's
order beside it (webdataset's own for the shards, computed for Parquet).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import pathlib
import resource
import shutil
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np

import stoker
from stoker import transforms as T

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
from seaweed import BUCKET, KEY, SECRET, Server, nginx_available  # noqa: E402

CLASSES, SHARDS, BATCH, ROW = 100, 20, 32, 2000
PQ_GROUP = {"pq-jpeg": 10, "pq-rows": 50}  # rows a Parquet row group holds
KINDS = ("jpeg", "rows", "pq-jpeg", "pq-rows")


def sample_payload(kind: str, rng) -> bytes:
    """A sample's data: a 256x256 JPEG (about 40 KB) or 2,000 random bytes."""
    if kind.endswith("jpeg"):
        from PIL import Image
        pixels = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8).repeat(4, 0)
        buf = io.BytesIO()
        Image.fromarray(pixels.repeat(4, 1)).save(buf, "JPEG", quality=90)
        return buf.getvalue()
    return rng.integers(0, 255, ROW, dtype=np.uint8).tobytes()


def made_once(name: str, make) -> pathlib.Path:
    """The folder `name` in the temporary directory, filled by `make(folder)` the first time:
    a "done" file marks it whole, and a folder left half made is emptied and made again."""
    root = pathlib.Path(tempfile.gettempdir()) / name
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        make(root)
        (root / "done").touch()
    return root


def make_shards(kind: str, n: int) -> pathlib.Path:
    """`n` samples sorted by label in SHARDS files, made once: WebDataset tar shards (.jpg or
    .npy, .cls, .id) or, for the pq- kinds, Parquet files (image or blob, label, id) in row
    groups of PQ_GROUP rows."""

    def write(root: pathlib.Path) -> None:
        rng = np.random.default_rng(0)
        per = -(-n // SHARDS)
        for s in range(SHARDS):
            ids = range(s * per, min(n, (s + 1) * per))
            payloads = [sample_payload(kind, rng) for _ in ids]
            labels = [i * CLASSES // n for i in ids]
            if kind.startswith("pq-"):
                import pyarrow as pa
                import pyarrow.parquet as pq
                if kind == "pq-jpeg":
                    data = pa.array(payloads, pa.binary())
                else:
                    data = pa.FixedSizeListArray.from_arrays(
                        pa.array(np.frombuffer(b"".join(payloads), np.uint8)), ROW)
                table = pa.table({pq_column(kind): data, "label": pa.array(labels, pa.int64()),
                                  "id": pa.array(list(ids), pa.int64())})
                pq.write_table(table, root / f"train-{s:04d}.parquet",
                               row_group_size=PQ_GROUP[kind])
                continue
            with tarfile.open(root / f"train-{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                for i, payload, label in zip(ids, payloads, labels):
                    if kind != "jpeg":
                        buf = io.BytesIO()
                        np.save(buf, np.frombuffer(payload, np.uint8))
                        payload = buf.getvalue()
                    for ext, data in ((("jpg" if kind == "jpeg" else "npy"), payload),
                                      ("cls", str(label).encode()), ("id", str(i).encode())):
                        info = tarfile.TarInfo(f"{i:08d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))

    return made_once(f"stoker-bench-shuffle-{kind}-{n}", write)


def pq_column(kind: str) -> str:
    return "image" if kind == "pq-jpeg" else "blob"


def dataset(kind: str, urls, work: pathlib.Path, cache_bytes: int, objects: str):
    """The data set over `urls` through an object cache of `cache_bytes` (for Parquet, its
    row-group cache too: the cache its window is chosen by)."""
    common = dict(index_cache=work / "index", object_cache=work / objects,
                  object_cache_bytes=cache_bytes)
    if kind.endswith("jpeg"):
        common["transform"] = T.train(224)
    if kind.startswith("pq-"):
        return stoker.ParquetDataset(urls, columns=(pq_column(kind), "label", "id"),
                                     cache_bytes=cache_bytes, **common)
    fields = ("jpg", "cls", "id") if kind == "jpeg" else ("npy", "cls", "id")
    return stoker.WebDataset(urls, fields=fields, **common)


def epoch(loader) -> tuple[list[int], float]:
    """The ids one epoch delivers, in order, and its samples/s."""
    ids, start = [], time.perf_counter()
    for batch in loader:
        ids.extend(batch[2].tolist())
    return ids, len(ids) / (time.perf_counter() - start)


def cpu_now(server: Server) -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, server.cpu_seconds()


def cpu_since(server: Server, before: tuple[float, float]) -> dict:
    """CPU seconds since `before`: this process's (the loaders) and the server's (SeaweedFS and
    its proxy, on the same cores here)."""
    loader, server_cpu = cpu_now(server)
    return {"loader_cpu_s": loader - before[0], "server_cpu_s": server_cpu - before[1]}


def measure(server: Server, kind: str, urls, work: pathlib.Path, cache: int, name: str,
            **loader_kw) -> dict:
    """One epoch of one configuration through a fresh object cache of `cache` bytes."""
    objects = f"objects-{name}"
    shutil.rmtree(work / objects, ignore_errors=True)
    ds = dataset(kind, urls, work, cache, objects)
    before = ds.object_storage()["bytes_fetched"]
    server.reset()
    cpu = cpu_now(server)
    loader = stoker.DataLoader(ds, batch_size=BATCH, num_workers=2, seed=7, **loader_kw)
    ids, rate = epoch(loader)
    stats = loader.stats()
    loader.close()
    out = {"samples_per_s": rate, "GET": server.counts()["GET"],
           "bytes_fetched": ds.object_storage()["bytes_fetched"] - before,
           "shuffle": stats["shuffle"], "window": stats["shuffle_window"], "ids": ids,
           **cpu_since(server, cpu)}
    shutil.rmtree(work / objects, ignore_errors=True)
    return out


def ranks_at_once(server: Server, kind: str, urls, work: pathlib.Path, cache: int,
                  nodes: int = 1, per_node: int = 4, laid_out: bool = True) -> dict:
    """`nodes` x `per_node` ranks reading one epoch at once, from threads of one process: each
    node's WebDataset ranks share its object cache (a data set object of its own), each Parquet
    rank has its own row-group cache (as each process of a real job). `laid_out`: the ranks
    are told their node (LOCAL_WORLD_SIZE, as torchrun sets it), so the order gives each node
    a run of blocks of its own; else the order is strided over all ranks as one node's."""
    world = nodes * per_node
    per_rank_cache = kind.startswith("pq-")  # (four_ranks only: see run())
    datasets = {}

    def dataset_of(r):
        key = r if per_rank_cache else r // per_node
        if key not in datasets:
            shutil.rmtree(work / f"objects-ranks-{key}", ignore_errors=True)
            datasets[key] = dataset(kind, urls, work, cache, f"objects-ranks-{key}")
        return datasets[key]

    loaders = []
    saved = os.environ.pop("LOCAL_WORLD_SIZE", None)
    if laid_out and nodes > 1:
        os.environ["LOCAL_WORLD_SIZE"] = str(per_node)  # read as each loader is made
    try:
        for r in range(world):
            ds = dataset_of(r)
            sampler = stoker.DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True,
                                                seed=7)
            loaders.append(stoker.DataLoader(ds, batch_size=BATCH, sampler=sampler,
                                             num_workers=2))
    finally:
        os.environ.pop("LOCAL_WORLD_SIZE", None)
        if saved is not None:
            os.environ["LOCAL_WORLD_SIZE"] = saved
    before = {k: d.object_storage()["bytes_fetched"] for k, d in datasets.items()}
    server.reset()
    results: list = [None] * world
    cpu = cpu_now(server)

    def rank(r):
        results[r] = epoch(loaders[r])[0]
        loaders[r].close()

    start = time.perf_counter()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    fetched = {k: d.object_storage()["bytes_fetched"] - before[k] for k, d in datasets.items()}
    per_node_bytes = [sum(f for k, f in fetched.items()
                          if (k // per_node if per_rank_cache else k) == v) for v in range(nodes)]
    seen = [i for ids in results for i in ids]
    n = len(dataset_of(0))
    padding = len(seen) - n
    for k in datasets:
        shutil.rmtree(work / f"objects-ranks-{k}", ignore_errors=True)
    return {"samples_per_s": len(seen) / seconds, "GET": server.counts()["GET"],
            "bytes_fetched": sum(per_node_bytes), "node_bytes": per_node_bytes,
            "each_once": sorted(set(seen)) == list(range(n)) and 0 <= padding < world,
            "per_rank": [len(ids) for ids in results], **cpu_since(server, cpu)}


def stream_order(shards: list[pathlib.Path]) -> list[int]:
    """webdataset's stream order over the same shards: shardshuffle=100, shuffle(5000)."""
    import webdataset as wds

    ds = (wds.WebDataset([str(s) for s in shards], shardshuffle=100, empty_check=False,
                         seed=7).shuffle(5000).to_tuple("id"))
    return [int(i[0]) for i in ds]


def run(kind: str, n: int, ratios, server: Server, work: pathlib.Path, smoke: bool,
        four: bool = True, rounds: int = 1) -> dict:
    root = make_shards(kind, n)
    shards = sorted(root.glob("train-*.parquet" if kind.startswith("pq-") else "train-*.tar"))
    for s in shards:
        server.put(f"shuffle-{kind}-{n}/{s.name}", s.read_bytes())
    urls = f"s3://{BUCKET}/shuffle-{kind}-{n}/"
    indexed = dataset(kind, urls, work, 10 << 30, "objects-index")  # the indexes, cached once
    layout = indexed.storage_layout()
    data_bytes = sum(layout["block_bytes"])
    shard_ends = layout["shard_ends"]
    labels = [i * CLASSES // n for i in range(n)]
    shutil.rmtree(work / "objects-index", ignore_errors=True)

    def quality(order):
        return stoker.shuffle_quality(order, shard_ends, labels=labels, batch_size=BATCH)

    full = quality(np.random.default_rng(7).permutation(n).tolist())
    if kind.startswith("pq-"):  # no stream reader of Parquet here: the order computed
        report = stoker.shuffle_report(indexed, BATCH, labels=labels, seed=7, buffers=(5000,),
                                       show=False)
        row = next(r for r in report["rows"] if r["order"].startswith("stream"))
        stream = ("a stream's file shuffle + buffer of 5000 (computed)", row)
    else:
        stream = ("webdataset shardshuffle=100 + shuffle(5000)", quality(stream_order(shards)))
    out = {"samples": n, "data_bytes": data_bytes, "shards": len(shards), "full": full,
           "stream": stream, "ratios": {}}
    for ratio in ratios:
        cache = data_bytes // ratio
        row = {"cache_bytes": cache}
        runs = [("auto", {"shuffle": True}), ("in_order", {"shuffle": False})]
        if ratio == ratios[0] and kind.endswith("jpeg") and not smoke:
            runs.append(("global", {"shuffle": "global"}))
        # auto and in order alternate `rounds` times (the median rate; the most bytes and
        # GETs of a round; each sample once in every round), the global order once.
        for k in range(rounds):
            for name, kw in runs if k == 0 else runs[:2]:
                r = measure(server, kind, urls, work, cache, f"{kind}-{ratio}-{name}", **kw)
                ids = r.pop("ids")
                r["each_once"] = sorted(ids) == list(range(n))
                r["bytes_over_data"] = r["bytes_fetched"] / data_bytes
                if name != "in_order" and k == 0:
                    r["quality"] = quality(ids)
                row.setdefault(name, []).append(r)
        for name in [name for name, _ in runs]:
            row[name] = merged_rounds(row[name])
        # The blocks the loader read in: GETs against them.
        row["blocks"] = len(_blocks(kind, urls, work, cache))
        for name in ("auto", "in_order", "global"):
            if name in row:
                row[name]["GET_over_blocks"] = row[name]["GET"] / row["blocks"]
        row["auto_over_in_order"] = (row["auto"]["samples_per_s"] /
                                     row["in_order"]["samples_per_s"])
        if not smoke and four:
            # One node of 4 ranks; two nodes of 2, told their node and not (each node's bytes
            # against its half of the data set).
            # (Parquet's ranks each have a row-group cache of their own, laid out per rank
            # whatever the node: tests/python/test_parquet.py counts their row-group reads.)
            nodes = [] if kind.startswith("pq-") else [
                ("two_nodes", {"nodes": 2, "per_node": 2}),
                ("two_nodes_strided", {"nodes": 2, "per_node": 2, "laid_out": False})]
            for name, kw in [("four_ranks", {})] + nodes:
                x = row[name] = ranks_at_once(server, kind, urls, work, cache, **kw)
                x["bytes_over_data"] = x["bytes_fetched"] / data_bytes
                x["node_over_share"] = max(x["node_bytes"]) / (data_bytes / len(x["node_bytes"]))
        out["ratios"][ratio] = row
    if not kind.startswith("pq-"):
        # No object cache (object_cache_bytes=0): each sample its own range, the neighbours a
        # batch names in a shard fetched by one GET.
        out["no_cache"] = {}
        for name, kw in (("in_order", {"shuffle": False}), ("shuffled", {"shuffle": True})):
            r = measure(server, kind, urls, work, 0, f"{kind}-nocache-{name}", **kw)
            ids = r.pop("ids")
            r["each_once"] = sorted(ids) == list(range(n))
            r["bytes_over_data"] = r["bytes_fetched"] / data_bytes
            r["GET_over_samples"] = r["GET"] / n
            out["no_cache"][name] = r
    return out


def merged_rounds(results: list) -> dict:
    """One configuration's rounds as one: the median samples/s and CPU, the most bytes and
    GETs, each sample once only if in every round, the first round's quality."""
    out = dict(results[0])
    for key in ("samples_per_s", "loader_cpu_s", "server_cpu_s"):
        out[key] = float(np.median([r[key] for r in results]))
    for key in ("bytes_fetched", "bytes_over_data", "GET"):
        out[key] = max(r[key] for r in results)
    out["each_once"] = all(r["each_once"] for r in results)
    out["rounds"] = len(results)
    return out


def _blocks(kind, urls, work, cache) -> list:
    ds = dataset(kind, urls, work, cache, "objects-blocks")
    return ds.storage_layout()["block_ends"]


def quality_line(x: dict, full: dict) -> str:
    """A shuffle's quality (stoker.shuffle_quality) as a share of a full shuffle's."""
    return (f"entropy {x['sample_entropy'] / full['sample_entropy']:.3f} / "
            f"{x['shard_entropy'] / full['shard_entropy']:.3f} of full, labels/batch "
            f"{x['labels_per_batch']:.1f} (iid {x['iid_labels_per_batch']:.1f})")


def show_heading(heading: str, full: dict):
    """Prints a data set's heading and its full shuffle's quality; returns the quality line of
    another shuffle of it (quality_line against that full shuffle)."""
    print(heading)
    print(f"  full shuffle: {quality_line(full, full)}")
    return lambda x: quality_line(x, full)


def show(kind: str, r: dict) -> None:
    q = show_heading(f"\n{kind}: {r['samples']} samples, {r['data_bytes'] / 1e6:.1f} MB in "
                     f"{r['shards']} shards", r["full"])
    print(f"  {r['stream'][0]}: {q(r['stream'][1])}")
    for ratio, row in r["ratios"].items():
        print(f"  object cache = data / {ratio} ({row['cache_bytes'] / 1e6:.2f} MB, "
              f"{row['blocks']} blocks)")
        for name in ("auto", "in_order", "global", "four_ranks", "two_nodes",
                     "two_nodes_strided"):
            if name not in row:
                continue
            x = row[name]
            of = f" (median of {x['rounds']})" if x.get("rounds", 1) > 1 else ""
            line = (f"    {name:17s} {x['samples_per_s']:8.0f} samples/s{of}  bytes "
                    f"{x['bytes_over_data']:5.2f}x data  GETs {x['GET']:6d}")
            if "GET_over_blocks" in x:
                line += f" ({x['GET_over_blocks']:.2f}x blocks)"
            if len(x.get("node_bytes", ())) > 1:
                line += f" (a node {x['node_over_share']:.2f}x its share)"
            line += (f"  each once: {x['each_once']}  CPU s: loader {x['loader_cpu_s']:.1f}, "
                     f"server {x['server_cpu_s']:.1f}")
            print(line)
            if "quality" in x:
                print(f"               {q(x['quality'])}")
        print(f"    auto / in order: {row['auto_over_in_order']:.2f}; shuffle: "
              f"{row['auto']['shuffle']}")
    for name, x in r.get("no_cache", {}).items():
        print(f"  no object cache, {name:8s} {x['samples_per_s']:8.0f} samples/s  bytes "
              f"{x['bytes_over_data']:5.2f}x data  GETs {x['GET']:6d} "
              f"({x['GET_over_samples']:.3f} a sample)  each once: {x['each_once']}  CPU s: "
              f"loader {x['loader_cpu_s']:.1f}, server {x['server_cpu_s']:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--rows", type=int, default=50000)
    p.add_argument("--ratios", type=int, nargs="+", default=[10, 100])
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--sets", nargs="+", default=list(KINDS), choices=KINDS,
                   help="WebDataset shards of JPEGs or 2 KB rows, Parquet files of the same")
    p.add_argument("--proxy", choices=["nginx", "fault"],
                   default="nginx" if nginx_available() else "fault",
                   help="what adds the latency: nginx (default where installed) or the Python "
                        "fault proxy (about 600 requests/s on two cores: it binds a shuffle)")
    p.add_argument("--static", action="store_true",
                   help="objects' GETs served by nginx from files (tens of microseconds of CPU "
                        "a request, where SeaweedFS takes milliseconds of the loader's cores): "
                        "a bucket whose server is elsewhere, as a real one is; needs nginx")
    p.add_argument("--rounds", type=int, default=3,
                   help="auto and in order alternate this many times (the median rate)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check that it runs")
    args = p.parse_args()
    if args.smoke:
        args.images, args.rows, args.ratios, args.rounds = 200, 2000, [10], 1
    # The loaders' advice at fixed settings ("... would change ..."): not in the table.
    logging.getLogger("stoker").setLevel(logging.WARNING)
    weed = os.environ.get("STOKER_WEED") or shutil.which("weed")
    if not weed:
        print("s3_shuffle: no SeaweedFS (set STOKER_WEED or put weed on PATH)")
        return 1
    os.environ.update({"no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"})
    work = pathlib.Path(tempfile.mkdtemp(prefix="stoker-s3-shuffle-"))
    (work / "server").mkdir()
    server = Server(weed, work / "server", latency_ms=args.latency_ms, proxy=args.proxy,
                    static=args.static)
    os.environ.update({
        "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.proxy_port}",
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"), "AWS_CONFIG_FILE": str(work / "none")})
    try:
        sizes = {"jpeg": args.images, "rows": args.rows, "pq-jpeg": args.images,
                 "pq-rows": args.rows}
        result = {kind: run(kind, sizes[kind], args.ratios, server, work, args.smoke,
                            rounds=args.rounds)
                  for kind in args.sets}
        result["proxy"] = args.proxy
        result["static"] = args.static
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        served = ("objects served by nginx from files (listings by SeaweedFS)" if args.static
                  else "SeaweedFS")
        print(f"{served} behind the {args.proxy} proxy adding {args.latency_ms:g} ms a request")
        for kind in args.sets:
            show(kind, result[kind])
    return 0


if __name__ == "__main__":
    sys.exit(main())
