"""stoker: keeps accelerators fed with training data.

``stoker.DataLoader`` takes torch.utils.data.DataLoader's arguments and runs them on a C++
engine: worker threads write each sample straight into its slot of a recycled batch buffer,
batches reach PyTorch as tensors without a copy (DLPack), and with ``device='cuda'`` they
arrive on the GPU, copied on a side stream while the previous batch trains.
"""

import atexit as _atexit
# Before any exit handler of stoker's is registered: exit handlers run last registered first,
# and multiprocessing's (registered when multiprocessing.util is first imported) terminates the
# daemonic worker processes, which must not happen while a loader still reads from them.
import multiprocessing.util as _mp_util  # noqa: F401
import os as _os

from . import _stoker, transforms
from . import logs as _logs
from .cuda import _add_wheel_runtime_hints, build_info, cuda_available
from .datasets.native import (ArrayDataset, ImageFolder, NativeDataset, RecordDataset,
                              SyntheticDataset, pack)
from .distributed import DistributedSampler, split_by_rank, split_by_worker, world
from .loader import DataLoader, Report, SkippedSample
from .loader.elastic import merge_states
from .loader import dataloader as _dataloader
from . import integrations as _integrations
from .remote.actor import RayWorkers, ray_workers
from .tuning import tune
from .shuffle import shuffle_quality, shuffle_report
from .datasets.parquet import ParquetDataset
from .datasets.webdataset import WebDataset
from .datasets.video import VideoClips
from .datasets.tokens import (TokenDataset, TokenMix, plan_token_rows, stratified_blend,
                              token_mix_index)

SampleError = _stoker.SampleError
WorkerError = _stoker.WorkerError
sample_seed = _stoker.sample_seed

__all__ = [
    "ArrayDataset",
    "DataLoader",
    "DistributedSampler",
    "ImageFolder",
    "NativeDataset",
    "ParquetDataset",
    "RayWorkers",
    "RecordDataset",
    "Report",
    "SampleError",
    "SkippedSample",
    "SyntheticDataset",
    "TokenDataset",
    "TokenMix",
    "VideoClips",
    "WebDataset",
    "TextTokens",
    "WebDatasetStream",
    "WorkerError",
    "build_info",
    "cuda_available",
    "merge_states",
    "pack",
    "plan_token_rows",
    "ray_workers",
    "sample_seed",
    "split_by_rank",
    "stratified_blend",
    "token_mix_index",
    "shuffle_quality",
    "shuffle_report",
    "split_by_worker",
    "transforms",
    "tune",
    "world",
]
__version__ = _stoker.version()  # CMakeLists.txt's project() version, the one source

# Before the first search for the CUDA runtime: PyTorch's wheel's runtime, if installed.
_add_wheel_runtime_hints()

# A loader made with a framework imported that substitutes its own loader (Accelerate) installs
# what keeps stoker iterating in it (docs/frameworks.md).
_dataloader.ON_MADE.append(_integrations.install_available)

# The engine's log lines go to the `stoker` logger (logs.py); its last ones (those of the
# loaders closed at exit too) are handed over by at_exit, registered first, so that it runs
# after close_all below (exit handlers run last registered first).
_logs.route()
_atexit.register(_logs.at_exit)
# Workers must stop before the interpreter tears down the objects they use.
_atexit.register(_stoker.close_all)
# A forked child has none of the parent's threads: its copies of the loaders are abandoned
# (never joined), and it makes its own.
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_stoker.abandon_all_after_fork)


def __getattr__(name):
    if name == "WebDatasetStream":  # made on first use: it subclasses torch's IterableDataset
        from .datasets.webdataset_stream import stream_class
        return stream_class()
    if name == "TextTokens":  # likewise
        from .datasets.text_tokens import stream_class as text_stream_class
        return text_stream_class()
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")
