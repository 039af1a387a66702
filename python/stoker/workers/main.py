"""The loop of a stoker worker process (docs/worker_protocol.md specifies the protocol).

A worker gets its data set (inherited by fork, or pickled for spawn/forkserver) and one end
of a socket; the batch layout comes as a message once the loader learned it from the first
sample a worker read (which a probe sends back whole). It maps the batch slabs it is sent
(memfds) and, for each job, reads its rows through the extension's SampleWriter, which calls
``__getitems__`` or ``__getitem__`` as the threads' reads do (python/src/row_reader.h) and writes
every array leaf straight into its row of the slab. Only the status of
each row, pickled object values (strings, lists, ...) and pickled errors go back.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import select
import signal
import socket
import struct
from typing import Optional

from .. import _stoker
from . import arena as _arena
from . import jobs
from .startup import error_info, start_worker

# The messages' parts (docs/worker_protocol.md's table; tests/python/test_worker_protocol.py
# checks them against it and against the extension's sizes).
_HEADER = struct.Struct("=II")
_JOB = struct.Struct("=QIIII")
_FIELD = struct.Struct("=QQ")
_ROW = struct.Struct("=QQ")
_MAP = struct.Struct("=IIQ")
_DROP = struct.Struct("=I")
_RESULT = struct.Struct("=QII")
_PROBE = struct.Struct("=QQ")
# The numbers are the extension's (python/src/py_workers.h, stoker::python::wire).
_WIRE = _stoker.WORKER_WIRE
_ARGS_SHIFT = _WIRE["kArgsShift"]  # a job's flags: the bytes of its args from here up
_JOB_KIND, _MAP_KIND, _DROP_KIND, _LAYOUT_KIND, _PROBE_KIND, _RESULT_KIND = (
    _WIRE["kinds"][k] for k in ("kJob", "kMap", "kDrop", "kLayout", "kProbe", "kResult"))
_PR_SET_PDEATHSIG = 1


class _Closed(Exception):
    """The parent closed its end (or died)."""


def _recv_exactly(sock: socket.socket, size: int, fds: list) -> bytes:
    chunks = []
    while size > 0:
        data, got, _flags, _addr = socket.recv_fds(sock, size, 4)
        fds.extend(got)
        if not data:
            raise _Closed
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def _die_with_parent(parent_pid: Optional[int]) -> None:
    # Besides EOF on the socket: a worker stuck in __getitem__ never reads it.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:  # it died before prctl
        os._exit(0)


def main(sock: socket.socket, dataset, worker_id: int,
         num_workers: int, base_seed: int, worker_init_fn, close_fds: list,
         parent_pid: Optional[int],
         use_getitems: bool, death_signal: bool, import_torch: bool) -> None:
    # Ctrl-C is the training loop's to handle: it stops the workers through close().
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if death_signal:
        _die_with_parent(parent_pid)
    elif parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)
    for fd in close_fds:  # inherited by fork: other workers' sockets, the slabs' memfds
        if fd != sock.fileno():
            try:
                os.close(fd)
            except OSError:
                pass
    jobs.in_worker_process = True
    if import_torch:  # spawned by a process that uses torch: get_worker_info() must answer
        import torch  # noqa: F401
    # What this process inherited (a fork's copy of the training process's heap, or what a
    # spawned one imported) is never traversed by its collections, as Python's gc docs advise
    # for a process forked without exec: each full collection otherwise walks it all (torch
    # imported: 170k objects) and writes their GC headers, so the pages shared copy-on-write
    # become the worker's own (bench/worker_gc.py: 41 MiB a worker and 385 ms of pauses
    # for a data set caching 200k samples, against 0.4 MiB and 102 ms).
    gc.freeze()
    init_error = start_worker(worker_id, num_workers, base_seed, jobs.user_dataset(dataset),
                              worker_init_fn, own_process=True)
    writer = _stoker.SampleWriter()
    try:
        _serve(sock, dataset, writer, init_error, use_getitems)
    except (_Closed, ConnectionError):  # the loader closed (while a reply was on its way)
        pass
    finally:
        sock.close()


def _serve(sock, dataset, writer, init_error, use_getitems) -> None:
    arenas = _arena.Arenas()
    while True:
        fds: list = []
        kind, size = _HEADER.unpack(_recv_exactly(sock, _HEADER.size, fds))
        payload = _recv_exactly(sock, size, fds) if size else b""
        if kind == _MAP_KIND:
            region, _, nbytes = _MAP.unpack_from(payload)
            writer.map(region, fds.pop(0), nbytes)
        elif kind == _DROP_KIND:
            writer.drop(_DROP.unpack_from(payload)[0])
        elif kind == _LAYOUT_KIND:
            writer.set_layout(*pickle.loads(payload))
        elif kind == _PROBE_KIND:
            sock.sendall(_probe(payload, dataset, init_error, use_getitems, arenas))
        elif kind == _JOB_KIND:
            sock.sendall(_run_job(payload, dataset, writer, init_error, use_getitems, arenas))
            # A stream worker makes its next batches until the next request comes.
            while (isinstance(dataset, jobs.StreamJobs) and dataset.prepare(arenas)
                   and not select.select([sock], [], [], 0)[0]):
                pass
        for fd in fds:  # none expected
            os.close(fd)


def _reply(job: int, status: bytes, blob: bytes, times: bytes = b"") -> bytes:
    body = _RESULT.pack(job, len(status), len(blob)) + status + times + blob
    return _HEADER.pack(_RESULT_KIND, len(body)) + body


def _probe(payload, dataset, init_error, use_getitems, arenas) -> bytes:
    """The sample the parent learns the layout from, sent back whole (or its error): its
    arrays through an arena, as a batch's (torch cannot unpickle some dtypes: uint32, ...)."""
    index, seed = _PROBE.unpack_from(payload)
    try:
        if init_error is not None:
            return _reply(0, b"\x01", pickle.dumps((None, [(0, init_error)])))
        sample = _arena.Packed(arenas.dumps(
            _stoker.SampleWriter.read_sample(dataset, index, seed, use_getitems)))
        return _reply(0, b"\x00", pickle.dumps(([sample], []), protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as e:
        return _reply(0, b"\x01", pickle.dumps((None, [(0, error_info(e))])))


def _run_job(payload, dataset, writer, init_error, use_getitems, arenas) -> bytes:
    job, _, nfields, nrows, flags = _JOB.unpack_from(payload)
    nargs = flags >> _ARGS_SHIFT
    if nfields == 0:
        return _run_call(job, _ROW.unpack_from(payload, _JOB.size)[0],
                         payload[len(payload) - nargs:], dataset, init_error, arenas)
    if nargs:  # a batch job's batches: the extension reads the job without them
        rows = _JOB.size + nfields * _FIELD.size
        dataset.job_batches = dict(zip(
            (_ROW.unpack_from(payload, rows + k * _ROW.size)[0] for k in range(nrows)),
            pickle.loads(payload[len(payload) - nargs:])))
        payload = payload[:len(payload) - nargs]
    if init_error is not None:
        job, _, _, nrows, _ = _JOB.unpack_from(payload)
        status = b"\x01" * nrows
        objects, errors, times = None, [(k, init_error) for k in range(nrows)], b""
    else:
        # The rows are read and written by the extension; only the object values (all rows'
        # in one pickle) and the errors come back through here.
        # `times`: the rows' (start, end) when the job asked for them (the loader is traced)
        job, status, objects, raised, times = writer.run_job(payload, dataset, use_getitems)
        errors = [(k, error_info(e)) for k, e in raised]
    if objects is not None and nargs and arenas is not None:
        # A batch job's rows are whole batches: each pickled apart, its tensors into an arena,
        # so that one that does not pickle fails only its row. (A remote worker has no arenas:
        # its batches are pickled with the reply, below, its tensors too.)
        status, objects = bytearray(status), list(objects)
        for k, values in enumerate(objects):
            if values is None:
                continue
            try:
                objects[k] = arenas.dumps(values)
            except Exception as e:
                status[k], objects[k] = 1, None
                errors.append((k, error_info(e)))
    blob = b""
    if objects is not None or errors:
        # Samples' small values: one pickle per chunk (per row only to find one that fails).
        try:
            blob = pickle.dumps((objects, errors), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            status, objects = bytearray(status), list(objects)
            for k, values in enumerate(objects):
                try:
                    pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as e:
                    status[k], objects[k] = 1, None
                    errors.append((k, error_info(e)))
            blob = pickle.dumps((objects, errors), protocol=pickle.HIGHEST_PROTOCOL)
    return _reply(job, bytes(status), blob, times)


def _run_call(job: int, index: int, args: bytes, dataset, init_error, arenas) -> bytes:
    """A call (ProcessPool.call): its one value is the reply, or its error."""
    try:
        items = dataset.call(index, args, init_error is not None, arenas)
        if items is jobs.INIT_FAILED:
            return _reply(job, b"\x01", pickle.dumps((None, [(0, init_error)])))
        items = [("error", error_info(i)) if isinstance(i, BaseException) else i for i in items]
        blob = pickle.dumps(([pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)], []),
                            protocol=pickle.HIGHEST_PROTOCOL)
        return _reply(job, b"\x00", blob)
    except Exception as e:
        return _reply(job, b"\x01", pickle.dumps((None, [(0, error_info(e))])))
