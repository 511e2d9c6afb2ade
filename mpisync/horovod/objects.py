"""The safe encoding of ``broadcast_object`` and ``allgather_object``: tagged JSON, never pickle.

Scalars as :mod:`mpisync.state` sends non-array leaves (exact types, numpy scalars kept); lists,
tuples, sets and frozensets, and dicts with str or int keys; numpy arrays and torch tensors as
dtype, shape and bytes (a tensor arrives on the CPU). Anything else is refused, naming its
type: receiving an object must never run code.
"""

from __future__ import annotations

import base64 as _base64
import json as _json
import sys as _sys

import numpy as _np

from ..state import MAX_DEPTH, _decode_scalar, _encode_scalar, _is_scalar

__all__ = ["encode", "decode"]

_ARRAY_KINDS = "biufc"


def _array(obj):
    if obj.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"a numpy array of dtype {obj.dtype} (only numbers and bools travel)")
    data = _np.ascontiguousarray(obj).tobytes()
    return ["a", [obj.dtype.str, list(obj.shape), _base64.b64encode(data).decode()]]


def _tensor(obj, torch):
    host = obj.detach().to("cpu").contiguous()
    raw = host.reshape(-1).view(torch.uint8).numpy().tobytes() if host.numel() else b""
    dtype = str(host.dtype).removeprefix("torch.")
    return ["T", [dtype, list(host.shape), _base64.b64encode(raw).decode()]]


def _encode(obj, depth: int):
    if depth > MAX_DEPTH:
        raise ValueError(f"the object nests deeper than {MAX_DEPTH} levels (or contains itself)")
    if _is_scalar(obj):
        return ["v", _encode_scalar(obj)]
    if isinstance(obj, list):
        return ["l", [_encode(v, depth + 1) for v in obj]]
    if type(obj) is tuple:
        return ["t", [_encode(v, depth + 1) for v in obj]]
    if type(obj) in (set, frozenset):
        tag = "s" if type(obj) is set else "f"
        return [tag, [_encode(v, depth + 1) for v in obj]]
    if type(obj) is dict:
        bad = [k for k in obj if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            raise TypeError(f"dict keys must be str or int, got {bad[:3]!r}")
        return ["d", [[_encode_scalar(k), _encode(v, depth + 1)] for k, v in obj.items()]]
    if isinstance(obj, _np.ndarray):
        return _array(obj)
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _tensor(obj, torch)
    raise TypeError(
        f"an object of type {type(obj).__module__}.{type(obj).__qualname__}: mpisync sends "
        "numbers, strings, None, lists, tuples, sets, dicts, numpy arrays and torch tensors, never "
        "pickles"
    )


def _decode(doc):
    tag, value = doc
    if tag == "v":
        return _decode_scalar(value)
    if tag == "l":
        return [_decode(v) for v in value]
    if tag == "t":
        return tuple(_decode(v) for v in value)
    if tag in ("s", "f"):
        items = [_decode(v) for v in value]
        return set(items) if tag == "s" else frozenset(items)
    if tag == "d":
        return {_decode_scalar(k): _decode(v) for k, v in value}
    dtype, shape, data = value
    raw = _base64.b64decode(data)
    if tag == "a":
        if _np.dtype(dtype).kind not in _ARRAY_KINDS:
            raise ValueError(f"unexpected array dtype {dtype!r}")
        return _np.frombuffer(raw, dtype=_np.dtype(dtype)).reshape(shape).copy()
    import torch

    kind = getattr(torch, dtype)
    if not isinstance(kind, torch.dtype):
        raise ValueError(f"unexpected tensor dtype {dtype!r}")
    if not raw:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).reshape(shape)


def encode(obj) -> bytes:
    """``obj`` as tagged JSON bytes; :class:`TypeError` or :class:`ValueError` saying what cannot
    travel."""
    return _json.dumps(_encode(obj, 0), separators=(",", ":")).encode()


def decode(data: bytes):
    """The object :func:`encode` encoded."""
    return _decode(_json.loads(data))
