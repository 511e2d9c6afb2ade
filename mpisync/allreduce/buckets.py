"""Gradients reduced in fused buckets whose all-reduces start during backward: the machinery
behind :class:`mpisync.GradOverlap` and ``mpisync.horovod.DistributedOptimizer``'s overlap.

The gradients are laid, in reverse registration order (the order backward produces them), into
buckets of at most ``fusion_bytes`` each (a larger gradient has a bucket of its own), one dtype a
bucket. Torch's post-accumulate-grad hook of a parameter copies its gradient into its bucket on
the last backward pass of a step; a bucket whose every gradient is in starts its ``Iallreduce``
at once, provided every bucket before it has started, so that every rank posts the buckets in
the same order on mpisync's duplicate of the communicator. :meth:`Buckets.finish` copies what
no hook gave (a parameter not in the graph, a ``None`` gradient), starts the rest and waits.

The arithmetic is :class:`~mpisync.GradSync`'s: half precision travels widened to ``float32``
and is rounded once after the division, ``avg`` is the sum divided by the ranks' count. One flag
per gradient rides at the end of its bucket: whether the rank had a gradient, so a gradient
that no rank has stays ``None``. Each element is summed by the same ``MPI_SUM`` over the same
ranks whatever the bucket boundaries; with three ranks or more the order of the additions is
the MPI library's for the bucket's size, which rounding can tell apart.

Bucket sizes: ``fusion_bytes`` (the argument or ``MPISYNC_FUSION_BYTES``) caps every bucket;
where neither is given, the buckets are ``DistributedDataParallel``'s (:data:`DEFAULT_BUCKETS`).

The first :meth:`Buckets.finish` lays out the buckets from the gradients it sees and checks,
collectively, that every rank laid out the same; hooks start buckets from the second step on.
"""

from __future__ import annotations

import json as _json
import weakref as _weakref
import zlib as _zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as _np
from mpi4py import MPI

from .. import config as _config
from .._runtime.clock import Deadline
from .._runtime.keepalive import keep_alive
from .._runtime.lifecycle import check_comm, duplicate, free_comm, wait_duplicate
from .._runtime.ring import Expired
from .._runtime.timeouts import timed_out
from ..errors import InvalidParamError, ManifestMismatchError, SyncError
from . import ops as _ops

__all__ = ["Buckets", "DEFAULT_BUCKETS", "bucket_caps", "densified"]

#: The bucket caps where no ``fusion_bytes`` is given: torch DDP's, the first bucket (the last
#: gradients, which backward produces first) at most 1 MiB so that communication starts early,
#: each other at most 25 MiB (``bucket_cap_mb``); fewer, larger messages than mpisync's
#: ``fusion_bytes`` default, which is sized for broadcasts of parameter sets.
DEFAULT_BUCKETS = (1 << 20, 25 << 20)

_STAGED = {"float16": "float16", "bfloat16": "bfloat16"}
_TOO_MANY = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)

# pack(index) -> (tensor to send, this rank has a gradient), or None: not bucketed
Pack = Callable[[int], "tuple[Any, bool] | None"]
# unpack(index, reduced tensor): called where some rank had a gradient
Unpack = Callable[[int, Any], None]


def densified(sparse):
    """``sparse.to_dense()``, summed by index (``to_dense`` of a hybrid sparse tensor, as an
    embedding's gradient is, gives zeros in some torch builds)."""
    import torch

    dense = torch.zeros(sparse.shape, dtype=sparse.dtype, device=sparse.device)
    indices = sparse._indices()
    return dense.index_put_(tuple(indices), sparse._values(), accumulate=True)


def bucket_caps(setting: _config.Setting[int]) -> tuple[int, int]:
    """``(first bucket's cap, every other's)`` from the resolved ``fusion_bytes`` setting: its
    value for both where the argument or ``MPISYNC_FUSION_BYTES`` gave it, else
    :data:`DEFAULT_BUCKETS`."""
    return DEFAULT_BUCKETS if setting.source == "built-in" else (setting.value, setting.value)


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class _Bucket:
    """One fused buffer: its slots ``(index, offset, numel, shape, dtype name)``, the staging
    array (values then one flag per slot) and its request once started."""

    __slots__ = ("slots", "array", "tensor", "ready", "request")

    def __init__(self, slots: list, rdtype: _np.dtype):
        import torch

        self.slots = slots
        values = sum(numel for _, _, numel, _, _ in slots)
        self.array = _np.zeros(values + len(slots), rdtype)
        self.tensor = torch.from_numpy(self.array)
        self.ready = 0
        self.request: MPI.Request | None = None

    def put(self, k: int, tensor, has: bool) -> None:
        """Copy slot ``k``'s tensor into the buffer (widened where staged) and set its flag."""
        _, offset, numel, _, _ = self.slots[k]
        self.tensor[offset : offset + numel].copy_(tensor.reshape(-1))
        self.array[len(self.array) - len(self.slots) + k] = 1 if has else 0

    def results(self, op: str, size: int):
        """``(index, reduced tensor)`` of each slot some rank had a gradient for, after the
        division (``avg``) and the rounding back of half precision."""
        import torch

        if op == "avg":
            _ops.divide(self.array, size)
        flags = self.array[len(self.array) - len(self.slots) :]
        for k, (index, offset, numel, shape, dtype) in enumerate(self.slots):
            if not flags[k].real > 0:
                continue
            values = self.array[offset : offset + numel]
            if dtype in _STAGED:
                out = torch.empty(numel, dtype=getattr(torch, dtype))
                _ops.narrow_into(out.view(torch.uint8).numpy(), values, dtype)
            else:
                out = torch.from_numpy(values)
            yield index, out.view(shape)


def _layout(packed: Sequence, caps: tuple[int, int]) -> list:
    """The buckets of the tensors ``packed`` (``None``: not bucketed), in reverse order, the
    first at most ``caps[0]`` bytes, the others ``caps[1]``."""
    buckets: list = []
    slots: list = []
    rdtype = _np.dtype(_np.float32)  # the current bucket's, once it has a slot
    nbytes = 0
    for index in reversed(range(len(packed))):
        if packed[index] is None:
            continue
        tensor = packed[index][0]
        dtype = _dtype_name(tensor)
        problem = _ops.check(dtype, "sum")
        if problem is not None:
            raise InvalidParamError(f"mpisync: gradient {index}: {problem}")
        wanted = _ops.reduce_dtype(dtype)
        size = tensor.numel() * wanted.itemsize
        if slots and (wanted != rdtype or nbytes + size > caps[1 if buckets else 0]):
            buckets.append(_Bucket(slots, rdtype))
            slots, nbytes = [], 0
        offset = sum(numel for _, _, numel, _, _ in slots)
        slots.append((index, offset, tensor.numel(), tuple(tensor.shape), dtype))
        rdtype, nbytes = wanted, nbytes + size
    if slots:
        buckets.append(_Bucket(slots, rdtype))
    return buckets


class Buckets:
    """The overlapped all-reduce of ``count`` gradients over ``comm`` with ``op`` (``"sum"`` or
    ``"avg"``), ``passes`` backward passes a step, buckets capped by ``caps``
    (:func:`bucket_caps`). ``pack``/``unpack`` are the caller's (see the module's docstring)."""

    def __init__(self, comm, count: int, pack: Pack, unpack: Unpack, *, op: str,
                 caps: tuple[int, int], timeout: float | None, passes: int = 1):  # fmt: skip
        self.user_comm, self.count, self.pack, self.unpack = comm, count, pack, unpack
        self.op, self.caps, self.timeout, self.passes = op, caps, timeout, passes
        self.comm: MPI.Intracomm | None = None
        self.buckets: list | None = None  # laid out by the first finish()
        self.where: dict = {}  # gradient index -> (bucket, slot)
        self.seen = [0] * count  # hooks fired this step, per gradient
        self.next = 0  # the first bucket not started
        self.pending = 0  # gradients not yet in a bucket this step
        self.too_many = False
        self.early = 0  # buckets started (over all steps) while a gradient was still to come
        self.hooks: list = []
        self.broken = False

    def attach(self, params: Sequence) -> None:
        """Register the hook on each of ``params`` (index order), holding this object weakly."""
        ref = _weakref.ref(self)
        for index, p in enumerate(params):
            if p.requires_grad:
                self.hooks.append(p.register_post_accumulate_grad_hook(_hook(ref, index)))

    def close(self) -> None:
        """Remove the hooks and free the communicator (requests in flight are kept alive)."""
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        started = [b for b in self.buckets or () if b.request is not None]
        if started or self.broken:
            keep_alive(self.comm, *started)
        else:
            free_comm(self.comm)
        self.comm, self.buckets = None, None

    def ready(self, index: int) -> None:
        """A hook: gradient ``index`` is accumulated; on its last pass, bucket it and start the
        buckets that are full, then let MPI progress the ones in flight."""
        if self.buckets is None:  # the first step is reduced by finish() alone
            return
        self.seen[index] += 1
        if self.seen[index] > self.passes:
            self.too_many = True
            return
        if self.seen[index] != self.passes:
            return
        where = self.where.get(index)
        if where is None:
            return
        packed = self.pack(index)
        if packed is None:
            return
        bucket, k = where
        bucket.put(k, *packed)
        bucket.ready += 1
        self.pending -= 1
        self._start_full()
        started = [b.request for b in self.buckets[: self.next] if b.request is not None]
        if started:
            MPI.Request.Testall(started)

    def _start_full(self) -> None:
        buckets = self.buckets
        assert buckets is not None
        while self.next < len(buckets):
            bucket = buckets[self.next]
            if bucket.ready < len(bucket.slots):
                return
            self._start(bucket)
            if self.pending > 0:
                self.early += 1
            self.next += 1

    def _start(self, bucket: _Bucket) -> None:
        if self.comm is not None:
            bucket.request = self.comm.Iallreduce(MPI.IN_PLACE, bucket.array, MPI.SUM)

    def finish(self) -> None:
        """Bucket what no hook gave, start every bucket not started, wait for all, and hand each
        reduced gradient to ``unpack``. Collective over the communicator."""
        if self.broken:
            raise SyncError("mpisync: unusable: an overlapped all-reduce did not finish earlier")
        if self.buckets is None:
            self._lay_out()
        buckets = self.buckets
        assert buckets is not None
        if self.too_many:  # Horovod's error, once the buckets started are done with
            self._wait(buckets[: self.next])
            self._reset()
            raise AssertionError(_TOO_MANY)
        try:
            self._start_rest(buckets)
            self._wait(buckets)
        except BaseException:
            # buckets may be in flight, or not started where the others' are: never post again
            self.broken = True
            keep_alive(self.comm, *buckets)
            raise
        self._reset()
        size = self.comm.size if self.comm is not None else 1
        for bucket in buckets:
            for index, tensor in bucket.results(self.op, size):
                self.unpack(index, tensor)

    def _start_rest(self, buckets: list) -> None:
        """Bucket the gradients no hook gave, and start every bucket not started."""
        for bucket in buckets[self.next :]:
            for k, slot in enumerate(bucket.slots):
                if self.seen[slot[0]] != self.passes:
                    packed = self.pack(slot[0])
                    if packed is None:
                        raise InvalidParamError(
                            f"mpisync: gradient {slot[0]} is no longer reduced in a bucket "
                            "(its kind, sparse or dense, changed after the first step)"
                        )
                    bucket.put(k, *packed)
            self._start(bucket)

    def _reset(self) -> None:
        self.seen, self.too_many = [0] * self.count, False
        self.next, self.pending = 0, len(self.where)
        for bucket in self.buckets or ():
            bucket.ready, bucket.request = 0, None

    def _wait(self, buckets: list) -> None:
        if self.comm is None:
            return
        deadline = Deadline(self.timeout, comm=self.comm)
        for number, bucket in enumerate(buckets):
            try:
                deadline.wait(bucket.request)
            except Expired:
                names = [f"bucket {n}" for n in range(number, len(buckets))]
                timed_out(self.user_comm, "overlapped all-reduce", names, self.timeout)
                raise

    def _lay_out(self) -> None:
        """Lay out the buckets from this step's gradients; the ranks agree on the layout
        (collective), or every rank raises :class:`~mpisync.ManifestMismatchError`."""
        check_comm(self.user_comm)  # a world of one where the launcher started more, say
        packed = [self.pack(index) for index in range(self.count)]
        buckets = _layout(packed, self.caps)
        if self.user_comm.size > 1:
            deadline = Deadline(self.timeout, comm=self.user_comm)
            self.comm = wait_duplicate(duplicate(self.user_comm), deadline.wait)
            self._agree(buckets, deadline)
        self.buckets = buckets
        self.where = {s[0]: (b, k) for b in buckets for k, s in enumerate(b.slots)}
        for bucket in buckets:  # this first step's gradients, as a hook would have bucketed them
            for k, slot in enumerate(bucket.slots):
                bucket.put(k, *packed[slot[0]])
        self.next = 0
        self.seen = [self.passes] * self.count  # finish() takes every gradient as given

    def _agree(self, buckets: list, deadline: Deadline) -> None:
        described = [[list(s) for s in b.slots] + [str(b.array.dtype)] for b in buckets]
        text = _json.dumps([self.op, self.caps, described])
        digest = _zlib.crc32(text.encode())
        both = _np.array([digest, -digest], dtype=_np.int64)
        assert self.comm is not None
        request = self.comm.Iallreduce(MPI.IN_PLACE, both, MPI.MAX)
        deadline.wait(request)
        if both[0] != digest or both[1] != -digest:
            raise ManifestMismatchError(
                f"mpisync: rank {self.comm.rank}: the ranks' gradients differ (names, shapes, "
                "dtypes, None or sparse gradients at the first step, op or fusion_bytes): "
                "the overlapped all-reduce cannot pair their buckets"
            )


def _hook(ref, index: int):
    def hook(_param) -> None:
        buckets = ref()
        if buckets is not None:
            buckets.ready(index)

    return hook
