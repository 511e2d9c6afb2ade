"""Fixtures of the torch tests: what this torch's gloo can do, where a test takes gloo's bytes
as the reference (the gloo of torch 2.4 and 2.5 has no ``reduce_scatter``, no ``alltoall``, no
``AVG``, and no complex tensors)."""

from __future__ import annotations

import functools

import pytest


def torch_complex():
    """The complex dtype the probes use."""
    import torch

    return torch.complex128


def _avg_options():
    import torch.distributed as dist

    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.AVG
    return options


_PROBES = {
    "reduce_scatter": lambda pg, t: pg.reduce_scatter([t], [[t.clone()]]),
    "alltoall": lambda pg, t: pg.alltoall([t], [t.clone()]),
    "AVG": lambda pg, t: pg.allreduce([t], _avg_options()),
    "complex all_reduce": lambda pg, t: pg.allreduce([t.to(torch_complex())]),
    "complex reduce": lambda pg, t: pg.reduce([t.to(torch_complex())]),
    "complex broadcast": lambda pg, t: pg.broadcast([t.to(torch_complex())]),
    "complex reduce_scatter_tensor": lambda pg, t: pg._reduce_scatter_base(
        t.to(torch_complex()), t.to(torch_complex())
    ),
    "reduce_scatter_tensor": lambda pg, t: pg._reduce_scatter_base(t, t.clone()),
}
# What gloo says of an operation it does not have (its C++ check, before anything is sent).
_REFUSALS = ("does not support", "Cannot use ReduceOp.AVG", "Invalid scalar type")


@functools.cache
def gloo_has(feature: str) -> bool:
    """Whether this torch's gloo has ``feature`` (a key of ``_PROBES``): tried on a gloo group
    of this process alone, so every rank (the same torch) finds the same."""
    import torch
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    try:
        _PROBES[feature](group, torch.ones(2)).wait()
    except RuntimeError as exc:
        if any(refusal in str(exc) for refusal in _REFUSALS):
            return False
        raise
    return True


@pytest.fixture
def need_gloo():
    """``need_gloo(feature)``: skip the test where this torch's gloo, its reference, lacks
    ``feature``."""

    def need(feature: str) -> None:
        if not gloo_has(feature):
            pytest.skip(f"this torch's gloo (the reference) has no {feature}")

    return need
