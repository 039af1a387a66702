"""stoker.TokenDataset: language-model token files and token columns (Parquet, Hugging Face
data sets) packed into fixed-length rows, in C++."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from .. import _stoker
from .native import NativeDataset, object_storage_args
from .token_schedule import check_data_state, data_state, schedule_of
from .shards import is_url

_PathLike = Union[str, "os.PathLike[str]"]

FIELDS = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")
IGNORE_LABEL = -100  # torch.nn.functional.cross_entropy's default ignore_index


class TokenDataset(NativeDataset):
    """Rows of ``seq_len`` tokens packed from tokenized documents, read from token files
    (local or in object storage) in C++ (docs/formats.md, "Token data"). Samples are dicts of
    ``input_ids``, ``labels``, ``position_ids``, ``document_ids`` (int64 ``[seq_len]``) and
    ``cu_seqlens`` (int32 ``[max_segments + 1]``).

    ``paths``: one or more Megatron indexed data sets (``format="megatron"``: a prefix, or its
    ``.bin`` or ``.idx``; each of its sequences is a document) or flat token files
    (``format="flat"``: little-endian ``dtype`` tokens, ``"uint16"`` or ``"uint32"``, as
    nanoGPT and OLMo write them, split into documents after each ``eod`` token), Parquet files
    (``format="parquet"``: files, globs or directories; each row of the list-of-integers
    ``column`` is a document, the column decoded with pyarrow into memory) or, instead of paths,
    a Hugging Face ``datasets.Dataset`` or a pyarrow Table / Array (``format="arrow"``: its
    ``column``'s rows, read in place from the Arrow buffers, memory-mapped for a data set's
    cache files, without a Python loop over rows). ``format`` defaults to ``"flat"`` when ``eod``
    is given, ``"parquet"`` for ``.parquet`` files and directories, ``"arrow"`` for those
    objects, else ``"megatron"``.

    ``pack="concat"``: the documents as one stream cut into rows (GPT style, no padding, the
    last partial row dropped); ``"best_fit"``: whole documents into the fullest row that holds
    each, rows padded with ``pad_id``; a document longer than a row is ``long_documents=
    "split"`` into rows or ``"truncate"``d. The documents are taken in an order shuffled by
    ``seed`` (``shuffle_documents=False``: file order). The rows are an index into the files,
    planned at construction (a million documents in well under a second): a new ``seq_len`` or
    seed rewrites nothing.

    ``labels="next"``: ``labels[i]`` is the token after ``input_ids[i]`` in its document (past
    the row's end too, as Megatron reads ``seq_len + 1`` tokens), -100 after a document's last
    token and at padding; ``"same"``: ``input_ids`` with -100 at each segment's first token and
    at padding, for models that shift labels themselves (Hugging Face's).

    Megatron, flat and Parquet files may be in object storage: ``s3://`` and ``http(s)://``
    URLs (for flat and Parquet files also an ``s3://`` prefix ending in ``/``: its objects),
    read by ranges through ``object_cache`` up to ``object_cache_bytes`` as ``stoker.WebDataset``
    reads them (docs/storage.md; ``index_cache`` holds the listings the ranks of a node share).
    A Megatron ``.idx`` is read once, by one GET; a flat object is read whole once to find its
    documents, so large corpora in object storage are better kept as Megatron's pairs.
    ``object_storage()`` counts the traffic.

    ``vocab_size``: a token id at or past it fails its row's read naming the file and document
    (``SampleError``; ``on_error='skip'`` applies). A truncated ``.bin``, an ``.idx`` that does
    not match its ``.bin``, a bad header or an empty document raise here, named likewise; so
    do a missing column, one that is not a list of integers, and a null or empty row (named
    by file or data set, column and row).
    """

    def __init__(self, paths, seq_len: int, *,
                 format: Optional[str] = None, dtype: str = "uint16",
                 eod: Optional[int] = None, vocab_size: Optional[int] = None,
                 pack: str = "concat", long_documents: str = "split", seed: int = 0,
                 shuffle_documents: bool = True, labels: str = "next", pad_id: int = 0,
                 max_segments: Optional[int] = None, column: str = "input_ids",
                 index_cache=None, object_cache=None, object_cache_bytes: int = 10 << 30) -> None:
        self._made_with = ((paths, seq_len), dict(
            format=format, dtype=dtype, eod=eod, vocab_size=vocab_size, pack=pack,
            long_documents=long_documents, seed=seed, shuffle_documents=shuffle_documents,
            labels=labels, pad_id=pad_id, max_segments=max_segments, column=column,
            index_cache=index_cache, object_cache=object_cache,
            object_cache_bytes=object_cache_bytes))
        arrow = _is_arrow(paths)
        if arrow:
            if format not in (None, "arrow"):
                raise ValueError(f"stoker.TokenDataset: {type(paths).__name__} is read as "
                                 f"format='arrow', not {format!r}")
            format, self.paths = "arrow", []
        else:
            if isinstance(paths, (str, os.PathLike)):
                paths = [paths]
            self.paths = [os.fspath(p) for p in paths]
            if format is None:
                if eod is not None:
                    format = "flat"
                elif self.paths and all(p.endswith(".parquet") or os.path.isdir(p)
                                        for p in self.paths):
                    format = "parquet"
                else:
                    format = "megatron"
        if int(seq_len) < 1:
            raise ValueError(f"stoker.TokenDataset: seq_len must be at least 1, not {seq_len}")
        if vocab_size is not None and int(vocab_size) < 1:
            raise ValueError(f"stoker.TokenDataset: vocab_size must be positive, not {vocab_size}")
        self.format, self.seq_len, self.pack, self.column = format, int(seq_len), pack, column
        self._names = FIELDS
        self._as_dict = True
        rows = (str(pack), int(seq_len), str(long_documents), bool(shuffle_documents), int(seed),
                str(labels), int(pad_id), int(max_segments or 0))
        storage = object_storage_args(index_cache, object_cache, object_cache_bytes)
        self._objects = []  # Parquet objects: what object_storage() counts
        if format in ("parquet", "arrow"):
            if format == "parquet":
                from .parquet import expand_files
                from .parquet_objects import ParquetObject

                sources = expand_files(self.paths, storage)
                self.paths = [str(s) for s in sources]
                self._objects = [s for s in sources if isinstance(s, ParquetObject)]
                chunks, owner = _parquet_token_chunks(sources, column)
            else:
                chunks, owner = _arrow_token_chunks(paths, column)
            self._handle = _stoker.token_rows_columns(chunks, owner, int(vocab_size or 0), *rows)
        else:
            self._handle = _stoker.token_rows(
                str(format), self.paths, str(dtype), -1 if eod is None else int(eod),
                int(vocab_size or 0), *rows, *storage)
        self.max_segments = _stoker.token_max_segments(self._handle)

    def object_storage(self) -> dict:
        """Object-storage traffic of the object cache this data set's URLs are read through
        (as ``stoker.WebDataset.object_storage()``); empty when no file is a URL."""
        if self._objects:
            return self._objects[0].counters()
        if not any(is_url(p) for p in self.paths):
            return {}
        return self._handle.object_storage()

    def lengths(self):
        """Every document's length in tokens (numpy uint32), in file order."""
        return _stoker.token_lengths(self._handle)

    def plan(self) -> dict:
        """The rows as an index: numpy arrays ``doc``, ``offset``, ``length`` (one entry per
        piece of a document) and ``row_starts`` (row r is pieces ``row_starts[r]`` to
        ``row_starts[r + 1]``), and ``seq_len``, ``max_pieces``, ``tokens`` (not padding) and
        ``fill`` (the share of the rows' slots that are tokens)."""
        return _stoker.token_rows_plan(self._handle)

    def document_name(self, doc: int) -> str:
        """Document `doc` as errors name it: its file and its number within the file."""
        return _stoker.token_document_name(self._handle, int(doc))

    def sample_name(self, index: int) -> str:
        """Row `index` as errors name it: its first document, and how many more it holds."""
        return self._handle.sample_name(index)


class TokenMix(NativeDataset):
    """Several ``TokenDataset``s mixed by ``weights`` into one map-style data set, in C++
    (docs/formats.md, "Token data": Mixing). Samples are the sources' dicts plus ``source``
    (int64), the index of the source the row came from.

    ``mixing="stratified"``: every ``global_batch`` consecutive samples (one step of all the
    ranks, batch_size x world size, when the loader reads the mix in order: ``shuffle=False``)
    hold each source's share (``weight / sum(weights) * global_batch``) within one row, in an
    order shuffled within the batch; ``"iid"``: each sample's source drawn by weight (the counts
    within the binomial spread). ``samples``: the mix's length (default: the sources' rows
    together). A source that runs out of rows wraps around to its next epoch, its rows in a new
    order seeded by (``seed``, source, epoch), so the mix keeps its weights; ``epochs()`` says
    how many epochs of each source the mix reads. The index is a pure function of the sources'
    row counts, ``weights``, ``mixing``, ``global_batch``, ``samples`` and ``seed``, so a
    DataLoader's ``state_dict()`` resumes it (on another topology too, through
    ``stoker.merge_states``) like any map-style data set.

    Weights that change at given steps: ``weights`` as a schedule, ``{step: weights}`` or a
    list of ``(step, weights)`` pairs, the first at step 0 and the steps increasing, each
    segment's weights holding from its step until the next. A step is a global batch
    (``global_batch`` samples; with ``mixing="iid"`` and no ``global_batch``, a sample). With
    ``"stratified"`` every global batch holds its own step's shares within one row, each
    segment mixed from its own first batch; with ``"iid"`` each sample draws by its step's
    weights. The samples before a step do not depend on the segments from it on, and each
    source's rows go on from those already drawn, so a run resumed (``load_state_dict``) with
    a schedule changed from the step it stands at on continues from the rows it has read; a
    state saved with other weights for a step already read is refused, naming the step.
    ``schedule`` holds it as ``[(step, weights), ...]``; ``weights`` is step 0's.

    Instead of ``weights``, a budget per source: ``epochs=[...]`` (how many epochs of each
    source, fractions allowed: ``round(epochs * len(source))`` rows) or ``tokens=[...]`` (each
    source's tokens to the training loop: ``ceil(tokens / seq_len)`` rows). The weights are then
    those row counts and ``samples`` their sum; with ``mixing="stratified"`` the mix holds
    exactly each source's rows.

    The sources must make rows alike (``seq_len``); those whose ``max_segments`` was not given
    are made again with the largest any source needs, so that ``cu_seqlens`` match.

    The index is built in C++ on every core and, for 65,536 samples or more, kept in the index
    cache (``index_cache``: None or True the default place, False none, else a directory),
    keyed by everything it is made from, so that the next mix of the same sources and options
    (each rank and worker, a later run) loads it; ``index_from_cache()`` says which."""

    def __init__(self, sources: Sequence[TokenDataset], weights: Optional[Sequence[float]] = None,
                 *, mixing: str = "stratified", global_batch: Optional[int] = None,
                 samples: Optional[int] = None, seed: int = 0,
                 epochs: Optional[Sequence[float]] = None,
                 tokens: Optional[Sequence[int]] = None, index_cache=None) -> None:
        sources = list(sources)
        if not sources or not all(isinstance(d, TokenDataset) for d in sources):
            raise TypeError("stoker.TokenMix: sources must be one or more stoker.TokenDataset")
        schedule = schedule_of(weights) if weights is not None else None
        if schedule is None:
            weights, samples = _budget(sources, weights, samples, epochs, tokens)
            schedule = [(0, [float(w) for w in weights])]
        elif epochs is not None or tokens is not None:
            raise ValueError("stoker.TokenMix: give one of weights, epochs or tokens, not a "
                             "weight schedule and a budget")
        self._made_with = ((sources, schedule if len(schedule) > 1 else schedule[0][1]), dict(
            mixing=mixing, global_batch=global_batch, samples=samples, seed=seed,
            index_cache=index_cache))
        if len(schedule) == 1 and len(schedule[0][1]) != len(sources):
            raise ValueError(f"stoker.TokenMix: {len(schedule[0][1])} weights for {len(sources)} "
                             f"sources")
        if mixing == "stratified" and global_batch is None:
            raise ValueError("stoker.TokenMix: stratified mixing needs global_batch (batch_size "
                             "x world size), the batch each source's share is kept in")
        if global_batch is not None and int(global_batch) < 1:
            raise ValueError(f"stoker.TokenMix: global_batch must be positive, not {global_batch}")
        if samples is not None and int(samples) < 1:
            raise ValueError(f"stoker.TokenMix: samples must be positive, not {samples}")
        most = max(d.max_segments for d in sources)
        for i, d in enumerate(sources):
            args, kwargs = d._made_with
            if d.max_segments != most and kwargs.get("max_segments") is None:
                sources[i] = TokenDataset(*args, **dict(kwargs, max_segments=most))
        self.sources = sources
        self.schedule = schedule
        self.weights = list(schedule[0][1])
        self.mixing = mixing
        self.seq_len = sources[0].seq_len
        self.max_segments = sources[0].max_segments
        self._names = FIELDS + ("source",)
        self._as_dict = True
        self._handle = _stoker.token_mix([d._handle for d in sources], schedule, str(mixing),
                                         int(global_batch or 1), int(samples or 0), int(seed),
                                         *object_storage_args(index_cache, None, 0)[:2])

    def index(self):
        """``(source, row)``: numpy arrays, each sample's source and its row in that source."""
        src, row, _ = _stoker.token_mix_index(
            [len(d) for d in self.sources], self.schedule, self.mixing,
            int(self._made_with[1]["global_batch"] or 1), len(self),
            int(self._made_with[1]["seed"]))
        return src, row

    def index_from_cache(self) -> bool:
        """Whether the index was loaded from the index cache (False: built here)."""
        return _stoker.token_mix_from_cache(self._handle)

    def epochs(self):
        """How many epochs of each source the mix reads (numpy uint64; 0: none of it)."""
        return _stoker.token_mix_epochs(self._handle)

    def sample_name(self, index: int) -> str:
        """Sample `index` as errors name it: its source, and the source's row."""
        return self._handle.sample_name(index)

    def _state_of_data(self) -> dict:
        """What a DataLoader's state_dict() keeps of the mix (token_schedule.data_state)."""
        return data_state(self)

    def _check_state_of_data(self, saved: dict, past: int) -> None:
        """A resume's check that the `past` samples read are this mix's too."""
        check_data_state(self, saved, past)


def _budget(sources, weights, samples, epochs, tokens):
    """TokenMix's (weights, samples): as given, or from a budget of epochs or tokens a source
    (each source's rows: the weights; their sum: the samples)."""
    given = [name for name, v in (("weights", weights), ("epochs", epochs), ("tokens", tokens))
             if v is not None]
    if len(given) != 1:
        raise ValueError(f"stoker.TokenMix: give one of weights, epochs or tokens, not "
                         f"{' and '.join(given) or 'none'}")
    if weights is not None:
        return weights, samples
    budget = list(epochs if epochs is not None else tokens)
    if len(budget) != len(sources):
        raise ValueError(f"stoker.TokenMix: {len(budget)} {given[0]} for {len(sources)} sources")
    if any(b < 0 for b in budget):
        raise ValueError(f"stoker.TokenMix: {given[0]} must not be negative: {budget}")
    if samples is not None:
        raise ValueError(f"stoker.TokenMix: samples follows from {given[0]}; do not give both")
    seq_len = sources[0].seq_len
    rows = [round(e * len(d)) for e, d in zip(budget, sources)] if epochs is not None else [
        -(-int(t) // seq_len) for t in budget]
    if sum(rows) == 0:
        raise ValueError(f"stoker.TokenMix: {given[0]} {budget} give no rows")
    return [float(r) for r in rows], sum(rows)


def token_mix_index(source_rows, weights, mixing: str = "stratified", global_batch: int = 1,
                    samples: Optional[int] = None, seed: int = 0, threads: int = 0):
    """TokenMix's index without files: ``(source, row, epochs)`` numpy arrays for sources of
    ``source_rows`` rows, ``weights`` plain or a schedule as TokenMix takes them. A pure
    function of its arguments, built in C++ on ``threads`` (0: every core; the same index on
    any number)."""
    rows = [int(r) for r in source_rows]
    return _stoker.token_mix_index(rows, _schedule(weights), str(mixing),
                                   int(global_batch), int(samples or sum(rows)), int(seed),
                                   int(threads))


def plan_token_rows(lengths, seq_len: int, pack: str = "concat", long_documents: str = "split",
                    seed: int = 0, shuffle_documents: bool = True) -> dict:
    """TokenDataset's plan for documents of these ``lengths`` (a sequence of positive ints),
    without files: the same dict as ``TokenDataset.plan()``. A pure function of its
    arguments."""
    import numpy as np

    return _stoker.token_plan(np.ascontiguousarray(lengths, dtype=np.uint32), str(pack),
                              int(seq_len), str(long_documents), bool(shuffle_documents),
                              int(seed))


def stratified_blend(weights, batch: int, batches: int, seed: int = 0):
    """Which source each sample of a stream mixed by ``weights`` comes from: ``(source,
    draw)``, numpy arrays of ``batch * batches`` entries (``draw``: the sample's number among its
    source's samples so far). Every global batch of ``batch`` samples holds each source's share
    (``weight / sum(weights) * batch``) within one sample, and so does the stream up to each
    batch's end; the order within a batch is shuffled by ``seed``. ``weights`` may be a
    schedule as TokenMix takes it: each batch then holds its step's shares, each segment mixed
    from its first batch. A pure function of its arguments, computed in C++ (docs/formats.md,
    "Token data")."""
    return _stoker.stratified_blend(_schedule(weights), int(batch), int(batches), int(seed))


def _schedule(weights) -> list:
    """Plain weights or a schedule, as the C++ functions take them: [(step, weights), ...]."""
    return schedule_of(weights) or [(0, [float(w) for w in weights])]


def _is_arrow(obj) -> bool:
    """A Hugging Face ``datasets.Dataset`` or a pyarrow Table / (Chunked)Array, not paths."""
    if isinstance(obj, (str, os.PathLike, list, tuple)):
        return False
    kind = type(obj)
    return (kind.__module__.split(".")[0] in ("datasets", "pyarrow")
            or hasattr(obj, "with_format"))


def _list_chunks(pa, array, source: str, first_row: int = 0) -> list:
    """The chunks of a list-of-integers column as (source, first row, values, int64 offsets),
    numpy views of Arrow's buffers (no copy of the token ids)."""
    import numpy as np

    t = array.type
    if not ((pa.types.is_list(t) or pa.types.is_large_list(t))
            and pa.types.is_integer(t.value_type)):
        raise TypeError(f"stoker.TokenDataset: {source} is {t}, not a list of integer token ids")
    out = []
    for chunk in (array.chunks if isinstance(array, pa.ChunkedArray) else [array]):
        if len(chunk) == 0:
            continue
        if chunk.null_count:
            row = first_row + int(np.flatnonzero(chunk.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"stoker.TokenDataset: {source} row {row} is null")
        offsets = chunk.offsets.to_numpy().astype(np.int64)
        values = chunk.values
        if values.null_count:
            at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False)
                                    [offsets[0]:offsets[-1]])[0]) + int(offsets[0])
            row = first_row + int(np.searchsorted(offsets, at, side="right")) - 1
            raise ValueError(f"stoker.TokenDataset: {source} row {row} holds a null token id")
        out.append((source, first_row, values.to_numpy(zero_copy_only=True), offsets))
        first_row += len(chunk)
    return out


def _parquet_token_chunks(files, column: str):
    """A token column of Parquet files (local paths, or objects read by ranges: only the
    column's chunks), decoded with pyarrow into memory (its values as stored: 4 or 8 bytes a
    token), one source per file."""
    from .parquet import _pyarrow
    from .parquet_objects import ParquetObject

    pa, pq = _pyarrow()
    chunks, tables = [], []
    for source in files:
        path = str(source)
        try:
            schema = (source.open(pq) if isinstance(source, ParquetObject)
                      else pq.ParquetFile(path)).schema_arrow
        except Exception as e:  # pyarrow's ArrowInvalid, OSError: not Parquet, truncated
            raise ValueError(f"stoker.TokenDataset: {path}: cannot read its footer: {e}") from e
        if column not in schema.names:
            raise KeyError(f"stoker.TokenDataset: {path} has no column {column!r} (its columns: "
                           f"{', '.join(schema.names)})")
        if isinstance(source, ParquetObject):
            table = source.read(pq, [column])
        else:
            table = pq.read_table(path, columns=[column], memory_map=True)
        chunks += _list_chunks(pa, table.column(column), f"{path} column {column}")
        tables.append(table)
    return chunks, tables


def _arrow_token_chunks(data, column: str):
    """A token column of a Hugging Face data set (its Arrow table, memory-mapped from its cache
    files; an indices mapping from select/shuffle/filter taken through Arrow, not per row) or a
    pyarrow Table / Array."""
    import pyarrow as pa

    if type(data).__name__ in ("DatasetDict", "IterableDataset", "IterableDatasetDict"):
        raise TypeError(f"stoker.TokenDataset: a {type(data).__name__} is not read: pass one "
                        f"split of a data set on disk (a datasets.Dataset, e.g. ds['train'])")
    if hasattr(data, "with_format"):  # datasets.Dataset
        if column not in data.column_names:
            raise KeyError(f"stoker.TokenDataset: the data set has no column {column!r} (its "
                           f"columns: {', '.join(data.column_names)})")
        files = [f["filename"] for f in getattr(data, "cache_files", [])]
        name = files[0] if len(files) == 1 else f"a datasets.Dataset of {len(data)} rows"
        table = data.with_format("arrow", columns=[column])[:]
        array = table.column(column)
    elif isinstance(data, pa.Table):
        if column not in data.column_names:
            raise KeyError(f"stoker.TokenDataset: the table has no column {column!r} (its "
                           f"columns: {', '.join(data.column_names)})")
        name, array = "a pyarrow Table", data.column(column)
    elif isinstance(data, (pa.Array, pa.ChunkedArray)):
        name, array = "a pyarrow array", data
    else:
        raise TypeError(f"stoker.TokenDataset: cannot read tokens from {type(data).__name__}")
    return _list_chunks(pa, array, f"{name} column {column}"), array
