"""Raw text tokenized on the fly (issue 50): stoker.TextTokens (JSONL read, tokenized with
Hugging Face tokenizers and packed into rows in the DataLoader's worker processes) with 1 and
2 workers, beside the usual torch DataLoader over the JSONL lines with the tokenizer in its
collate_fn (tokenize the batch's texts, concatenate, cut into rows), also with 1 and 2 workers.

The corpus: --docs documents of log-normal word counts (median 200 words, sigma 1.0) over a
vocabulary of 20,000 random lowercase words, one JSON object a line; the tokenizer: a
byte-level BPE of 8,192 tokens trained on the corpus's first 2,000 documents (tokenizers'
BpeTrainer), so that tokenizing costs what a GPT-2-style tokenizer's does. Rows of --seq-len
tokens, batches of --batch rows, one epoch per run; tokens/s counts the rows' tokens from the
first batch to the end of the epoch (worker start-up excluded). Every worker's tokenizer is
single-threaded (TOKENIZERS_PARALLELISM=false): the workers are the parallelism, so the 1 to 2
worker ratio is the scaling. Every figure is the median of --rounds rounds.

    python bench/text_token_bench.py [--smoke] [--docs N] [--rounds R] [--seq-len L]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np  # noqa: E402


def make_corpus(d, docs, seed=0):
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, int(n))) for n in rng.integers(2, 10, 20_000)]
    counts = np.maximum(1, np.round(rng.lognormal(np.log(200), 1.0, docs))).astype(int)
    path = os.path.join(d, "corpus.jsonl")
    texts = []
    with open(path, "w") as f:
        for n in counts:
            text = " ".join(words[i] for i in rng.integers(0, len(words), n))
            texts.append(text)
            f.write(json.dumps({"text": text}) + "\n")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  show_progress=False)
    tok.train_from_iterator(texts[:2000], trainer)
    tok_path = os.path.join(d, "tokenizer.json")
    tok.save(tok_path)
    return path, tok_path


def cpu_seconds(pids):
    """The CPU time (user + system) the processes `pids` have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def timed(loader, seq_len, pids_of):
    """tokens/s from the first batch to the end of the epoch, the rows, and the cores the
    workers got meanwhile (their CPU seconds over the wall-clock seconds)."""
    it = iter(loader)
    first = next(it)
    pids = pids_of(loader, it)
    rows = len(first["input_ids"])
    cpu0, start = cpu_seconds(pids), time.perf_counter()
    cpu, cpu_wall = cpu0, 0.0
    for batch in it:
        rows += len(batch["input_ids"])
        try:  # read while the workers live (torch's end with the epoch)
            cpu, cpu_wall = cpu_seconds(pids), time.perf_counter() - start
        except FileNotFoundError:
            pass
    wall = time.perf_counter() - start
    cores = (cpu - cpu0) / cpu_wall if cpu_wall else float("nan")
    return (rows - len(first["input_ids"])) * seq_len / wall, rows, cores


class Lines:
    """The usual map-style data set over a JSONL file: a line's text per index."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.offsets = [0]
            for line in f:
                self.offsets.append(self.offsets[-1] + len(line))
        self.path = path
        self.f = None

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if self.f is None:
            self.f = open(self.path, "rb")
        self.f.seek(self.offsets[i])
        return json.loads(self.f.read(self.offsets[i + 1] - self.offsets[i]))["text"]


class TokenizeCollate:
    """Tokenize a batch of texts, concatenate them (each ending in EOD), cut into rows."""

    def __init__(self, tok_path, seq_len, eod):
        self.tok_path, self.seq_len, self.eod, self.tok = tok_path, seq_len, eod, None

    def __call__(self, texts):
        import torch
        from tokenizers import Tokenizer

        if self.tok is None:
            self.tok = Tokenizer.from_file(self.tok_path)
        ids = []
        for e in self.tok.encode_batch(texts, add_special_tokens=False):
            ids += e.ids
            ids.append(self.eod)
        n = len(ids) // self.seq_len * self.seq_len
        x = torch.tensor(ids[:n], dtype=torch.int64).view(-1, self.seq_len)
        return {"input_ids": x, "labels": x}


def stoker_run(path, tok_path, seq_len, batch, workers):
    import stoker
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    ds = stoker.TextTokens(path, tok, seq_len, eod=tok.token_to_id("<|endoftext|>"),
                           block_documents=256, seed=0, max_segments=64)
    loader = stoker.DataLoader(ds, batch_size=batch, num_workers=workers,
                               worker_type="process")
    try:
        return timed(loader, seq_len, lambda loader, it: loader.stats()["worker_pids"])
    finally:
        loader.close()


def torch_run(path, tok_path, seq_len, docs_per_batch, workers):
    import torch
    from tokenizers import Tokenizer

    eod = Tokenizer.from_file(tok_path).token_to_id("<|endoftext|>")
    loader = torch.utils.data.DataLoader(Lines(path), batch_size=docs_per_batch,
                                         num_workers=workers,
                                         collate_fn=TokenizeCollate(tok_path, seq_len, eod))
    return timed(loader, seq_len, lambda loader, it: [w.pid for w in it._workers])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run that checks the harness")
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8, help="rows per batch (stoker)")
    ap.add_argument("--torch-docs", type=int, default=64,
                    help="documents per batch of the torch baseline's collate_fn")
    args = ap.parse_args()
    if args.smoke:
        args.docs, args.rounds, args.seq_len = 400, 1, 256
    with tempfile.TemporaryDirectory() as d:
        path, tok_path = make_corpus(d, args.docs)
        results = {}
        for name, run, size in (("stoker.TextTokens", stoker_run, args.batch),
                                ("torch DataLoader + tokenizer collate", torch_run,
                                 args.torch_docs)):
            for workers in (1, 2):
                rates, cores = [], []
                for _ in range(args.rounds):
                    rate, rows, got = run(path, tok_path, args.seq_len, size, workers)
                    rates.append(rate)
                    cores.append(got)
                results[(name, workers)] = statistics.median(rates)
                per_core = statistics.median(r / c for r, c in zip(rates, cores))
                # the machine's load over the last minute: others' work shares the cores, so
                # the cores the workers got and the tokens per worker CPU second are printed
                print(f"{name:38s} {workers} worker(s): {results[(name, workers)] / 1e6:6.2f}M "
                      f"tokens/s ({rows} rows of {args.seq_len}; rounds: "
                      f"{', '.join(f'{r / 1e6:.2f}M' for r in rates)}); the workers got "
                      f"{statistics.median(cores):.2f} cores, {per_core / 1e6:.2f}M tokens per "
                      f"worker CPU second; load average {os.getloadavg()[0]:.1f} on "
                      f"{os.cpu_count()} cores", flush=True)
        names = ("stoker.TextTokens", "torch DataLoader + tokenizer collate")
        for name in names:
            print(f"{name}: 2 workers / 1 worker = "
                  f"{results[(name, 2)] / results[(name, 1)]:.2f}x")
        for w in (1, 2):
            print(f"stoker / torch at {w} worker(s): "
                  f"{results[(names[0], w)] / results[(names[1], w)]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
