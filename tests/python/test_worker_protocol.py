"""The worker protocol: both ends (the extension's, python/src/py_workers.*, and the worker's,
python/stoker/workers/main.py) checked against docs/worker_protocol.md, read from its tables."""

import mmap
import os
import pathlib
import re
import struct
import sys

import numpy as np
import pytest

from stoker import _stoker
from stoker.workers import main as worker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
from worker_harness import writer_with_layout  # noqa: E402

SPEC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "worker_protocol.md"

# The worker's struct for each part of the spec's message table.
WORKER_STRUCTS = {"header": worker._HEADER, "kMap": worker._MAP, "kDrop": worker._DROP,
                  "kProbe": worker._PROBE, "kJob": worker._JOB, "job field": worker._FIELD,
                  "job row": worker._ROW, "kResult": worker._RESULT}


def _spec():
    """(parts: {name: (kind or None, struct format or None)}, flags: {name: value})."""
    parts, flags = {}, {}
    for line in SPEC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or set(cells[0]) <= set("-: "):
            continue
        if len(cells) == 5 and cells[0] != "part":
            fmt = re.fullmatch(r"`(=[A-Za-z]+)`", cells[3])
            parts[cells[0]] = (int(cells[1]) if cells[1] else None, fmt and fmt.group(1))
        elif len(cells) == 3 and cells[0] != "flag":
            flags[cells[0]] = int(cells[1])
    return parts, flags


def test_the_spec_has_every_part():
    parts, flags = _spec()
    assert set(parts) == {"header", "kMap", "kDrop", "kLayout", "kProbe", "kJob", "job field",
                          "job row", "kResult", "result time"}
    assert set(flags) == {"kTimeRows", "kArgsShift"}


def test_the_extension_agrees_with_the_spec():
    parts, flags = _spec()
    wire = _stoker.WORKER_WIRE
    for name, (kind, fmt) in parts.items():
        if kind is not None:
            assert wire["kinds"][name] == kind, name
        if fmt is not None:
            assert wire["bytes"][name] == struct.calcsize(fmt), name
    assert set(wire["kinds"]) == {n for n, (k, _) in parts.items() if k is not None}
    assert set(wire["bytes"]) == {n for n, (_, f) in parts.items() if f is not None}
    for name, value in flags.items():
        assert wire[name] == value, name


def test_the_worker_agrees_with_the_spec():
    parts, flags = _spec()
    for name, st in WORKER_STRUCTS.items():
        assert st.format == parts[name][1], name
    kinds = {"kJob": worker._JOB_KIND, "kMap": worker._MAP_KIND, "kDrop": worker._DROP_KIND,
             "kLayout": worker._LAYOUT_KIND, "kProbe": worker._PROBE_KIND,
             "kResult": worker._RESULT_KIND}
    assert kinds == {n: k for n, (k, _) in parts.items() if k is not None}
    assert worker._ARGS_SHIFT == flags["kArgsShift"]
    # A reply as the worker sends it, read with the spec's parts.
    message = worker._reply(7, b"\x00\x01", b"blob")
    kind, size = struct.unpack_from(parts["header"][1], message)
    assert (kind, size) == (parts["kResult"][0], len(message) - struct.calcsize("=II"))
    body = message[struct.calcsize(parts["header"][1]):]
    job, rows, blob = struct.unpack_from(parts["kResult"][1], body)
    fixed = struct.calcsize(parts["kResult"][1])
    assert (job, rows, blob) == (7, 2, 4)
    assert body[fixed:fixed + rows] == b"\x00\x01" and body[fixed + rows:] == b"blob"


class _Samples:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(3, i, dtype=np.int32), np.float64(i) / 2


@pytest.mark.parametrize("timed", [False, True])
def test_a_job_packed_from_the_spec_is_run_by_the_extension(timed):
    """The extension's worker half (SampleWriter.run_job) reads a kJob laid out as the spec
    says, writes each row where its job field says, and its times as the spec's parts."""
    parts, flags = _spec()
    data = _Samples()
    writer, row_bytes = writer_with_layout(data, 4)
    indices, region, gap = [5, 9, 2], 3, 64
    offsets, at = [], gap
    for b in row_bytes:
        offsets.append(at)
        at += len(indices) * b + gap
    fd = os.memfd_create("stoker-protocol-test")
    os.ftruncate(fd, at)
    view = mmap.mmap(fd, at)
    writer.map(region, os.dup(fd), at)
    os.close(fd)
    ints = halves = None
    try:
        flag = flags["kTimeRows"] if timed else 0
        job = struct.pack(parts["kJob"][1], 11, region, len(row_bytes), len(indices), flag)
        for offset, b in zip(offsets, row_bytes):
            job += struct.pack(parts["job field"][1], offset, b)
        for i in indices:
            job += struct.pack(parts["job row"][1], i, 1000 + i)
        job_id, status, objects, errors, times = writer.run_job(job, data, False)
        assert job_id == 11 and bytes(status) == b"\x00" * len(indices) and not errors
        assert objects is None
        assert len(times) == (len(indices) * struct.calcsize(parts["result time"][1])
                              if timed else 0)
        ints = np.frombuffer(view, np.int32, len(indices) * 3, offsets[0]).reshape(-1, 3)
        halves = np.frombuffer(view, np.float64, len(indices), offsets[1])
        np.testing.assert_array_equal(ints, [[i] * 3 for i in indices])
        np.testing.assert_array_equal(halves, [i / 2 for i in indices])
        # One byte short of the rows the spec says: not a job.
        with pytest.raises(ValueError, match="bad job"):
            writer.run_job(job[:-1], data, False)
    finally:
        writer.drop(region)
        del ints, halves
        view.close()


def _reply_fields(struct_name: str) -> list:
    """The fields of the spec's table whose first header cell is `struct_name`."""
    fields, inside = [], False
    for line in SPEC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            inside = False
        elif cells[0] == struct_name:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            fields.append(cells[0])
    return fields


def test_replies_are_the_named_structs_of_the_spec_and_the_extension_reads_them_by_name():
    from stoker.remote.pool import RemoteReply
    from stoker.workers.processes import DecodedReply

    src = pathlib.Path(__file__).resolve().parents[2] / "python" / "src"
    read = set(re.findall(r'attr\("(\w+)"\)', (src / "py_executors.cc").read_text()
                          + (src / "py_workers.cc").read_text()))
    for struct_type in (RemoteReply, DecodedReply):
        fields = _reply_fields(struct_type.__name__)
        assert list(struct_type._fields) == fields
    assert {"status", "rows", "objects", "failures", "wait_s", "read_s", "idle_s"} <= read
    # No reply is taken apart by position.
    for name in ("py_executors.cc", "py_workers.cc", "row_reader.cc"):
        assert not re.search(r"(reply|decoded|value)\w*\[", (src / name).read_text()), name
