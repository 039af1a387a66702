"""stoker.TextTokens: raw text (JSONL files, Parquet text columns) tokenized on the fly with
Hugging Face ``tokenizers`` in the DataLoader's workers and packed into rows as
``stoker.TokenDataset``'s, with no offline pass (docs/formats.md, "Token data": Raw text)."""

from __future__ import annotations

import json
import mmap
import os
from typing import Optional

import numpy as np

from .. import _stoker
from . import shard_progress
from .native import NativeDataset
from .shards import local_files
from .tokens import FIELDS
from .webdataset_stream import _Pass


def _tokenizer(tokenizer):
    """A ``tokenizers.Tokenizer``: given, loaded from a tokenizer.json path, or the one inside
    a transformers fast tokenizer (its ``backend_tokenizer``)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError("stoker.TextTokens tokenizes with Hugging Face's tokenizers, "
                              "which is not installed: pip install tokenizers") from e
        return Tokenizer.from_file(os.fspath(tokenizer))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if not hasattr(tokenizer, "encode_batch"):
        raise TypeError(f"stoker.TextTokens: tokenizer must be a tokenizers.Tokenizer, a path "
                        f"to its tokenizer.json or a transformers fast tokenizer, not "
                        f"{type(tokenizer).__name__}")
    return tokenizer


def _expand(files, format: Optional[str]) -> list[str]:
    """Files, globs and directories (their *.jsonl, or *.parquet for format='parquet'), in
    the order given, each directory's in name order."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    suffix = ".parquet" if format == "parquet" else ".jsonl"
    out: list[str] = []
    for path in map(os.fspath, files):
        out += local_files(path, suffix, "stoker.TextTokens")
    if not out:
        raise ValueError("stoker.TextTokens: no files")
    return out


def _global_documents(local, global_doc: np.ndarray):
    """A row's document_ids (the block's documents) as the corpus's; -1 stays."""
    is_tensor = not isinstance(local, np.ndarray)
    d = local.numpy() if is_tensor else local
    out = np.where(d < 0, -1, global_doc[np.maximum(d, 0)]).astype(np.int64)
    if is_tensor:
        import torch

        return torch.from_numpy(out)
    return out


class _BlockRows(NativeDataset):
    """One block's packed rows (a TokenRows over the block's tokens, in memory)."""

    def __init__(self, handle) -> None:
        self._handle, self._names, self._as_dict = handle, FIELDS, True
        self._made_with = ((), {})


class _TextTokens(shard_progress.PassEpochs):
    """Raw text tokenized on the fly in the DataLoader's workers and packed into rows of
    ``seq_len`` tokens: an IterableDataset (a stream) whose samples are dicts of
    ``input_ids``, ``labels``, ``position_ids``, ``document_ids`` (int64 ``[seq_len]``) and
    ``cu_seqlens`` (int32 ``[max_segments + 1]``), as ``stoker.TokenDataset``'s.

    ``files``: JSONL files (``format="jsonl"``: one JSON object a line, its ``text_key`` the
    document) or Parquet files (``format="parquet"``: the string column ``text_key``); globs
    and directories as ``stoker.ParquetDataset`` takes them; ``format`` defaults by the first
    file's suffix. ``tokenizer``: a ``tokenizers.Tokenizer``, a path to a ``tokenizer.json``
    or a transformers fast tokenizer; ``eod``: a token id appended to every document (e.g. the
    tokenizer's end-of-text id); ``add_special_tokens`` as the tokenizer's ``encode_batch``.

    **Blocks.** A document's length is known only once it is tokenized, so the corpus is cut
    into blocks (``block_documents`` lines of a JSONL file; a row group of a Parquet file),
    and a block's documents are tokenized together and packed among themselves: ``pack=
    "concat"`` (the block's documents as one stream cut into rows, the last partial row
    dropped) or ``"best_fit"`` (whole documents, rows padded), with ``long_documents``,
    ``labels``, ``pad_id`` and ``vocab_size`` as ``TokenDataset``'s. A block's rows are thus a
    pure function of the block, the tokenizer and those options, whoever reads it. The blocks
    are dealt, in an order shuffled by (``seed``, epoch) (``shuffle=False``: file order), over
    the ranks (``stoker.world()``) and then the DataLoader's workers, as WebDataset shards are;
    ``document_ids`` are the documents' numbers in the corpus (files in order, a document per
    line or row).

    **Resume.** ``state_dict()`` is a shard stream's (stoker/datasets/shard_progress.py: per
    block, the rows handed out), so the DataLoader's ``state_dict()`` resumes on the same
    topology, and ranks' states merged by ``stoker.merge_states`` resume on any other: the
    blocks with rows left are dealt again and each skips the rows already consumed.

    ``max_segments``: the length of ``cu_seqlens`` less one, fixed for the stream (default
    ``seq_len``, which any row fits); a block with a row of more segments raises, naming it.
    In a DataLoader worker the tokenizer runs on the worker's thread alone
    (``TOKENIZERS_PARALLELISM=false`` unless set): the workers are the parallelism.
    """

    def __init__(self, files, tokenizer, seq_len: int, *, format: Optional[str] = None,
                 text_key: str = "text", eod: Optional[int] = None,
                 add_special_tokens: bool = False, pack: str = "concat",
                 long_documents: str = "split", block_documents: int = 256,
                 shuffle: bool = True, seed: int = 0, labels: str = "next", pad_id: int = 0,
                 vocab_size: Optional[int] = None, max_segments: Optional[int] = None) -> None:
        self.files = _expand(files, format)
        if format is None:
            format = "parquet" if self.files[0].endswith(".parquet") else "jsonl"
        if format not in ("jsonl", "parquet"):
            raise ValueError(f"stoker.TextTokens: format must be 'jsonl' or 'parquet', not "
                             f"{format!r}")
        if int(seq_len) < 1:
            raise ValueError(f"stoker.TextTokens: seq_len must be at least 1, not {seq_len}")
        if int(block_documents) < 1:
            raise ValueError(f"stoker.TextTokens: block_documents must be at least 1, not "
                             f"{block_documents}")
        if pack not in ("concat", "best_fit"):
            raise ValueError(f"stoker.TextTokens: pack must be 'concat' or 'best_fit', not "
                             f"{pack!r}")
        self.format, self.text_key, self.seq_len = format, str(text_key), int(seq_len)
        self.tokenizer = _tokenizer(tokenizer)
        self.eod = None if eod is None else int(eod)
        self.add_special_tokens = bool(add_special_tokens)
        self.pack, self.long_documents = pack, long_documents
        self.block_documents = int(block_documents)
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.labels, self.pad_id = labels, int(pad_id)
        self.vocab_size = int(vocab_size or 0)
        self.max_segments = int(max_segments or seq_len)
        self._blocks_cache = None  # per process: (blocks, each file's first document)
        self._starts: dict = {}  # per process: a JSONL file's line offsets
        self._epoch: Optional[int] = None
        self._loader_epoch: Optional[int] = None
        self._next_epoch = 0
        self._resume: Optional[tuple] = None
        self._pass: Optional[_Pass] = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_blocks_cache"] = None  # each process finds the blocks itself
        state["_starts"] = {}
        state["_pass"] = None
        return state

    # ---- blocks ----

    def _line_starts(self, path: str) -> np.ndarray:
        """The byte offsets of a JSONL file's lines (and its end), from a scan for newlines."""
        if path not in self._starts:
            self._starts[path] = self._scan_lines(path)
        return self._starts[path]

    @staticmethod
    def _scan_lines(path: str) -> np.ndarray:
        size = os.path.getsize(path)
        if size == 0:
            return np.zeros(1, np.int64)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            ends = np.flatnonzero(np.frombuffer(m, np.uint8) == 10).astype(np.int64) + 1
        if len(ends) == 0 or ends[-1] != size:
            ends = np.append(ends, size)  # a last line without its newline
        return np.concatenate([[0], ends])

    def _blocks(self):
        """Every block, as (file, first document, end), and each file's first document's
        number in the corpus."""
        if self._blocks_cache is None:
            blocks, first_doc, total = [], [], 0
            for f, path in enumerate(self.files):
                if self.format == "jsonl":
                    n = len(self._line_starts(path)) - 1
                    bounds = list(range(0, n, self.block_documents)) + [n]
                else:
                    from .parquet import _pyarrow

                    _, pq = _pyarrow()
                    meta = pq.ParquetFile(path).metadata
                    bounds = [0]
                    for g in range(meta.num_row_groups):
                        bounds.append(bounds[-1] + meta.row_group(g).num_rows)
                first_doc.append(total)
                total += bounds[-1]
                blocks += [(f, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
            self._blocks_cache = (blocks, first_doc)
        return self._blocks_cache

    def _texts(self, block) -> list:
        f, a, b = block
        path = self.files[f]
        if self.format == "jsonl":
            starts = self._line_starts(path)
            out = []
            with open(path, "rb") as fh:
                fh.seek(int(starts[a]))
                data = fh.read(int(starts[b] - starts[a]))
            base = int(starts[a])
            for i in range(a, b):
                line = data[int(starts[i]) - base:int(starts[i + 1]) - base]
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path} line {i + 1}: not JSON: {e}") from None
                text = obj.get(self.text_key) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    raise ValueError(f"{path} line {i + 1}: no string {self.text_key!r}")
                out.append(text)
            return out
        from .parquet import _pyarrow

        pa, pq = _pyarrow()
        pf = pq.ParquetFile(path)
        if self.text_key not in pf.schema_arrow.names:
            raise KeyError(f"{path} has no column {self.text_key!r} (its columns: "
                           f"{', '.join(pf.schema_arrow.names)})")
        meta, group, row = pf.metadata, 0, 0
        while row < a:
            row += meta.row_group(group).num_rows
            group += 1
        column = pf.read_row_group(group, columns=[self.text_key]).column(self.text_key)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise TypeError(f"{path} column {self.text_key} is {column.type}, not text")
        if column.null_count:
            i = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{path} column {self.text_key} row {a + i} is null")
        return column.to_pylist()

    def _block_rows(self, index: int, block) -> tuple:
        """The block's packed rows (None if it has no document) and which of its texts are
        documents: its texts tokenized, and packed in C++."""
        texts = self._texts(block)
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        ids = [e.ids for e in encode(texts, add_special_tokens=self.add_special_tokens)]
        # a text with no tokens is no document (and gets no eod)
        keep = np.flatnonzero(np.fromiter((len(x) > 0 for x in ids), bool, len(ids)))
        if len(keep) == 0:
            return None, keep
        if self.eod is not None:
            for i in keep:
                ids[i].append(self.eod)
        values = np.concatenate([np.array(ids[i], np.int64) for i in keep])
        lengths = np.fromiter((len(ids[i]) for i in keep), np.int64, len(keep))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        f, a, b = block
        name = f"{self.files[f]} block {index}"
        try:
            handle = _stoker.token_rows_columns(
                [(name, 0, values, offsets)], None, self.vocab_size, self.pack, self.seq_len,
                self.long_documents, False, 0, self.labels, self.pad_id, self.max_segments)
        except ValueError as e:
            raise ValueError(f"stoker.TextTokens: {self.files[f]} documents {a} to {b - 1}: "
                             f"{e}") from None
        return _BlockRows(handle), keep

    # ---- the stream ----

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def _stoker_epoch(self, epoch: int) -> None:
        self._loader_epoch = int(epoch)

    def _identity(self, blocks: int) -> dict:
        # The keys shard_progress.merge_states compares (a block is a shard, a row a sample).
        return {"seed": self.seed, "shards": blocks, "shuffle": 0,
                "shardshuffle": self.shuffle}

    def state_dict(self) -> dict:
        """Where the pass stands: per block, the rows handed out (a shard stream's state,
        which ``stoker.merge_states`` merges over ranks and workers)."""
        if self._pass is not None:
            state = self._pass.state()
            state.pop("replay", None)
            return state
        epoch = self._epoch if self._epoch is not None else self._next_epoch
        return {"kind": shard_progress.KIND, "version": shard_progress.VERSION,
                **self._identity(len(self._blocks()[0])), "epoch": epoch, "merged": False,
                "start": {}, "progress": {}}

    def load_state_dict(self, state: dict) -> None:
        """The next pass resumes `state`: a worker's own, or a merged one (any topology)."""
        shard_progress.check(state, **self._identity(len(self._blocks()[0])))
        self._resume = (int(state["epoch"]), shard_progress.merge([state.get("start")]),
                        shard_progress.merge([state.get("progress")]))

    def __iter__(self):
        blocks, first_doc = self._blocks()
        if self._resume is not None:
            (epoch, start, progress), self._resume = self._resume, None
            self._next_epoch = epoch + 1
        else:
            start, progress, epoch = {}, {}, self._pass_epoch()
        mine, _, in_worker = shard_progress.deal_here(len(blocks), self.shuffle, self.seed,
                                                      epoch, start)
        if in_worker:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        this = self._pass = _Pass(self._identity(len(blocks)), epoch, start, progress, [])
        for s in mine:
            base = this.open(s)
            rows, keep = self._block_rows(s, blocks[s])
            if rows is not None:
                f, a, _ = blocks[s]
                global_doc = first_doc[f] + a + keep
                for ordinal in range(len(rows)):
                    if base.done(ordinal):
                        break
                    this.processed[s] = ordinal + 1
                    if base.consumed(ordinal):
                        continue
                    row = rows[ordinal]
                    row["document_ids"] = _global_documents(row["document_ids"], global_doc)
                    yield row
            this.ended.add(s)


# stoker.TextTokens, a torch IterableDataset made on first use.
stream_class, __getattr__ = shard_progress.iterable_class("TextTokens", _TextTokens, __name__)
