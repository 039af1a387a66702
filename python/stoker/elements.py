"""The element types stoker batches: numpy's name for a user's dtype, and stored bytes as
the logical type (a tensor with torch loaded). Shared by the native data sets and the loader."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# numpy's name of each element type stoker batches, by how a user may name it.
_NAMES = {
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64",
}


def _torch():
    """torch if the program imported it (stoker never imports it on its own)."""
    return sys.modules.get("torch")


def element_dtype(dtype: Any) -> str:
    """numpy's name for `dtype`: a string, a numpy dtype or a torch.dtype."""
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str) and dtype == "bfloat16":
        name = dtype
    else:
        name = np.dtype(dtype).name
    if name not in _NAMES:
        raise TypeError(f"stoker cannot batch elements of type {dtype}")
    return name


def to_array(array: np.ndarray, logical: str):
    """A numpy array of stored bytes as the logical type: a tensor if torch is loaded."""
    torch = _torch()
    if logical == "bool":
        array = array.view(np.bool_)
    elif logical.startswith("uint") and logical != "uint8":
        array = array.view(np.dtype(logical))
    if torch is not None:
        return torch.from_numpy(array)
    return array
