"""What the backend refuses in a collective's tensors before it builds anything, and the guard
that turns any failure while an operation is built into a refusal the argument check spreads.

A local failure (a sparse tensor where only dense ones move, a tensor on the ``meta`` device, a
dtype MPI cannot reduce, or anything that raises while the host buffers are prepared) must not
raise on the calling rank alone: its peers would wait in the argument check until the timeout.
:func:`refusing` makes it the operation's ``problem`` instead, so that every rank raises the same
:class:`~mpisync.torch.errors.ArgumentError` and nothing is posted.

A tensor with the negative or the conjugate bit (``torch._neg_view``, ``t.conj()``) has no byte
view that holds its values: :func:`resolving` hands the operation a resolved copy instead, as
torch's dispatcher does for gloo (so its values travel as gloo sends them), and writes what the
operation leaves in the copy back into the tensor once it completes (gloo leaves such an output
unwritten).
"""

from __future__ import annotations

import functools as _functools
import typing as _typing

import torch

from .op import Op, shape_text

__all__ = ["refusing", "resolving", "tensor_problem", "tensors_in"]

# The devices whose tensors the backend reads and writes (CUDA through host copies or the
# device path).
_DEVICES = ("cpu", "cuda")


def tensors_in(args: _typing.Iterable) -> list:
    """The tensors among ``args``, in lists and tuples at any depth, in order."""
    found: list = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple)):
            found.extend(tensors_in(arg))
    return found


def _named(index: int, tensor: torch.Tensor) -> str:
    return f"tensor {index} ({shape_text([tensor])}"


def tensor_problem(tensors: _typing.Iterable[torch.Tensor], sparse: bool = False) -> str | None:
    """Why the backend cannot move one of ``tensors`` (``sparse``: sparse COO tensors are
    accepted), or None."""
    for index, tensor in enumerate(tensors):
        if tensor.layout != torch.strided and not (sparse and tensor.layout == torch.sparse_coo):
            return (
                f"{_named(index, tensor)}, {tensor.layout}) is not dense: mpisync moves dense "
                "tensors (all_reduce also reduces one sparse COO tensor)"
            )
        if tensor.device.type not in _DEVICES:
            where = tensor.device
            return f"{_named(index, tensor)}) is on {where}: mpisync serves cpu and cuda tensors"
        if tensor.is_quantized:
            return f"{_named(index, tensor)}) is quantized: mpisync does not move quantized tensors"
    return None


def refusing(kind: str, sparse: bool = False):
    """Decorate a function that builds an :class:`Op`: a problem with the tensors among its
    arguments (:func:`tensor_problem`), or any exception while it builds, is the returned
    operation's ``problem`` (raised on every rank by the argument check), never an exception on
    this rank alone. Tensors with the negative or conjugate bit are resolved
    (:func:`resolving`)."""

    def decorate(build):
        @_functools.wraps(build)
        def guarded(*args, **kwargs) -> Op:
            tensors = tensors_in([*args, *kwargs.values()])
            problem = tensor_problem(tensors, sparse)
            if problem is None:
                try:
                    return resolving(build, *args, **kwargs)
                except Exception as exc:  # any failure to build: refused on every rank
                    text = str(exc).strip().splitlines()
                    problem = f"{type(exc).__name__}: {text[0] if text else ''}"
            return Op(kind, [], lambda: shape_text(tensors), None, None, problem)

        return guarded

    return decorate


def _marked(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory holds other values than it reads as (a negative or conjugate
    view)."""
    return tensor.is_neg() or tensor.is_conj()


def _swapped(arg, table: dict):
    """``arg`` with each tensor in ``table`` (by id) replaced by its entry, in lists and tuples at
    any depth."""
    if isinstance(arg, torch.Tensor):
        return table.get(id(arg), (arg,))[0]
    if isinstance(arg, (list, tuple)):
        return type(arg)(_swapped(a, table) for a in arg)
    return arg


def resolving(build, *args, **kwargs) -> Op:
    """``build(*args, **kwargs)`` with every tensor that has the negative or conjugate bit
    replaced by a resolved copy (one copy per tensor object, so that a tensor passed twice is
    still one tensor); the operation's results are the caller's tensors again, and what the
    operation writes into a copy is written into the caller's tensor once it completes."""
    marked = [t for t in tensors_in([*args, *kwargs.values()]) if _marked(t)]
    if not marked:
        return build(*args, **kwargs)
    copies: dict = {}  # id(original) -> (resolved copy, original)
    with torch.no_grad():
        for tensor in marked:
            if id(tensor) not in copies:
                copy = tensor.detach().resolve_conj().resolve_neg()
                copies[id(tensor)] = (copy, tensor)
    op = build(
        *(_swapped(a, copies) for a in args), **{k: _swapped(v, copies) for k, v in kwargs.items()}
    )
    originals = {id(copy): (original, copy) for copy, original in copies.values()}
    op.result = _swapped(op.result, originals)
    # what the operation writes: its results (a send writes nothing)
    written = [] if op.kind == "send" else tensors_in([op.result])
    backs = list({id(t): (t, copies[id(t)][0]) for t in written if id(t) in copies}.values())
    inner = op.body
    if inner is None or not backs:
        return op

    def body(comm):
        yield from inner(comm)
        with torch.no_grad():
            for original, copy in backs:
                original.copy_(copy)

    op.body = body
    return op
