"""Resume of a weighted mix of two token corpora on a new topology: stoker.TokenMix beside
LitData's CombinedStreamingDataset, in one run (issue 50's "Resume at 100 random cut points, 4
ranks x 3 workers to 3 ranks x 2 workers").

Two synthetic corpora (log-normal document lengths, as token_bench.py's), cut into rows of
--seq-len tokens (concatenate-and-split) and mixed 0.7 / 0.3:

- stoker: TokenMix (stratified, global batch 16) read in order by 4 ranks (DistributedSampler)
  of batch 4 on 3 worker threads each, stopped at --cuts random cut points (every other one
  with the ranks at different steps), each rank's DataLoader.state_dict() merged
  (stoker.merge_states) and loaded on 3 ranks of 2 workers: a cut point is exact when the new
  ranks' rows, in the order of the rest of the epoch, equal the uninterrupted run's from the
  cut on. Duplicated and missed rows are counted against the uninterrupted epoch.
- LitData (its own python, --litdata-python): the same corpora written by litdata.optimize
  (TokensLoader, blocks of --seq-len), a CombinedStreamingDataset of the two StreamingDatasets
  (weights 0.7 / 0.3, seed 7) in a StreamingDataLoader, each rank simulated by LitData's own
  WORLD_SIZE and GLOBAL_RANK variables. The 4 x 3 run's state_dict() at the same cut steps is
  loaded into each rank of a 3 x 2 run: what LitData does (an error, or the rows after it,
  whose duplicates and misses are counted against its uninterrupted 3 x 2 epoch) is reported.
  Its supported case, resume on the same topology, is checked at --same-cuts cut points
  (resumed rows against the uninterrupted run's from the cut, rank by rank).

    python bench/token_resume_bench.py [--smoke] [--cuts N] [--litdata-python PY] [--json]

The LitData environment: python3 -m venv .venv-litdata && .venv-litdata/bin/pip install litdata
torch numpy.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import bench_args
from token_bench import EOD, _LitDocuments, documents

WEIGHTS = [0.7, 0.3]
OLD, NEW = (4, 3), (3, 2)  # (ranks, workers)
BATCH = 4


def make_corpora(d, docs, seed=5):
    """Two flat uint16 token files under d (the second half the size); their paths."""
    paths = []
    for i, n in enumerate((docs, docs // 2)):
        tokens, _ = documents(np.random.default_rng(seed + i), n)
        paths.append(os.path.join(d, f"corpus{i}.bin"))
        tokens.tofile(paths[-1])
    return paths


def key(source, ids):
    return int(source), np.asarray(ids).tobytes()


def stoker_side(paths, seq_len, samples, cuts, seed=50):
    """stoker's cut points: how many were exact, and the rows duplicated and missed over all."""
    import stoker

    sources = [stoker.TokenDataset(p, seq_len, eod=EOD, seed=i) for i, p in enumerate(paths)]
    ds = stoker.TokenMix(sources, WEIGHTS, global_batch=OLD[0] * BATCH, samples=samples, seed=7)

    def rows(batch):
        return [key(s, ids) for s, ids in zip(np.asarray(batch["source"]),
                                              np.asarray(batch["input_ids"]))]

    whole = [r for b in stoker.DataLoader(ds, batch_size=16) for r in rows(b)]
    steps_old = len(ds) // (OLD[0] * BATCH)
    rng = np.random.default_rng(seed)
    exact = duplicated = missed = 0
    for cut in range(cuts):
        if cut % 2 == 0:
            stops = [int(rng.integers(1, steps_old))] * OLD[0]
        else:
            stops = [int(x) for x in rng.integers(1, steps_old, OLD[0])]
        seen, states = [], []
        for r in range(OLD[0]):
            sampler = stoker.DistributedSampler(ds, num_replicas=OLD[0], rank=r, shuffle=False)
            loader = stoker.DataLoader(ds, batch_size=BATCH, sampler=sampler,
                                       num_workers=OLD[1], worker_type="thread")
            it = iter(loader)
            for _ in range(stops[r]):
                seen += rows(next(it))
            states.append(loader.state_dict())
            loader.close()
        merged = stoker.merge_states(states)
        rest = []
        for r in range(NEW[0]):
            sampler = stoker.DistributedSampler(ds, num_replicas=NEW[0], rank=r, shuffle=False)
            loader = stoker.DataLoader(ds, batch_size=BATCH, sampler=sampler,
                                       num_workers=NEW[1], worker_type="thread")
            loader.load_state_dict(merged)
            rest.append([rows(b) for b in loader])
            loader.close()
        consumed = {k * 16 + r + OLD[0] * j for r in range(OLD[0]) for k in range(stops[r])
                    for j in range(BATCH)}
        # The new ranks' rows in the rest's order: rank r holds its positions r, r + 3, ...
        stream = [rest[r][k][j] for k in range(len(rest[0])) for j in range(len(rest[0][k]))
                  for r in range(NEW[0])]
        remaining = [whole[p] for p in range(len(whole)) if p not in consumed]
        exact += stream[:len(remaining)] == remaining and len(stream) - len(remaining) < NEW[0]
        got = collections.Counter(seen) + collections.Counter(stream[:len(remaining)])
        want = collections.Counter(whole)
        duplicated += sum((got - want).values())
        missed += sum((want - got).values())
    return {"cuts": cuts, "exact": exact, "duplicated_rows": duplicated, "missed_rows": missed,
            "samples": len(ds), "steps_per_rank": steps_old}


# ---- LitData (run in its own python: --peer) ------------------------------------------------

def _lit_loader(dirs, seq_len, ranks, rank, workers):
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata import TokensLoader

    os.environ["WORLD_SIZE"], os.environ["GLOBAL_RANK"] = str(ranks), str(rank)
    parts = [StreamingDataset(d, item_loader=TokensLoader(block_size=seq_len), shuffle=True,
                              seed=7) for d in dirs]
    ds = CombinedStreamingDataset(parts, weights=WEIGHTS, seed=7, iterate_over_all=False)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)


def _lit_rows(batch):
    return [np.asarray(x).tobytes() for x in batch.numpy()]


def litdata_side(paths, seq_len, cuts, same_cuts, seed=50):
    from litdata import TokensLoader, optimize

    out_dirs = []
    for p in paths:
        tokens = np.fromfile(p, dtype=np.uint16)
        n = len(np.flatnonzero(tokens == EOD))
        out_dirs.append(tempfile.mkdtemp(prefix="litdata-resume-"))
        optimize(fn=_LitDocuments(p), inputs=[r.tolist() for r in np.array_split(np.arange(n), 8)],
                 output_dir=out_dirs[-1], chunk_size=seq_len * 256, item_loader=TokensLoader(),
                 num_workers=1)
    # The uninterrupted 4 x 3 run, each rank's batches and its state after each step.
    batches, states = [], []
    for r in range(OLD[0]):
        loader = _lit_loader(out_dirs, seq_len, OLD[0], r, OLD[1])
        batches.append([]), states.append([])
        for b in loader:
            batches[r].append(_lit_rows(b))
            states[r].append(copy.deepcopy(loader.state_dict()))
    steps = min(len(b) for b in batches)
    rng = np.random.default_rng(seed)
    cut_steps = [int(rng.integers(1, steps)) for _ in range(cuts)]
    result = {"cuts": cuts, "steps_per_rank": steps, "errors": 0, "error": None,
              "resumed": 0, "duplicated_rows": 0, "missed_rows": 0}
    whole_new = None
    for k in cut_steps:
        rest = []
        try:
            for r in range(NEW[0]):
                loader = _lit_loader(out_dirs, seq_len, NEW[0], r, NEW[1])
                loader.load_state_dict(states[r][k - 1])
                rest += [x for b in loader for x in _lit_rows(b)]
        except Exception as e:  # what LitData does is the measurement
            result["errors"] += 1
            result["error"] = f"{type(e).__name__}: {e}"
            continue
        result["resumed"] += 1
        if whole_new is None:  # its uninterrupted 3 x 2 epoch
            whole_new = collections.Counter(
                x for r in range(NEW[0]) for b in _lit_loader(out_dirs, seq_len, NEW[0], r, NEW[1])
                for x in _lit_rows(b))
        seen = collections.Counter(x for r in range(OLD[0]) for b in batches[r][:k] for x in b)
        got = seen + collections.Counter(rest)
        result["duplicated_rows"] += sum((got - whole_new).values())
        result["missed_rows"] += sum((whole_new - got).values())
    # Its supported case: the same topology, rank by rank against the uninterrupted run (in
    # order, and as multisets over the epoch); and whether a second uninterrupted run of rank 0
    # repeats the first (the order being a function of the seed).
    again = [x for b in _lit_loader(out_dirs, seq_len, OLD[0], 0, OLD[1]) for x in _lit_rows(b)]
    whole_old = collections.Counter(x for r in range(OLD[0]) for b in batches[r] for x in b)
    same = {"cuts": same_cuts, "exact": 0, "rows_out_of_order": 0, "duplicated_rows": 0,
            "missed_rows": 0, "rerun_repeats": again == [x for b in batches[0] for x in b]}
    for k in cut_steps[:same_cuts]:
        exact, got = True, collections.Counter()
        for r in range(OLD[0]):
            loader = _lit_loader(out_dirs, seq_len, OLD[0], r, OLD[1])
            loader.load_state_dict(states[r][k - 1])
            resumed = [x for b in loader for x in _lit_rows(b)]
            want = [x for b in batches[r][k:] for x in b]
            differ = sum(a != b for a, b in zip(resumed, want)) + abs(len(resumed) - len(want))
            same["rows_out_of_order"] += differ
            exact = exact and differ == 0
            got += collections.Counter(x for b in batches[r][:k] for x in b)
            got += collections.Counter(resumed)
        same["exact"] += exact
        same["duplicated_rows"] += sum((got - whole_old).values())
        same["missed_rows"] += sum((whole_old - got).values())
    result["same_topology"] = same
    import litdata

    result["version"] = litdata.__version__
    return result


def run_litdata(python, args):
    cmd = [python, os.path.abspath(__file__), "--peer", json.dumps(args)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
        return {"not_run": lines[-1] if lines else f"exit status {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--peer":
        print(json.dumps(litdata_side(**json.loads(sys.argv[2]))))
        return
    p = bench_args.parser(__doc__, docs=2000, seq_len=64, samples=640, cuts=100, same_cuts=3)
    p.add_argument("--litdata-python", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-litdata", "bin",
        "python"))
    p.add_argument("--json", action="store_true")
    a = bench_args.parse(p, dict(docs=200, samples=160, cuts=4, same_cuts=1),
                         "a tiny run that checks the harness")
    with tempfile.TemporaryDirectory(prefix="token-resume-") as d:
        paths = make_corpora(d, a.docs)
        out = {"stoker": stoker_side(paths, a.seq_len, a.samples, a.cuts)}
        out["litdata"] = (run_litdata(a.litdata_python, dict(
            paths=paths, seq_len=a.seq_len, cuts=a.cuts, same_cuts=a.same_cuts))
            if os.path.exists(a.litdata_python)
            else {"not_run": f"no LitData python at {a.litdata_python}"})
    if a.json:
        print(json.dumps(out, indent=1))
        return
    s, lit = out["stoker"], out["litdata"]
    print(f"Resume of a 0.7/0.3 mix of two token corpora, {OLD[0]} ranks x {OLD[1]} workers to "
          f"{NEW[0]} ranks x {NEW[1]} workers, batch {BATCH}, seq_len {a.seq_len}:")
    print(f"  stoker  TokenMix ({s['samples']} samples, {s['steps_per_rank']} steps a rank): "
          f"{s['exact']}/{s['cuts']} cut points give the uninterrupted run's rows from the cut "
          f"on; {s['duplicated_rows']} rows duplicated, {s['missed_rows']} missed")
    if "not_run" in lit:
        print(f"  litdata not measured: {lit['not_run']}")
        return
    print(f"  litdata {lit['version']} CombinedStreamingDataset ({lit['steps_per_rank']} steps a "
          f"rank): {lit['errors']}/{lit['cuts']} cut points refused"
          + (f" ({lit['error']})" if lit["error"] else "")
          + f"; {lit['resumed']} resumed, with {lit['duplicated_rows']} rows duplicated and "
          f"{lit['missed_rows']} missed against its uninterrupted {NEW[0]} x {NEW[1]} epoch")
    st = lit["same_topology"]
    print(f"  litdata on the same topology ({OLD[0]} x {OLD[1]}, its supported case): "
          f"{st['exact']}/{st['cuts']} cut points give the uninterrupted run's rows in its "
          f"order ({st['rows_out_of_order']} rows differ in place); over the epoch "
          f"{st['duplicated_rows']} rows duplicated, {st['missed_rows']} missed; a second "
          f"uninterrupted run {'repeats' if st['rerun_repeats'] else 'does not repeat'} "
          f"the first")


if __name__ == "__main__":
    main()
