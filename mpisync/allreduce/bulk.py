"""The bulk adapter of an all-reduce: a dict of bare arrays into reduce groups, no object per
tensor.

The per-parameter manifest (:mod:`mpisync.params.manifest`) and its adapter
(:func:`mpisync.allreduce.groups.param_groups`) build several Python objects per tensor, which on
thousands of small gradients costs far more than reducing their bytes (figures:
docs/allreduce.md). A set that :func:`mpisync.params.bulk.scan` takes (plain numpy arrays or torch
CPU tensors, C-contiguous), whose arrays are all writable and of dtypes that MPI reduces as they
are under ``op``, gets its manifest from that scan and its groups over the scan's one
``BufferList`` (or one ``BufferList`` per dtype, when it holds several). Anything else (half
precision, ``avg`` of narrow integers, replica lists, devices, a read-only array) takes the
general adapter, which also words the errors.

Both adapters give the same digest and the same groups; the one plan
(:mod:`mpisync.allreduce.plan`) then posts the same collectives, in the same order, on the same
fusion-arena layout: ranks whose sets took different adapters still match buffer for buffer, and
the node's shared regions line up.
"""

from __future__ import annotations

import numpy as _np

from .._runtime.speedups import loops
from ..params.adapters import UnsupportedArray, _dtype_name
from ..params.bulk import BulkManifest, scan
from . import ops as _ops
from .groups import ReduceGroup

__all__ = [
    "bulk_groups",
    "dtype_groups",
    "scan_for_reduce",
]


def dtype_groups(manifest: BulkManifest, op: str) -> list | None:
    """``[(dtype, members)]``: the dtypes of ``manifest``'s arrays in the order
    :func:`~mpisync.allreduce.groups.param_groups` takes them (first appearance among non-empty
    arrays, in sorted order), each with the indices of its non-empty arrays (``None``: every
    array, the set holding one dtype); None when MPI does not reduce one of them as it is under
    ``op``."""
    try:
        names = {_dtype_name(dtype) for dtype in manifest.dtypes}
    except UnsupportedArray:
        return None
    if any(_ops.check(name, op) is not None or _ops.is_staged(name, op) for name in names):
        return None
    if len(names) == 1:
        return [(_np.dtype(names.pop()), None)]
    groups: dict = {}
    for index, (nbytes, value) in enumerate(zip(manifest.sizes.tolist(), manifest.values)):
        if nbytes:
            groups.setdefault(_dtype_name(value.dtype), []).append(index)
    return [(_np.dtype(name), members) for name, members in groups.items()]


def scan_for_reduce(
    params, op: str, *, rank: int, size: int, devices, settings: dict
) -> BulkManifest | None:
    """The bulk manifest of ``params`` for an all-reduce with ``op``, or None (the general path
    applies)."""
    if not isinstance(op, str) or op not in _ops.OPS:
        return None
    manifest = scan(params, rank=rank, size=size, root=0, devices=devices, settings=settings)
    if manifest is None or manifest.held.readonly or dtype_groups(manifest, op) is None:
        # every rank writes every array; a read-only one gets its error from the general path
        return None
    return manifest


def bulk_groups(manifest: BulkManifest, op: str) -> list:
    """The groups (:class:`~mpisync.allreduce.groups.ReduceGroup`) of a set
    :func:`scan_for_reduce` took, in the order :func:`~mpisync.allreduce.groups.param_groups`
    gives for the same set: the scan's one buffer list when the set holds one dtype, else one
    buffer list per dtype. No object per tensor."""
    groups = dtype_groups(manifest, op)
    assert groups is not None, "scan_for_reduce admits only sets whose dtypes MPI reduces"
    out = []
    for dtype, members in groups:
        if members is None:
            held, names, values, sizes = (
                manifest.held,
                manifest.names,
                manifest.values,
                manifest.sizes,
            )
        else:
            values = [manifest.values[i] for i in members]
            names = [manifest.names[i] for i in members]
            held, sizes = loops.array_list(values, _np.ndarray)[0], manifest.sizes[members]
        out.append(ReduceGroup(_dtype_name(dtype), dtype, names, values, sizes, held))
    return out
