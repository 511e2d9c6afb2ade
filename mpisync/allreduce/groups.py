"""What one all-reduce reduces, as columns: per dtype, the names, master buffers and plan sizes of
its tensors, with side tables for what only some sets have (several replicas of a name, values
staged through a wider dtype).

Both manifests are adapted into this one form: the whole-set scan's arrays
(:func:`mpisync.allreduce.bulk.bulk_groups`: one buffer list, no object per tensor) and the
per-parameter manifest's host masters (:func:`param_groups`: replicas, devices staged to host,
half precision). The plan (:func:`mpisync.allreduce.plan.plan_groups`) and the steps
(:func:`mpisync.allreduce.plan.build_steps`) are built from the groups alone, so ranks whose
sets took different adapters still post the same collectives on the same arena layout.
"""

from __future__ import annotations

import numpy as _np

from . import ops as _ops

__all__ = ["ReduceGroup", "param_groups"]


class ReduceGroup:
    """The tensors of one ``dtype`` (a dtype name), reduced by MPI in ``rdtype``: their ``names``,
    ``masters`` (arrays or byte views) and ``sizes`` (int64: bytes in ``rdtype``, what the plan
    moves), with ``held`` (the masters as one ``BufferList``, or None: buckets get copy lists of
    their own) and two side tables:

    - ``counts``: replicas of each name on this rank (``avg`` divides by ranks times that), or
      None when every name has one;
    - ``replicas``: per name, every replica's bytes, master first, when the group is ``staged``
      (its values are widened into ``rdtype`` to be reduced and narrowed back after), else None.
    """

    __slots__ = ("dtype", "rdtype", "names", "masters", "sizes", "held", "counts", "replicas")

    def __init__(
        self, dtype: str, rdtype, names, masters, sizes, held=None, counts=None, replicas=None
    ):
        self.dtype, self.rdtype = dtype, _np.dtype(rdtype)
        self.names, self.masters, self.sizes, self.held = names, masters, sizes, held
        self.counts: list | None = counts
        self.replicas: list | None = replicas

    @property
    def staged(self) -> bool:
        """Whether the values travel widened (half precision; ``avg`` of narrow integers)."""
        return self.replicas is not None


def param_groups(params: list, op: str) -> list:
    """The groups of ``params`` (host parameters in their agreed order) reduced with ``op``: one per
    dtype, in the order the dtypes first appear among the non-empty parameters, each holding its
    non-empty parameters in order."""
    by_dtype: dict = {}
    for p in params:
        if p.nbytes:
            by_dtype.setdefault(p.master.dtype, []).append(p)
    groups = []
    for dtype, members in by_dtype.items():
        rdtype = _ops.reduce_dtype(dtype, op)
        staged = _ops.is_staged(dtype, op)
        scale = rdtype.itemsize // _ops.itemsize(dtype)
        counts = [len(p.replicas) for p in members]
        groups.append(
            ReduceGroup(
                dtype,
                rdtype,
                [p.name for p in members],
                [p.master.data for p in members],
                _np.array([p.nbytes * scale for p in members], dtype=_np.int64),
                counts=counts if max(counts) > 1 else None,
                replicas=[[r.data for r in p.replicas] for p in members] if staged else None,
            )
        )
    return groups
