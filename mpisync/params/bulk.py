"""The cold path for a dict of plain numpy arrays or torch CPU tensors: whole-set checks and copies,
no object per tensor.

A general manifest (:mod:`mpisync.params.manifest`) builds a few Python objects per
tensor, which on sets of thousands of small tensors costs more than moving their bytes
(figures: docs/performance.md).
When every value is a C-contiguous ``numpy.ndarray``, or every value a
contiguous torch CPU tensor (a ``state_dict()``, seen through the numpy views
``Tensor.numpy()`` gives), this path takes the set
whole: one sort of the names, one pass over the arrays (``array_list`` of
:mod:`mpisync._runtime.speedups`, in C where built: exact type, contiguity, size,
writability, shape, the dtypes in runs, the states a re-check compares), and each fusion
bucket a part of that one ``BufferList``. Anything else (mixed or GPU arrays, bfloat16, replica
lists, views that sit end to end, a read-only array on a receiver, a bad setting) takes the
general path, which also words the errors.

Both paths compute the same digest (:func:`~mpisync.params.manifest.params_digest`) and give
their host masters in one form (:class:`~mpisync.params.columns.HostColumns`), which the one
plan and each transport's one program are built from: ranks on different paths agree and match
message for message.
"""

from __future__ import annotations

import collections as _collections

import numpy as _np

from .._runtime.speedups import loops
from .adapters import UnsupportedArray, _dtype_name, torch_cpu_views
from .columns import DeviceColumns, HostColumns, bulk_columns, device_columns
from .layout import NO_RUNS, Layout
from .manifest import Manifest, build_manifest, params_digest, settings_digest
from .recheck import snapshot

__all__ = ["BulkManifest", "scan", "shares_or_touches"]

# A torch ``state_dict()`` is an OrderedDict; subclasses that override lookups take the general
# path.
_PLAIN_DICTS = (dict, _collections.OrderedDict)


class BulkManifest:
    """What one rank holds, as whole-set arrays: sorted ``names``, their arrays (``values``), byte
    ``sizes``; the per-parameter :class:`~mpisync.params.manifest.Manifest` is built only when
    something
    needs it (verification, a diagnosis, a channel other than MPI)."""

    leaves_only = True
    errors: tuple = ()
    device_params: tuple = ()
    # every dtype object of ``values`` (held for the re-check: see mpisync.params.recheck)
    dtypes: tuple = ()
    through_torch = False  # ``values`` are numpy views of the torch CPU tensors ``params`` holds
    states = None  # mpisync._speedups.array_states of ``values`` when the dict is in sorted order

    def __init__(
        self,
        params: dict,
        names: list,
        values: list,
        held,
        digest: bytes,
        settings: dict,
        rank: int,
        size: int,
        root: int,
    ):
        self._source = params
        self.names = names
        self.values = values
        self.held = held  # the arrays' buffers, in ``names`` order (mpisync._speedups.BufferList)
        self.sizes = _np.frombuffer(held.lengths(), dtype=_np.int64)
        self.nbytes = held.nbytes  # bytes of one copy of every parameter
        self._params_digest = digest
        # (the settings dict it was computed with, the digest)
        self._digest: tuple[dict | None, bytes] = (None, b"")
        self.settings = settings
        self._where = (rank, size, root)
        self._full: Manifest | None = None

    @property
    def tensors(self) -> int:
        """Parameters in the set."""
        return len(self.names)

    nreplicas = tensors

    def digest(self) -> bytes:
        """The digest :meth:`mpisync.params.manifest.Manifest.digest` gives for the same arrays and
        settings."""
        # a repeated sync keeps its settings dict: computed once
        if self._digest[0] is not self.settings:
            self._digest = (self.settings, settings_digest(self._params_digest, self.settings))
        return self._digest[1]

    def full(self):
        """The per-parameter manifest of the same arrays (built once, on demand)."""
        if self._full is None:
            rank, size, root = self._where
            settings = {k: v for k, v in self.settings.items() if k != "root"}
            self._full = build_manifest(
                self._source, rank=rank, size=size, root=root, settings=settings
            )
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

    @property
    def device_columns(self) -> DeviceColumns:
        """No device masters: the scan takes host arrays only."""
        return device_columns([])

    @property
    def host_nbytes(self) -> int:
        """Bytes of the host masters: every parameter's."""
        return self.nbytes

    @property
    def host_sizes(self) -> _np.ndarray:
        """Bytes of each host master, in sorted order (int64)."""
        return self.sizes

    def replica_bytes(self, to_host=None):
        """Per name, in sorted order: ``(master, other replicas)`` as host buffers (here the
        array, and none)."""
        return ((value, ()) for value in self.values)

    def recorded(self, params) -> tuple:
        """``(values, keys, snapshot)``: ``params`` (the dict this manifest was scanned from) as a
        :class:`~mpisync.plan.prepared.Recognizer` compares it next time."""
        # The scan read the states when the dict is in sorted order: its sorted lists are then the
        # dict's.
        in_order = self.states is not None
        # numpy arrays, or the torch tensors' numpy views (their states are recorded)
        arrays = self.values
        if not in_order and self.through_torch:
            arrays = list(map(dict(zip(self.names, arrays)).__getitem__, params))
        values = tuple(arrays) if in_order and not self.through_torch else tuple(params.values())
        keys = tuple(self.names) if in_order else tuple(params)
        views = arrays if self.through_torch else None
        return values, keys, snapshot(values, dtypes=self.dtypes, views=views, words=self.states)

    def host_layout(self) -> Layout:
        """No runs, no aliases: the scan left sets whose buffers touch to the general manifest."""
        return NO_RUNS

    def host_columns(self, layout, fusion: int) -> HostColumns:
        """The host masters as columns; ``layout`` is the scan's own: no runs, no aliases (it left
        sets whose buffers touch to the general manifest)."""
        return bulk_columns(self.names, self.values, self.sizes, self.held)


def shares_or_touches(lengths: bytes, addresses: bytes) -> bool:
    """Whether some non-empty buffer starts where another ends (the two could travel as one span)
    or shares memory with another (tied weights: one region under two names).

    ``lengths`` and ``addresses`` are native int64 words, one per buffer (``BufferList.lengths()``
    and ``addresses()``).
    """
    sizes = _np.frombuffer(lengths, dtype=_np.int64)
    starts = _np.frombuffer(addresses, dtype=_np.int64)
    if not sizes.all():
        starts, sizes = starts[sizes > 0], sizes[sizes > 0]
    if len(starts) < 2:
        return False
    ends = starts + sizes
    # Each starting past the previous one's end means address order with gaps: no sort needed.
    if (starts[1:] > ends[:-1]).all():
        return False
    # Disjoint regions with gaps between them, and only those, alternate start < end < start ...
    # once the starts and the ends are each sorted.
    return bool((_np.sort(starts)[1:] <= _np.sort(ends)[:-1]).any())


def scan(params, *, rank: int, size: int, root, devices, settings: dict) -> BulkManifest | None:
    """The bulk manifest of ``params``, or ``None`` when it does not qualify (see the module
    doc)."""
    if (
        devices is not None
        or type(params) not in _PLAIN_DICTS
        or not params
        or type(root) is not int
        or not 0 <= root < size
    ):
        return None
    sorted_names = loops.sorted_names(params)
    if sorted_names is None:
        return None  # a name that is not a str: the general path words the error
    names, in_dict_order = sorted_names
    values: list | None
    values = list(params.values()) if in_dict_order else list(map(params.__getitem__, names))
    through_torch = type(values[0]) is not _np.ndarray
    if through_torch and (values := torch_cpu_views(values)) is None:
        return None
    try:
        # Exactly numpy.ndarray, C-contiguous: else the general path says why not. One pass over the
        # arrays' struct fields gives their buffers, dtype runs (heads: every dtype object held) and
        # the states the re-check of the next sync compares.
        held, dtype_runs, states = loops.array_list(values, _np.ndarray)
    except (ValueError, TypeError, BufferError):
        return None
    if (held.readonly and rank != root) or shares_or_touches(held.lengths(), held.addresses()):
        return None  # an error to word, spans or aliases to find: the general path does all three
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
