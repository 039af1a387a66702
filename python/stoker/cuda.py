"""Where the C++ engine looks for the CUDA runtime, and what it found.

stoker is built without a CUDA toolkit: the engine loads libcudart when a GPU is first asked
for (``device="cuda"``, ``pin_memory=True``, :func:`cuda_available`). Most training machines
get that library from the PyTorch wheel (the ``nvidia-cuda-runtime`` package it depends on),
not from a toolkit, so the package tells the engine where the wheel keeps it, without
importing torch. docs/install.md lists the whole search.
"""

import importlib.util
import os

from . import _stoker


def _wheel_runtime_dirs():
    dirs = []
    try:
        nvidia = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        nvidia = None
    for root in (nvidia.submodule_search_locations or []) if nvidia else []:
        # nvidia-cuda-runtime-cu12 (CUDA 12 wheels), then the CUDA 13 layout.
        dirs += [os.path.join(root, "cuda_runtime", "lib"), os.path.join(root, "cu13", "lib")]
    try:
        torch = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        torch = None
    if torch is not None and torch.submodule_search_locations:
        dirs.append(os.path.join(torch.submodule_search_locations[0], "lib"))
    return [d for d in dirs if os.path.isdir(d)]


def _add_wheel_runtime_hints():
    _stoker.add_cuda_runtime_hints(_wheel_runtime_dirs())


def cuda_available():
    """True if the engine found a CUDA runtime and at least one device answers it."""
    return _stoker.cuda_info()["devices"] > 0


def build_info():
    """This build of stoker and what it found on this machine, as a dict.

    ``version``: the package's (and the C++ library's) version. ``cuda``: the CUDA runtime
    found (``library``: its path, or None; ``runtime_version`` and ``driver_version`` as CUDA
    numbers them, 12040 for 12.4, 0 for none; ``devices``; ``why``: why no device answers,
    None when one does; ``searched``: where it was looked for, in order).
    """
    return {"version": _stoker.version(), "cuda": _stoker.cuda_info()}
