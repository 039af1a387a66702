"""From a delivered batch (one buffer per field) to what the training loop gets: tensors (or
numpy arrays without torch) arranged like torch's default_collate arranges them."""

from __future__ import annotations

import sys
from typing import Callable

from ..elements import to_array


def _torch():
    """torch if the program imported it (stoker never imports it on its own)."""
    return sys.modules.get("torch")


def batch_builder(structure, collate_fn: Callable | None) -> Callable:
    """A function (arrays, objects) -> the batch as the training loop sees it.

    `structure` is the layout PyDataset.structure() (or a native data set) describes; arrays
    are the batch's field arrays in field order, objects its object values, one list per slot.
    Containers come out as torch's default_collate makes them: tuples become lists, lists and
    namedtuples and mappings keep their type; strings are a tuple per column inside a tuple or
    list (default_collate transposes those with zip) and a list elsewhere.
    With a collate_fn, the samples arrive whole (one object slot) and it makes the batch.
    """
    if collate_fn is not None:
        return lambda arrays, objects: collate_fn(objects[0])

    def build(node, in_sequence=False) -> Callable:
        kind = node[0]
        if kind == "array":
            field = node[1]
            return lambda arrays, objects: arrays[field]
        if kind == "object":
            slot = node[1]
            if in_sequence:
                return lambda arrays, objects: tuple(objects[slot])
            return lambda arrays, objects: objects[slot]
        if kind == "seq":
            typ, children = node[1], [build(c, True) for c in node[2]]
            if hasattr(typ, "_fields"):  # a namedtuple keeps its type
                return lambda arrays, objects: typ(*(c(arrays, objects) for c in children))
            if issubclass(typ, tuple) or typ is list:
                return lambda arrays, objects: [c(arrays, objects) for c in children]

            def sequence(arrays, objects):
                values = [c(arrays, objects) for c in children]
                try:
                    return typ(values)  # a list subclass keeps its type
                except TypeError:
                    return values

            return sequence
        typ, keys, children = node[1], node[2], [build(c) for c in node[3]]

        def mapping(arrays, objects):
            values = {k: c(arrays, objects) for k, c in zip(keys, children)}
            try:
                return values if typ is dict else typ(values)
            except TypeError:
                return values

        return mapping

    return build(structure)


def converter(element_types: list[str], on_device: bool) -> tuple[bool, Callable]:
    """(whether the batch's fields are to be taken as numpy arrays rather than DLPack capsules
    (RawBatch.take), a function of those fields -> the batch's arrays): tensors through DLPack
    (zero-copy) when torch is loaded, numpy arrays otherwise."""
    torch = _torch()
    if torch is None:
        if on_device:
            raise RuntimeError("stoker: batches on a device need torch")

        def numpy_arrays(fields):
            return [to_array(a, t) for a, t in zip(fields, element_types)]

        return True, numpy_arrays
    from_dlpack = torch.from_dlpack
    views = [
        getattr(torch, t) if t == "bool" or (t.startswith("uint") and t != "uint8") else None
        for t in element_types
    ]
    if not any(v is not None for v in views):
        return False, lambda fields: [from_dlpack(c) for c in fields]

    def tensors(fields):
        out = [from_dlpack(c) for c in fields]
        return [t if v is None else t.view(v) for t, v in zip(out, views)]

    return False, tensors
