"""An operation of the backend as the process group builds it (:class:`Op`): what the argument
check compares across ranks, the problem found locally, and the data steps.

An ``Op`` is made on the calling thread when torch issues the collective: its
arguments are checked there (``problem``) and its host buffers prepared, but
nothing is posted. Its ``body(comm)`` is a generator: each step posts requests
and yields ``(requests, last)``; what follows the last yield is the completion.
"""

from __future__ import annotations

import threading as _threading
import typing as _typing
import zlib as _zlib

import numpy as _np
import torch

__all__ = [
    "Op",
    "combined",
    "fold",
    "dtype_code",
    "kind_code",
    "shape_text",
    "host_bytes",
    "flat_bytes",
]

# The operations, in a fixed order: each one's code is what the argument check compares.
KINDS = (
    "barrier",
    "broadcast",
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "sparse_all_reduce",
)
_KIND_CODES = {name: index + 1 for index, name in enumerate(KINDS)}
_DTYPE_CODES: dict = {}
_MASK = (1 << 62) - 1


def kind_code(kind: str) -> int:
    """The operation's code in the argument check."""
    return _KIND_CODES[kind]


def dtype_code(dtype: torch.dtype) -> int:
    """A code for ``dtype``, the same in every process (a CRC of its name)."""
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = _zlib.crc32(str(dtype).encode()) + 1
    return code


def fold(values: _typing.Iterable[int]) -> int:
    """One word for a sequence of integers (FNV-1a over 64-bit words, kept below 2**62): the same
    in every process, unlike ``hash`` of a string."""
    word = 0xCBF29CE484222325 & _MASK
    for value in values:
        word = ((word ^ (value & 0xFFFFFFFFFFFFFFFF)) * 0x100000001B3) & _MASK
    return word


def shape_text(tensors: _typing.Sequence[torch.Tensor]) -> str:
    """``float32[4], float32[2, 3]``: what a diagnostic says about ``tensors``."""
    return ", ".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" for t in tensors)


class Op:
    """One operation: ``kind``, its ``label`` (diagnostics), the ``signature`` words every rank
    must agree on (dtypes, counts, details such as the reduce op and the root), ``describe()``
    (what a diagnostic says about this rank's arguments), a local ``problem`` (a message, or
    ``None``), ``body(comm)`` (the data steps), the work's ``result``; for operations whose
    counts differ by peer, ``cross``: ``(what this rank sends to each rank, what it expects from
    each)``, checked against the other ranks' before anything moves; and ``prepare``, a
    :class:`Once` the caller runs while the argument check is in flight (it must not write
    the tensors: the check may still refuse the operation). ``in_place``: whether this rank
    could run it with ``MPI_IN_PLACE`` (``None``: the question does not arise); MPI wants that
    on every rank or none, so the argument check sets ``everywhere`` (every rank could), which
    the body reads; without the check it stays False."""

    __slots__ = (
        "kind",
        "label",
        "signature",
        "describe",
        "problem",
        "body",
        "result",
        "p2p",
        "cross",
        "prepare",
        "in_place",
        "everywhere",
    )

    def __init__(
        self,
        kind: str,
        signature: _typing.Sequence[int],
        describe: _typing.Callable[[], str],
        body,
        result=None,
        problem: str | None = None,
        label: str | None = None,
        p2p: bool = False,
        cross: tuple | None = None,
        prepare=None,
        in_place: bool | None = None,
    ):
        self.kind, self.signature, self.describe = kind, tuple(signature), describe
        self.body, self.result, self.problem = body, result, problem
        self.label = label or kind
        self.p2p, self.cross, self.prepare = p2p, cross, prepare
        self.in_place, self.everywhere = in_place, False


class Once:
    """``fn()`` run once, by whichever thread asks first (the caller after posting the check, or
    the driver about to post the data)."""

    __slots__ = ("fn", "value", "done", "lock")

    def __init__(self, fn: _typing.Callable[[], _typing.Any]):
        self.fn, self.value, self.done = fn, None, False
        self.lock = _threading.Lock()

    def __call__(self):
        if not self.done:
            with self.lock:
                if not self.done:
                    self.value, self.done = self.fn(), True
        return self.value


def host_bytes(tensor: torch.Tensor) -> tuple:
    """``(uint8 numpy view MPI reads or writes, copy-back or None)`` for any tensor: in place for
    a contiguous CPU tensor, else a contiguous host copy written back by the copy-back."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return flat_bytes(tensor), None
    host = tensor.detach().to("cpu").contiguous()

    def back() -> None:
        with torch.no_grad():
            tensor.copy_(host)

    return flat_bytes(host), back


def flat_bytes(tensor: torch.Tensor) -> _np.ndarray:
    """The bytes of a contiguous CPU tensor as a writable uint8 numpy array (no copy)."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 1 and flat.stride(0) != 1:  # contiguous to torch, not to a byte view
        flat = flat.as_strided((1,), (1,), flat.storage_offset())
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(torch.uint8).numpy()


def combined(kind: str, ops: _typing.Sequence[Op], result) -> Op:
    """One operation of several one-step operations (their requests posted together)."""
    ops = list(ops)
    problem = next((o.problem for o in ops if o.problem is not None), None)
    if not ops:
        problem = "no tensors given"
    signature = [fold(w for o in ops for w in o.signature), len(ops)]

    def describe() -> str:
        return "; ".join(o.describe() for o in ops)

    def body(comm):
        bodies = [o.body(comm) for o in ops]
        steps = [next(b) for b in bodies]  # each posts its one step
        statuses = yield [r for requests, _ in steps for r in requests], True
        start = 0
        for b, (requests, _) in zip(bodies, steps):
            try:
                b.send(statuses[start : start + len(requests)])  # its completion
            except StopIteration:
                pass
            start += len(requests)

    return Op(kind, signature, describe, None if problem else body, result, problem)


def joined(tensors: _typing.Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One flat tensor over ``tensors`` when they lie end to end in one CPU storage (the chunks
    of one tensor, say), so MPI reads or writes them in place; else None (a copy is needed)."""
    if not tensors:
        return None
    first = tensors[0]
    storage, address = first.untyped_storage().data_ptr(), first.data_ptr()
    for tensor in tensors:
        if not (tensor.is_cpu and tensor.is_contiguous() and tensor.dtype == first.dtype):
            return None
        if tensor.untyped_storage().data_ptr() != storage or tensor.data_ptr() != address:
            return None
        address += tensor.numel() * tensor.element_size()
    total = sum(t.numel() for t in tensors)
    return first.detach().as_strided((total,), (1,), first.storage_offset())


def _span(tensor: torch.Tensor) -> tuple | None:
    """``(device, first byte, one past the last byte)`` that ``tensor``'s elements may touch."""
    if tensor.layout != torch.strided or tensor.numel() == 0:
        return None
    extent = 1 + sum((n - 1) * step for n, step in zip(tensor.shape, tensor.stride()))
    start = tensor.data_ptr()
    return str(tensor.device), start, start + extent * tensor.element_size()


def overlapping(tensors: _typing.Iterable[torch.Tensor]) -> bool:
    """Whether any two of ``tensors`` may share memory (one tensor twice, a view of another, an
    input that is a slice of the output): MPI refuses such buffers, or reads what it writes."""
    spans = sorted(s for s in map(_span, tensors) if s is not None)
    reach: dict = {}
    for device, start, end in spans:
        if start < reach.get(device, start):
            return True
        reach[device] = max(end, reach.get(device, end))
    return False
