"""The masters of a parameter set as columns: the one form every program compiles.

Both manifests (:mod:`mpisync.params.bulk`'s whole-set scan and the per-parameter
:mod:`mpisync.params.manifest`) give their host masters as :class:`HostColumns`, so the plan
(:func:`mpisync.plan.transfers.bulk_plan` over ``sizes``) and each transport's program are
built one way, whichever path read the set. Device masters (only the per-parameter manifest has
them) come as :class:`DeviceColumns`, planned the same way by the device transport.
"""

from __future__ import annotations

import numpy as _np

from .adapters import _byte_view
from .layout import span_buffer

__all__ = ["DeviceColumns", "HostColumns", "bulk_columns", "device_columns", "general_columns"]


class HostColumns:
    """``names`` and, per name, the bytes the plan moves for it (``sizes``, int64) and its
    master, with two side tables: ``spans`` (a run of masters end to end, carried by its lowest
    index: ``index -> (byte view of the run, member indices)``) and ``replicas`` (``index ->
    (destination, source)`` copies into the name's other local replicas).

    A size of 0 is an empty master, a one-replica alias (its representative's bytes fill the same
    memory) or a member of a span other than its carrier. The masters are the scan's arrays with
    their ``held`` buffer list (one list for the whole set, no export per array), or the general
    manifest's byte views (``held`` is None: buckets get copy lists of their own).
    """

    __slots__ = ("names", "sizes", "held", "_masters", "spans", "replicas")

    def __init__(self, names, sizes, held, masters, spans=None, replicas=None):
        self.names = names
        self.sizes = sizes
        self.held = held
        self._masters = masters  # index -> an array or byte view of the master
        self.spans: dict = spans or {}
        self.replicas: dict = replicas or {}

    def __len__(self) -> int:
        return len(self.names)

    def masters(self, first: int, last: int) -> list:
        """The byte views of masters ``first:last`` the plan moves bytes for."""
        sizes = self.sizes
        return [_byte_view(self._masters[i]) for i in range(first, last) if sizes[i]]

    def view(self, index: int) -> memoryview:
        """The bytes a direct transfer of ``index`` moves: its master's, or its run's span."""
        span = self.spans.get(index)
        return span[0] if span is not None else _byte_view(self._masters[index])

    def label(self, index: int) -> tuple:
        """The names a direct transfer of ``index`` carries (for logs and timeout reports)."""
        span = self.spans.get(index)
        return tuple(self.names[i] for i in span[1]) if span is not None else (self.names[index],)

    def fan_out(self, indices) -> tuple:
        """The replica copies of the names ``indices`` stand for (a span: its members')."""
        if not self.replicas:
            return ()
        pairs: list = []
        for index in indices:
            span = self.spans.get(index)
            for member in span[1] if span is not None else (index,):
                pairs.extend(self.replicas.get(member, ()))
        return tuple(pairs)


def bulk_columns(names: list, values: list, sizes: _np.ndarray, held) -> HostColumns:
    """The columns of a whole-set scan: one C-contiguous host replica per name, no two touching."""
    return HostColumns(names, sizes, held, values)


def general_columns(params: list, runs: tuple, aliases: tuple, fusion: int) -> HostColumns:
    """The columns of a per-parameter manifest's host ``params`` under an agreed layout: ``runs``
    of at least ``fusion`` bytes travel as spans, one-replica ``aliases`` not at all."""
    sizes = [p.nbytes for p in params]
    for index, _ in aliases:
        if len(params[index].replicas) == 1:
            sizes[index] = 0
    spans: dict = {}
    for run in runs:
        total = sum(sizes[i] for i in run)
        if total >= fusion:
            first = min(run)  # the run travels where its lowest index would
            # the run's bytes from its lowest address (run[0]: runs are in address order)
            view = memoryview(span_buffer(params[run[0]].master.data, 0, total)).cast("B")
            spans[first] = (view, run)
            for i in run:
                sizes[i] = 0
            sizes[first] = total
    masters = [p.master.data for p in params]
    replicas = {
        i: [(r.data, p.master.data) for r in p.replicas[1:]]
        for i, p in enumerate(params)
        if len(p.replicas) > 1
    }
    names = [p.name for p in params]
    return HostColumns(names, _np.array(sizes, dtype=_np.int64), None, masters, spans, replicas)


class DeviceColumns:
    """``names`` of the device parameters, their masters' bytes (``sizes``, int64) and
    ``masters`` (device array views), with the side table ``replicas`` (``index -> every replica
    of the name, master first``, for names with several)."""

    __slots__ = ("names", "sizes", "masters", "replicas")

    def __init__(self, names: list, sizes, masters: list, replicas: dict):
        self.names, self.sizes, self.masters, self.replicas = names, sizes, masters, replicas

    def __len__(self) -> int:
        return len(self.names)

    def fan_out(self, first: int, last: int) -> list:
        """``(destination, source)`` device copies of masters ``first:last`` into their other
        replicas."""
        replicas, masters = self.replicas, self.masters
        if not replicas:
            return []
        return [
            (r.data, masters[i].data)
            for i in range(first, last)
            if i in replicas
            for r in replicas[i][1:]
        ]

    def devices(self, first: int, last: int) -> tuple:
        """Every device the replicas of ``first:last`` are on, sorted."""
        found = {m.device for m in self.masters[first:last]}
        replicas = self.replicas
        if replicas:
            found.update(r.device for i in range(first, last) if i in replicas for r in replicas[i])
        return tuple(sorted(found))


def device_columns(params: list) -> DeviceColumns:
    """The columns of a per-parameter manifest's device ``params`` (in sorted order)."""
    names, sizes, masters, replicas = [], [], [], {}
    for index, p in enumerate(params):  # one pass: each parameter's object read once
        names.append(p.name)
        sizes.append(p.nbytes)
        masters.append(p.master)
        if len(p.replicas) > 1:
            replicas[index] = p.replicas
    return DeviceColumns(names, _np.array(sizes, dtype=_np.int64), masters, replicas)
