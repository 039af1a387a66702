"""Language-model token data: stoker.TokenDataset beside the loaders its users use now, on one
synthetic corpus with log-normal document lengths (median 300 tokens, sigma 1.2; random token
ids below 50,257, each document ending in the end-of-document id 50,256), written once as a
Megatron indexed data set (.bin/.idx, uint16) and as a flat uint16 file (nanoGPT's train.bin).

(a) Best-fit packing at seq_len 4096 (documents longer than a row truncated, as Grain's packer
    requires): the share of the rows' tokens that are not padding and
    tokens/s: stoker's plan alone (plan_token_rows) and the packed rows through stoker's
    DataLoader, beside Grain's BestFitPackIterDataset over the same documents (iterated in one
    process, as its packing runs).
(b) Concatenate-and-split rows to the training loop, in tokens/s: stoker.TokenDataset(
    pack="concat") in stoker.DataLoader against megatron-core's GPTDataset in torch's
    DataLoader and a nanoGPT-style np.memmap random-window data set in torch's DataLoader,
    each baseline at its best num_workers; the ratio to the best baseline.
    LitData's TokensLoader (its StreamingDataset over chunks litdata.optimize wrote from the
    same documents, in its StreamingDataLoader) runs in this python when litdata is installed
    (pip install litdata), also at its best num_workers.
(c) The blend index of a mix of --mix-sources sources by weight, --mix-samples samples (global
    batch 1,024): stoker.token_mix_index (the blend, stratified or iid, and each sample's row in
    its source, sources wrapping around to further epochs; what stoker.TokenMix builds) and
    stoker.stratified_blend alone, beside megatron-core's build_blending_indices (its C++
    helper, what its BlendedDataset builds) on the same weights; and stoker.TokenMix's index
    built and saved, and loaded from the index cache.

Every figure is the median of --rounds rounds. The baselines run in their own virtual
environment (--peers-python; make it with
`python3 -m venv .venv-peers && .venv-peers/bin/pip install grain megatron-core torch numpy`),
each in a child process of that python; a baseline that does not import is reported so.

    python bench/token_bench.py [--smoke] [--no-peers] [--mix-only] [--docs N] [--rounds R]
                                 [--peers-python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

VOCAB, EOD = 50257, 50256


def write_megatron(prefix, tokens, lengths):
    """tokens (uint16) as a Megatron indexed data set: prefix.bin and prefix.idx."""
    docs = len(lengths)
    tokens.tofile(prefix + ".bin")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64))]) * 2
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, 8))
        f.write(struct.pack("<QQ", docs, docs + 1))
        f.write(lengths.tobytes() + pointers.astype(np.int64).tobytes())
        f.write(np.arange(docs + 1, dtype=np.int64).tobytes())


def documents(rng, docs):
    """docs log-normal lengths (median 300, sigma 1.2) and their random tokens, each document
    ending in EOD."""
    lengths = np.maximum(2, np.round(rng.lognormal(np.log(300), 1.2, docs))).astype(np.int32)
    tokens = rng.integers(0, EOD, int(lengths.sum()), dtype=np.uint16)
    tokens[np.cumsum(lengths) - 1] = EOD
    return tokens, lengths


def make_corpus(d, docs, seed=0):
    """The corpus under d: corpus.bin/.idx (Megatron) and flat.bin; returns the lengths."""
    tokens, lengths = documents(np.random.default_rng(seed), docs)
    tokens.tofile(os.path.join(d, "flat.bin"))
    write_megatron(os.path.join(d, "corpus"), tokens, lengths)
    return lengths


def make_many_files(d, files, docs_per_file, seed=0):
    """`files` corpora of `docs_per_file` documents under d, each written twice: as a Megatron
    pair (NNNNN.bin/.idx) and as a flat file (NNNNN.flat); returns the Megatron prefixes, the
    flat files and the tokens in all."""
    rng = np.random.default_rng(seed)
    prefixes, flats, total = [], [], 0
    for i in range(files):
        tokens, lengths = documents(rng, docs_per_file)
        prefixes.append(os.path.join(d, f"{i:05d}"))
        flats.append(prefixes[-1] + ".flat")
        write_megatron(prefixes[-1], tokens, lengths)
        tokens.tofile(flats[-1])
        total += len(tokens)
    return prefixes, flats, total


def evict(paths):
    """Out of the page cache (written back first), so that the next open reads the disk, as
    the first open of a data set a job did not write does."""
    os.sync()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def rate_of(loader, tokens_in, batches=None, min_seconds=2.0, warmup=5):
    """Tokens/s to a loop over `loader`'s batches (epoch after epoch) after `warmup` batches,
    timed over at least `batches` batches (None: one epoch) and `min_seconds`;
    tokens_in(batch) counts a batch's tokens."""
    def endless():
        while True:
            yield from loader

    it = endless()
    for _ in range(warmup):
        next(it)
    start, tokens, n = time.perf_counter(), 0, 0
    while True:
        tokens += tokens_in(next(it))
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and n >= (batches or len(loader)):
            return tokens / elapsed


# ---- stoker (this python) -------------------------------------------------------------------

def stoker_best_fit(d, seq_len, rounds, big_docs=1_000_000, min_seconds=2.0):
    import torch  # noqa: F401  (batches come as tensors, as in a training loop)

    import stoker

    lengths = np.fromfile(os.path.join(d, "corpus.idx"), dtype=np.int32, offset=34,
                          count=int(np.fromfile(os.path.join(d, "corpus.idx"), np.uint64,
                                                count=1, offset=18)[0]))
    big = np.maximum(2, np.round(np.random.default_rng(1).lognormal(np.log(300), 1.2,
                                                                    big_docs))).astype(np.uint32)
    plan_s, big_s, rows_rate = [], [], []
    for r in range(rounds):
        start = time.perf_counter()
        stoker.plan_token_rows(big, seq_len, pack="best_fit", seed=r, long_documents="truncate")
        big_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        plan = stoker.plan_token_rows(lengths, seq_len, pack="best_fit", seed=r,
                                      long_documents="truncate")
        plan_s.append(time.perf_counter() - start)
        ds = stoker.TokenDataset(os.path.join(d, "corpus"), seq_len, pack="best_fit", seed=r,
                                 long_documents="truncate")
        loader = stoker.DataLoader(ds, batch_size=8, shuffle=True, seed=r, num_workers=2)
        rows_rate.append(rate_of(loader, lambda b: int((b["document_ids"] >= 0).sum()),
                                 min_seconds=min_seconds))
    return dict(fill=plan["fill"], tokens=int(plan["tokens"]),
                plan_tokens_per_s=statistics.median(plan["tokens"] / s for s in plan_s),
                plan_s=statistics.median(plan_s), plan_big_s=statistics.median(big_s), big_docs=big_docs,
                rows_tokens_per_s=statistics.median(rows_rate))


def stoker_concat(d, seq_len, batch, batches, rounds, workers, min_seconds=2.0):
    import torch  # noqa: F401  (batches come as tensors, as in a training loop)

    import stoker

    ds = stoker.TokenDataset(os.path.join(d, "corpus"), seq_len, pack="concat")
    rates = []
    for r in range(rounds):
        loader = stoker.DataLoader(ds, batch_size=batch, shuffle=True, seed=r,
                                   num_workers=workers)
        rates.append(rate_of(loader, lambda b: b["input_ids"].numel(), batches, min_seconds))
    return statistics.median(rates)


def stoker_cpu_per_token(d, concat_seq_len, seq_len, batch, rounds=5):
    """What a token costs the loader: the process's CPU time (every thread) a token over a
    whole epoch read in-line, the best of `rounds` epochs, for concatenated rows of the flat
    file and best-fit rows of the Megatron files (the machine's load moves CPU time less than
    wall time)."""
    import stoker

    out = {}
    for name, ds in (("concat_flat", stoker.TokenDataset(os.path.join(d, "flat.bin"),
                                                         concat_seq_len, eod=EOD)),
                     ("best_fit_megatron", stoker.TokenDataset(os.path.join(d, "corpus"),
                                                               seq_len, pack="best_fit"))):
        best = None
        for _ in range(rounds):
            loader = stoker.DataLoader(ds, batch_size=batch, num_workers=0)
            cpu, tokens = time.process_time(), 0
            for b in loader:
                tokens += b["input_ids"].numel()
            ns = (time.process_time() - cpu) / tokens * 1e9
            loader.close()
            best = ns if best is None else min(best, ns)
        out[name + "_ns"] = best
    return out


def stoker_many_files(d, prefixes, flats, seq_len, batch, rounds, workers):
    """Seconds from naming the files to the first packed batch in the loop: stoker.TokenDataset
    over every Megatron pair (best-fit packing) and over every flat file (concatenate-and-
    split; each file scanned for its documents' ends), each round from files out of the page
    cache and an empty index cache; and once more warm (the files in the page cache, the flat
    files' indexes cached)."""
    import torch  # noqa: F401  (batches come as tensors, as in a training loop)

    import stoker

    def first_batch(paths, cache, **kw):
        start = time.perf_counter()
        ds = stoker.TokenDataset(paths, seq_len, index_cache=cache, **kw)
        loader = stoker.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers)
        next(iter(loader))
        took = time.perf_counter() - start
        loader.close()
        return took

    out = {}
    for name, paths, files, kw in (
            ("megatron_best_fit", prefixes, [p + e for p in prefixes for e in (".bin", ".idx")],
             dict(pack="best_fit")),
            ("flat_concat", flats, flats, dict(eod=EOD))):
        cold = []
        for r in range(rounds):
            cache = tempfile.mkdtemp(prefix="index-", dir=d)
            evict(files)
            cold.append(first_batch(paths, cache, seed=r, **kw))
        warm = first_batch(paths, cache, seed=rounds, **kw)
        out[name] = {"cold_s": statistics.median(cold), "warm_s": warm}
    return out


# ---- baselines (the peers' python, a child process each) ------------------------------------

def grain_best_fit(d, seq_len, rounds, bins):
    import grain

    lengths = np.fromfile(os.path.join(d, "corpus.idx"), dtype=np.int32, offset=34,
                          count=int(np.fromfile(os.path.join(d, "corpus.idx"), np.uint64,
                                                count=1, offset=18)[0]))
    tokens = np.memmap(os.path.join(d, "corpus.bin"), dtype=np.uint16, mode="r")
    starts = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64))])

    def doc(i):
        n = min(int(lengths[i]), seq_len)  # Grain's packer takes no document past a row
        return {"inputs": np.asarray(tokens[starts[i]:starts[i] + n], np.int32)}

    fills, rates = [], []
    for r in range(rounds):
        ds = grain.MapDataset.range(len(lengths)).shuffle(seed=r).map(doc).to_iter_dataset()
        packed = grain.experimental.BestFitPackIterDataset(
            ds, length_struct={"inputs": seq_len}, num_packing_bins=bins, seed=r)
        start, real, slots = time.perf_counter(), 0, 0
        for row in packed:
            real += int((row["inputs_segment_ids"] != 0).sum())
            slots += row["inputs_segment_ids"].size
        rates.append(real / (time.perf_counter() - start))
        fills.append(real / slots)
    return dict(fill=statistics.median(fills), tokens_per_s=statistics.median(rates))


def torch_rate(ds, tokens_in, batch, batches, rounds, workers, min_seconds):
    """The median over `rounds` of rate_of() for `ds` in torch's DataLoader, shuffled by a
    generator seeded with the round."""
    import torch

    rates = []
    for r in range(rounds):
        g = torch.Generator()
        g.manual_seed(r)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, generator=g,
                                             num_workers=workers)
        rates.append(rate_of(loader, tokens_in, batches, min_seconds))
    return statistics.median(rates)


def megatron_concat(d, seq_len, batch, batches, rounds, workers, min_seconds=2.0):
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tokenizer:  # what GPTDataset asks of one: the vocabulary's size and its eod id
        vocab_size, eod, pad = VOCAB, EOD, -1
        unique_identifiers = {"class": "bench"}

    cache = tempfile.mkdtemp(prefix="megatron-cache-")
    config = GPTDatasetConfig(
        random_seed=1, sequence_length=seq_len, blend=([os.path.join(d, "corpus")], None),
        split="100,0,0", tokenizer=Tokenizer(), reset_position_ids=True,
        reset_attention_mask=False, eod_mask_loss=True, create_attention_mask=False,
        path_to_cache=cache)
    samples = batch * (batches + 10) * 2
    ds = BlendedMegatronDatasetBuilder(GPTDataset, [samples, None, None], lambda: True,
                                       config).build()[0]
    return torch_rate(ds, lambda b: b["tokens"].numel(), batch, batches, rounds, workers,
                      min_seconds)


def megatron_many_files(prefixes, seq_len, batch, rounds):
    """megatron-core's way to the first batch over many files: a blend of every Megatron pair
    (equal weights) built by BlendedMegatronDatasetBuilder (each file's IndexedDataset and its
    document, sample and shuffle indexes, then the blend; built in memory: its cache of
    indexes asks for a torch.distributed process group), into torch's DataLoader; files out of
    the page cache each round."""
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tokenizer:
        vocab_size, eod, pad = VOCAB, EOD, -1
        unique_identifiers = {"class": "bench"}

    files = [p + e for p in prefixes for e in (".bin", ".idx")]
    took = []
    for r in range(rounds):
        evict(files)
        start = time.perf_counter()
        config = GPTDatasetConfig(
            random_seed=r, sequence_length=seq_len, blend=(prefixes, [1.0] * len(prefixes)),
            split="100,0,0", tokenizer=Tokenizer(), reset_position_ids=True,
            reset_attention_mask=False, eod_mask_loss=True, create_attention_mask=False,
            path_to_cache=None)
        ds = BlendedMegatronDatasetBuilder(GPTDataset, [batch * 100, 0, 0],
                                           lambda: True, config).build()[0]
        next(iter(torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True)))
        took.append(time.perf_counter() - start)
    return {"cold_s": statistics.median(took)}


def memmap_concat(d, seq_len, batch, batches, rounds, workers, min_seconds=2.0):
    import torch

    class Windows(torch.utils.data.Dataset):
        """nanoGPT's get_batch as a data set: row i is seq_len tokens from a random offset of
        the memmap'd train.bin (np.memmap opened per read, as nanoGPT does), y shifted by one."""

        def __init__(self, path):
            self.path = path
            self.n = os.path.getsize(path) // 2

        def __len__(self):
            return (self.n - 1) // seq_len

        def __getitem__(self, i):
            data = np.memmap(self.path, dtype=np.uint16, mode="r")
            o = int(np.random.default_rng(i).integers(0, self.n - seq_len - 1))
            x = torch.from_numpy(data[o:o + seq_len].astype(np.int64))
            y = torch.from_numpy(data[o + 1:o + 1 + seq_len].astype(np.int64))
            return x, y

    ds = Windows(os.path.join(d, "flat.bin"))
    return torch_rate(ds, lambda b: b[0].numel(), batch, batches, rounds, workers, min_seconds)


class _LitDocuments:
    """litdata.optimize's fn (pickled to its workers): the documents of one run, as tensors."""

    def __init__(self, path):
        self.path = path

    def __call__(self, part):
        import torch

        tokens = np.fromfile(self.path, dtype=np.uint16)
        ends = np.flatnonzero(tokens == EOD) + 1
        for i in part:
            start = 0 if i == 0 else ends[i - 1]
            yield torch.from_numpy(tokens[start:ends[i]].astype(np.int32))


def litdata_concat(d, seq_len, batch, batches, rounds, workers, min_seconds=2.0):
    """LitData's TokensLoader as its README has it: the documents written by litdata.optimize
    into its chunks (timed apart, not in the rate), read by a StreamingDataset of blocks of
    seq_len + 1 tokens, shuffled, in its StreamingDataLoader (torch's DataLoader beneath)."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

    tokens = np.fromfile(os.path.join(d, "flat.bin"), dtype=np.uint16)
    ends = np.flatnonzero(tokens == EOD) + 1
    parts = np.array_split(np.arange(len(ends)), 16)  # optimize's inputs: runs of documents
    out = tempfile.mkdtemp(prefix="litdata-")
    start = time.perf_counter()
    optimize(fn=_LitDocuments(os.path.join(d, "flat.bin")), inputs=[p.tolist() for p in parts],
             output_dir=out,
             chunk_size=(seq_len + 1) * 512, item_loader=TokensLoader(), num_workers=1)
    optimize_s = time.perf_counter() - start
    rates = []
    for r in range(rounds):
        ds = StreamingDataset(out, item_loader=TokensLoader(block_size=seq_len + 1),
                              shuffle=True, drop_last=True, seed=r)
        loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers, drop_last=True)
        # the training loop's input_ids: each block's first seq_len tokens
        rates.append(rate_of(loader, lambda b: b[:, :seq_len].numel(), batches, min_seconds))
    return {"tokens_per_s": statistics.median(rates), "optimize_s": optimize_s}


MIX_WEIGHTS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]  # sources take the first ones


def stoker_mix(sources, samples, rounds):
    """Seconds to build the blend index (median of rounds): token_mix_index, stratified and
    iid, and stratified_blend alone."""
    import stoker

    weights = MIX_WEIGHTS[:sources]
    rows = [samples // (2 * sources)] * sources  # every source wraps around at least once
    out = {}
    for name, build in (
            ("index_stratified", lambda: stoker.token_mix_index(rows, weights, "stratified",
                                                                1024, samples, 1)),
            ("index_iid", lambda: stoker.token_mix_index(rows, weights, "iid", 1024, samples,
                                                         1)),
            ("index_stratified_one_thread", lambda: stoker.token_mix_index(
                rows, weights, "stratified", 1024, samples, 1, threads=1)),
            ("blend_stratified", lambda: stoker.stratified_blend(weights, 1024,
                                                                 samples // 1024, 1))):
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            build()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    return out


def stoker_mix_cache(sources, samples, rounds):
    """Seconds for stoker.TokenMix to have its index (median of rounds; the sources opened
    before, not timed): built and saved, in a fresh index cache, and loaded from the entry the build left, in the page cache and out of it. The sources are
    flat token files of samples // (2 * sources) rows each (rows of 8 tokens: the index depends
    on the sources' row counts, not their sizes), so that each wraps around as in
    stoker_mix."""
    import shutil

    import stoker

    weights = MIX_WEIGHTS[:sources]
    rows, seq_len = samples // (2 * sources), 8
    out = {"built_s": [], "loaded_s": [], "loaded_cold_s": []}
    with tempfile.TemporaryDirectory(prefix="token-mix-") as d:
        data = []
        for s in range(sources):
            tokens = np.full(rows * seq_len, 11 + s, dtype=np.uint16)
            tokens[seq_len - 1::seq_len] = EOD  # a document a row
            path = os.path.join(d, f"source{s}.bin")
            tokens.tofile(path)
            data.append(stoker.TokenDataset(path, seq_len, eod=EOD, max_segments=2))
        cache = os.path.join(d, "cache")

        def mix():
            t = time.perf_counter()
            m = stoker.TokenMix(data, weights, global_batch=1024, samples=samples, seed=1,
                                index_cache=cache)
            return time.perf_counter() - t, m.index_from_cache()

        for _ in range(rounds):
            shutil.rmtree(cache, ignore_errors=True)
            seconds, cached = mix()
            assert not cached
            out["built_s"].append(seconds)
            seconds, cached = mix()
            assert cached
            out["loaded_s"].append(seconds)
            entries = [os.path.join(cache, f) for f in os.listdir(cache)]
            evict(entries)
            seconds, cached = mix()
            assert cached
            out["loaded_cold_s"].append(seconds)
        out = {k: statistics.median(v) for k, v in out.items()}
        out["entry_bytes"] = sum(os.path.getsize(p) for p in entries)
        out["cores"] = len(os.sched_getaffinity(0))
    return out


def megatron_blend(sources, samples, rounds):
    """Seconds for megatron-core's build_blending_indices (its C++ helper, as BlendedDataset
    calls it) on the same weights (median of rounds)."""
    try:
        from megatron.core.datasets import helpers_cpp as helpers
    except ImportError:
        from megatron.core.datasets import helpers
    weights = np.array(MIX_WEIGHTS[:sources], dtype=np.float64)
    weights /= weights.sum()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        dataset_index = np.zeros(samples, dtype=np.int16)
        dataset_sample_index = np.zeros(samples, dtype=np.int64)
        helpers.build_blending_indices(dataset_index, dataset_sample_index, weights, sources,
                                       samples, False)
        times.append(time.perf_counter() - t)
    return {"build_blending_indices": statistics.median(times)}


PEERS = {"grain": grain_best_fit, "megatron": megatron_concat, "memmap": memmap_concat,
         "megatron_blend": megatron_blend, "litdata": litdata_concat,
         "megatron_many_files": megatron_many_files}


def run_peer(python, name, args):
    """A baseline in the peers' python: its result, or the reason it did not run."""
    cmd = [python, os.path.abspath(__file__), "--peer", name, "--peer-args", json.dumps(args)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
        return {"error": lines[-1] if lines else f"exit status {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def print_loaders(a, out):
    """(a) and (b), as text."""
    bf = out["best_fit"]
    print(f"corpus: {a.docs} documents, {out['tokens']} tokens (log-normal, median 300, "
          f"sigma 1.2); medians of {a.rounds} rounds")
    print(f"(a) best-fit packing at seq_len {a.seq_len}:")
    s = bf["stoker"]
    print(f"  stoker   fill {s['fill']:.4%}  plan {s['plan_tokens_per_s'] / 1e6:,.1f}M tokens/s "
          f"({s['plan_s'] * 1e3:.1f} ms; {s['big_docs']:,} documents: "
          f"{s['plan_big_s'] * 1e3:.0f} ms)  "
          f"rows through DataLoader "
          f"{s['rows_tokens_per_s'] / 1e6:,.2f}M tokens/s")
    g = bf["grain"]
    print("  grain    " + (f"fill {g['fill']:.4%}  {g['tokens_per_s'] / 1e6:,.2f}M tokens/s "
                           f"(num_packing_bins {a.grain_bins})" if "fill" in g
                           else f"not measured: {g['error']}"))
    c = out["concat"]
    print(f"(b) concatenate-and-split, seq_len {a.concat_seq_len}, batch {a.batch}, to the loop:")
    print(f"  stoker   {c['stoker'] / 1e6:,.2f}M tokens/s ({a.stoker_workers} worker threads)")
    for name, label in (("megatron", "megatron-core GPTDataset, torch DataLoader"),
                        ("memmap", "nanoGPT np.memmap windows, torch DataLoader"),
                        ("litdata", "LitData TokensLoader, StreamingDataLoader")):
        v = c[name]
        extra = (f"; litdata.optimize took {v['optimize_s']:.1f} s before, not in the rate"
                 if "optimize_s" in v else "")
        print(f"  {name:8} " + (f"{v['tokens_per_s'] / 1e6:,.2f}M tokens/s ({label}, best at "
                                 f"num_workers={v['workers']}{extra})" if "tokens_per_s" in v
                                 else f"not measured: {v['error']}"))
    if c["ratio_to_best_baseline"]:
        print(f"  stoker / best baseline: {c['ratio_to_best_baseline']:.2f}x")
    t = out["cpu_per_token"]
    print(f"(d) CPU a token, an epoch in-line (best of 5): concatenated rows of the flat file "
          f"{t['concat_flat_ns']:.2f} ns, best-fit rows of the Megatron files "
          f"{t['best_fit_megatron_ns']:.2f} ns")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run that checks the harness")
    ap.add_argument("--docs", type=int, default=30_000, help="documents in the corpus")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=4096, help="best-fit packing's row")
    ap.add_argument("--concat-seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=200,
                    help="batches timed per round at least (b)")
    ap.add_argument("--min-seconds", type=float, default=2.0,
                    help="seconds timed per round at least (the loaders' epochs repeat)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                    help="num_workers tried for each baseline (its best is kept)")
    ap.add_argument("--stoker-workers", type=int, default=2)
    ap.add_argument("--grain-bins", type=int, default=128, help="Grain's num_packing_bins")
    ap.add_argument("--peers-python", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-peers", "bin",
        "python"))
    ap.add_argument("--mix-sources", type=int, default=10, help="sources in the mix (c)")
    ap.add_argument("--mix-samples", type=int, default=10_000_000, help="samples in the mix (c)")
    ap.add_argument("--mix-only", action="store_true", help="only (c), the blend index")
    ap.add_argument("--files", type=int, default=2000, help="token files in (e)")
    ap.add_argument("--docs-per-file", type=int, default=100, help="documents a file in (e)")
    ap.add_argument("--files-only", action="store_true",
                    help="only (e), many files to the first batch")
    ap.add_argument("--no-peers", action="store_true", help="stoker only (no baselines)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--peer-args", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        print(json.dumps(PEERS[a.peer](**json.loads(a.peer_args))))
        return
    if a.smoke:
        a.docs, a.rounds, a.batches, a.workers, a.min_seconds = 2000, 1, 10, [0], 0.0
        a.seq_len, a.concat_seq_len = 1024, 256
        a.mix_samples = 100_000
        a.files, a.docs_per_file = 20, 10
    have_peers = os.path.exists(a.peers_python) and not a.no_peers
    out = {"docs": a.docs, "rounds": a.rounds}
    if not a.files_only:
        run_loaders_and_mix(a, have_peers, out)
    if not a.mix_only:  # (e) many files to the first batch
        with tempfile.TemporaryDirectory(prefix="token-files-") as d:
            prefixes, flats, tokens = make_many_files(d, a.files, a.docs_per_file)
            many = {"files": a.files, "tokens": tokens,
                    "stoker": stoker_many_files(d, prefixes, flats, a.seq_len, a.batch,
                                                a.rounds, a.stoker_workers)}
            many["megatron"] = (run_peer(a.peers_python, "megatron_many_files", dict(
                prefixes=prefixes, seq_len=a.seq_len, batch=a.batch, rounds=a.rounds))
                if have_peers else {"error": "--no-peers" if a.no_peers
                                    else f"no peers python at {a.peers_python}"})
            out["many_files"] = many
    if a.json:
        print(json.dumps(out, indent=1))
        return
    if not a.files_only:
        print_loaders_and_mix(a, out)
    if "many_files" in out:
        print_many_files(a, out["many_files"])


def print_many_files(a, m):
    """(e), as text."""
    print(f"(e) {m['files']:,} token files ({m['tokens']:,} tokens), named to the first batch "
          f"in the loop (batch {a.batch}, seq_len {a.seq_len}), files out of the page cache:")
    for name, label in (("megatron_best_fit", "Megatron pairs, best-fit"),
                        ("flat_concat", "flat files, concatenate-and-split")):
        v = m["stoker"][name]
        print(f"  stoker   {label}: {v['cold_s']:.2f} s (warm, indexes cached: "
              f"{v['warm_s']:.2f} s)")
    mm = m["megatron"]
    print("  megatron " + (f"BlendedMegatronDatasetBuilder over the Megatron pairs + torch "
                           f"DataLoader: {mm['cold_s']:.2f} s" if "cold_s" in mm
                           else f"not measured: {mm['error']}"))


def run_loaders_and_mix(a, have_peers, out):
    """(a), (b), (d) and (c) into out."""
    if not a.mix_only:  # (a) and (b)
        with tempfile.TemporaryDirectory(prefix="token-bench-") as d:
            lengths = make_corpus(d, a.docs)
            out["tokens"] = int(lengths.sum())
            # (a) best-fit packing
            out["best_fit"] = {"seq_len": a.seq_len,
                               "stoker": stoker_best_fit(d, a.seq_len, a.rounds,
                                                         10_000 if a.smoke else 1_000_000,
                                                         a.min_seconds)}
            out["best_fit"]["grain"] = (run_peer(a.peers_python, "grain", dict(
                d=d, seq_len=a.seq_len, rounds=a.rounds, bins=a.grain_bins)) if have_peers
                else {"error": "--no-peers" if a.no_peers
                      else f"no peers python at {a.peers_python}"})
            # (b) concatenate-and-split to the training loop
            common = dict(d=d, seq_len=a.concat_seq_len, batch=a.batch, batches=a.batches,
                          rounds=a.rounds, min_seconds=a.min_seconds)
            concat = {"seq_len": a.concat_seq_len, "batch": a.batch,
                      "stoker": stoker_concat(workers=a.stoker_workers, **common)}
            for name in ("megatron", "memmap", "litdata"):
                # LitData runs in this python (.venv-test), the others in the peers'
                python = sys.executable if name == "litdata" else a.peers_python
                if a.no_peers or not os.path.exists(python):
                    concat[name] = {"error": "--no-peers" if a.no_peers
                                    else f"no peers python at {python}"}
                    continue
                tries = {w: run_peer(python, name, dict(workers=w, **common))
                         for w in a.workers}
                rate = lambda v: v["tokens_per_s"] if isinstance(v, dict) else v
                ok = {w: v for w, v in tries.items()
                      if not isinstance(v, dict) or "tokens_per_s" in v}
                best = max(ok, key=lambda w: rate(ok[w])) if ok else None
                concat[name] = ({**(ok[best] if isinstance(ok[best], dict) else {}),
                                 "tokens_per_s": rate(ok[best]), "workers": best} if ok
                                else next(iter(tries.values())))
            best = max((v["tokens_per_s"] for k, v in concat.items()
                        if isinstance(v, dict) and "tokens_per_s" in v), default=None)
            concat["ratio_to_best_baseline"] = concat["stoker"] / best if best else None
            out["concat"] = concat
            # (d) what a token costs, CPU time
            out["cpu_per_token"] = stoker_cpu_per_token(d, a.concat_seq_len, a.seq_len, a.batch)
    # (c) the blend index of a mix
    mix = {"sources": a.mix_sources, "samples": a.mix_samples,
           "stoker": stoker_mix(a.mix_sources, a.mix_samples, a.rounds),
           "stoker_cache": stoker_mix_cache(a.mix_sources, a.mix_samples, a.rounds)}
    mix["megatron"] = (run_peer(a.peers_python, "megatron_blend", dict(
        sources=a.mix_sources, samples=a.mix_samples, rounds=a.rounds)) if have_peers
        else {"error": "--no-peers" if a.no_peers else f"no peers python at {a.peers_python}"})
    out["mix"] = mix


def print_loaders_and_mix(a, out):
    """(a), (b), (d) and (c), as text."""
    if not a.mix_only:
        print_loaders(a, out)
    m = out["mix"]
    print(f"(c) blend index, {m['sources']} sources, {m['samples']:,} samples, global batch 1024:")
    sm = m["stoker"]
    print(f"  stoker   token_mix_index stratified {sm['index_stratified']:.3f} s, iid "
          f"{sm['index_iid']:.3f} s (blend + each sample's row, sources wrapping around; "
          f"stratified on one thread {sm['index_stratified_one_thread']:.3f} s); "
          f"stratified_blend alone {sm['blend_stratified']:.3f} s")
    sc = m["stoker_cache"]
    print(f"  stoker   TokenMix's index built and saved {sc['built_s']:.3f} s on {sc['cores']} "
          f"cores, loaded from the index cache "
          f"{sc['loaded_s']:.3f} s (entry in the page cache), {sc['loaded_cold_s']:.3f} s (out "
          f"of it); entry {sc['entry_bytes'] / 1e6:.0f} MB")
    mm = m["megatron"]
    print("  megatron " + (f"build_blending_indices {mm['build_blending_indices']:.3f} s "
                           "(its C++ helper; the blend only)" if "build_blending_indices" in mm
                           else f"not measured: {mm['error']}"))


if __name__ == "__main__":
    main()
