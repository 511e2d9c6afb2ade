"""The cold path for a dict of plain numpy arrays or torch CPU tensors: whole-set checks and copies,
no object per tensor.

A general manifest (:mod:`mpisync.manifest`) builds a few Python objects per
tensor and its plan and copy lists more, which on sets of thousands of small
tensors costs more than moving their bytes (figures: docs/performance.md).
When every value is a C-contiguous ``numpy.ndarray``, or every value a
contiguous torch CPU tensor (a ``state_dict()``, seen through the numpy views
``Tensor.numpy()`` gives), this path takes the set
whole: one sort of the names, one C pass over the arrays' struct fields
(``mpisync._speedups.array_list``: exact type, contiguity, size, writability,
shape, the dtypes in runs, the states a re-check compares), the plan cut with
``numpy.searchsorted``, and each fusion bucket a part of that one
``BufferList``. Anything else (mixed or GPU arrays, bfloat16, replica lists,
views that sit end to end, a read-only array on a receiver, a bad setting)
takes the general path, which also words the errors.

Both paths compute the same digest (:func:`~mpisync.manifest.params_digest`)
and the same sequence of collectives (``bulk_plan`` equals ``build_plan``), so
ranks on different paths still agree and match message for message.
"""

from __future__ import annotations

import collections as _collections

import numpy as _np
from mpi4py import MPI

from .arrays import UnsupportedArray, _byte_view, _dtype_name, torch_cpu_views
from .manifest import build_manifest, params_digest, settings_digest
from .intranode import Chunk
from .program import Step
from .speedups import speedups as _speedups

__all__ = ["BulkManifest", "bulk_plan", "compile_bulk", "compile_bulk_chunks", "scan"]

# A torch ``state_dict()`` is an OrderedDict; subclasses that override lookups take the general path.
_PLAIN_DICTS = (dict, _collections.OrderedDict)


class BulkManifest:
    """What one rank holds, as whole-set arrays: sorted ``names``, their arrays (``values``), byte
    ``sizes``; the per-parameter :class:`~mpisync.manifest.Manifest` is built only when something
    needs it (verification, a diagnosis, a channel other than MPI)."""

    leaves_only = True
    errors: tuple = ()
    device_params: tuple = ()
    dtypes: tuple = ()  # every dtype object of ``values`` (held for the re-check: see mpisync.recheck)
    through_torch = False  # ``values`` are numpy views of the torch CPU tensors ``params`` holds
    states = None  # mpisync._speedups.array_states of ``values`` when the dict is in sorted order

    def __init__(self, params: dict, names: list, values: list, held, digest: bytes, settings: dict,
                 rank: int, size: int, root: int):
        self._source = params
        self.names = names
        self.values = values
        self.held = held  # the arrays' buffers, in ``names`` order (mpisync._speedups.BufferList)
        self.sizes = _np.frombuffer(held.lengths(), dtype=_np.int64)
        self.nbytes = held.nbytes  # bytes of one copy of every parameter
        self._params_digest = digest
        self._digest = (None, b"")  # (the settings dict it was computed with, the digest)
        self.settings = settings
        self._where = (rank, size, root)
        self._full = None

    @property
    def tensors(self) -> int:
        """Parameters in the set."""
        return len(self.names)

    nreplicas = tensors

    def digest(self) -> bytes:
        """The digest :meth:`mpisync.manifest.Manifest.digest` gives for the same arrays and settings."""
        if self._digest[0] is not self.settings:  # a repeated sync keeps its settings dict: computed once
            self._digest = (self.settings, settings_digest(self._params_digest, self.settings))
        return self._digest[1]

    def full(self):
        """The per-parameter manifest of the same arrays (built once, on demand)."""
        if self._full is None:
            rank, size, root = self._where
            settings = {k: v for k, v in self.settings.items() if k != "root"}
            self._full = build_manifest(self._source, rank=rank, size=size, root=root, settings=settings)
        return self._full

    @property
    def params(self) -> list:
        """The full manifest's parameters (see :meth:`full`)."""
        return self.full().params

    @property
    def host_params(self) -> list:
        """Every parameter: all are in host memory."""
        return self.full().host_params

    def encode(self) -> bytes:
        """The full manifest's JSON, for a diagnosis."""
        return self.full().encode()


def scan(params, *, rank: int, size: int, root, devices, settings: dict) -> BulkManifest | None:
    """The bulk manifest of ``params``, or ``None`` when it does not qualify (see the module doc)."""
    if (_speedups is None or devices is not None or type(params) not in _PLAIN_DICTS or not params
            or type(root) is not int or not 0 <= root < size):
        return None
    sorted_names = _speedups.sorted_names(params)
    if sorted_names is None:
        return None  # a name that is not a str: the general path words the error
    names, in_dict_order = sorted_names
    values = list(params.values()) if in_dict_order else list(map(params.__getitem__, names))
    through_torch = type(values[0]) is not _np.ndarray
    if through_torch and (values := torch_cpu_views(values)) is None:
        return None
    try:
        # Exactly numpy.ndarray, C-contiguous: else the general path says why not. One pass over the
        # arrays' struct fields gives their buffers, dtype runs (heads: every dtype object held) and
        # the states the re-check of the next sync compares.
        held, dtype_runs, states = _speedups.array_list(values, _np.ndarray)
    except (ValueError, TypeError, BufferError):
        return None
    if held.touching() or (held.readonly and rank != root):
        return None  # spans to find, or an error to word: the general path does both
    runs: list = []  # [[dtype name, how many in a row]], as manifest.runs gives them
    try:
        for dtype, count in dtype_runs:
            name = _dtype_name(dtype)  # refuses dtypes holding Python objects
            if runs and runs[-1][0] == name:
                runs[-1][1] += count
            else:
                runs.append([name, count])
    except UnsupportedArray:
        return None
    count = len(names)
    digest = params_digest(names, runs, held.shapes(), [[1, count]], [["h", count]])
    agreed = dict(settings)
    agreed["root"] = root
    manifest = BulkManifest(params, names, values, held, digest, agreed, rank, size, root)
    manifest.dtypes = tuple(dtype for dtype, _ in dtype_runs)
    manifest.through_torch = through_torch
    if in_dict_order:  # the states of the arrays (torch: of their views) in the dict's order
        manifest.states = states
    return manifest


def bulk_plan(sizes: _np.ndarray, fusion_bytes: int, chunk_bytes: int) -> list:
    """``(fused, first, last, nbytes)`` per collective, the sequence :func:`mpisync.plan.build_plan`
    gives for ``sizes`` without runs: a fused bucket holds parameters ``first:last`` (empty ones
    included: they add no bytes); a direct transfer is bytes ``last:last + nbytes`` of parameter
    ``first``. Buckets are cut greedily, each next tensor joining while the bucket stays within
    ``fusion_bytes``, as there."""
    plan: list = []
    ends = _np.cumsum(sizes)
    direct = _np.flatnonzero(sizes >= fusion_bytes) if fusion_bytes > 0 else _np.flatnonzero(sizes > 0)
    start = 0
    for stop in direct.tolist() + [len(sizes)]:
        # Parameters start:stop are all smaller than fusion_bytes: pack them.
        base = int(ends[start - 1]) if start else 0
        while start < stop and int(ends[stop - 1]) > base:
            last = min(int(_np.searchsorted(ends, base + fusion_bytes, side="right")), stop)
            plan.append((True, start, last, int(ends[last - 1]) - base))
            start, base = last, int(ends[last - 1])
        if stop < len(sizes):
            nbytes = int(sizes[stop])
            plan.extend((False, stop, offset, min(chunk_bytes, nbytes - offset))
                        for offset in range(0, nbytes, chunk_bytes))
        start = stop + 1
    return plan


def compile_bulk(manifest: BulkManifest, plan: list, *, receiving: bool, arena, fusion_bytes: int) -> list:
    """The :class:`~mpisync.program.Step` list carrying out ``plan`` on ``manifest``'s arrays: each
    bucket packed (root) or unpacked (receivers) by one ``BufferList``, large tensors sent in place."""
    if not arena.compiled:
        raise ValueError("compile_bulk needs an arena that copies with mpisync._speedups")
    slots = len(arena) // fusion_bytes if fusion_bytes else 0
    names, values = manifest.names, manifest.values
    steps, bucket, fused_steps = [], 0, []
    for fused, first, last, nbytes in plan:
        if fused:
            base = (bucket % slots) * fusion_bytes
            copies = ((base, (), nbytes, manifest.held.part(first, last)),)
            steps.append(Step([arena.view[base:base + nbytes], MPI.BYTE], () if receiving else copies,
                              copies if receiving else (), (), tuple(names[first:last]), True, arena,
                              fused_steps[bucket - slots] if bucket >= slots else -1))
            fused_steps.append(len(steps) - 1)
            bucket += 1
        else:
            view = _byte_view(values[first])[last:last + nbytes]
            steps.append(Step([view, MPI.BYTE], (), (), (), (names[first],), False))
    return steps


def compile_bulk_chunks(manifest: BulkManifest, plan: list, *, receiving: bool, slots: int, slot_bytes: int) -> list:
    """The :class:`~mpisync.intranode.Chunk` list carrying out ``plan`` on ``manifest``'s arrays through
    a shared segment of ``slots`` slots: buckets copied by ``BufferList`` parts, large tensors in pieces."""
    names, values, chunks = manifest.names, manifest.values, []
    for fused, first, last, nbytes in plan:
        offset = (len(chunks) % slots) * slot_bytes
        if fused:
            copies = ((offset, (), nbytes, manifest.held.part(first, last)),)
            chunks.append(Chunk(offset, nbytes, pack=() if receiving else copies,
                                unpack=copies if receiving else (), label=tuple(names[first:last])))
            continue
        view = memoryview(_byte_view(values[first])).cast("B")
        for start in range(last, last + nbytes, slot_bytes):
            piece = view[start:min(start + slot_bytes, last + nbytes)]
            chunks.append(Chunk((len(chunks) % slots) * slot_bytes, piece.nbytes,
                                source=None if receiving else piece, target=piece if receiving else None,
                                label=(names[first],)))
    return chunks
