"""What the backend refuses in a collective's tensors before it builds anything, and the guard
that turns any failure while an operation is built into a refusal the argument check spreads.

A local failure (a sparse tensor where only dense ones move, a tensor on the ``meta`` device, a
dtype MPI cannot reduce, or anything that raises while the host buffers are prepared) must not
raise on the calling rank alone: its peers would wait in the argument check until the timeout.
:func:`refusing` makes it the operation's ``problem`` instead, so that every rank raises the same
:class:`~mpisync.torch.errors.ArgumentError` and nothing is posted.
"""

from __future__ import annotations

import functools as _functools
import typing as _typing

import torch

from .op import Op, shape_text

__all__ = ["refusing", "tensor_problem", "tensors_in"]

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
    this rank alone."""

    def decorate(build):
        @_functools.wraps(build)
        def guarded(*args, **kwargs) -> Op:
            tensors = tensors_in([*args, *kwargs.values()])
            problem = tensor_problem(tensors, sparse)
            if problem is None:
                try:
                    return build(*args, **kwargs)
                except Exception as exc:  # any failure to build: refused on every rank
                    text = str(exc).strip().splitlines()
                    problem = f"{type(exc).__name__}: {text[0] if text else ''}"
            return Op(kind, [], lambda: shape_text(tensors), None, None, problem)

        return guarded

    return decorate
