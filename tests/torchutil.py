"""Helpers for the torch backend's tests: per-rank tensors, and their bytes to compare."""

import numpy as np
import torch


def rank_values(rank: int, n: int, dtype, exact: bool = False) -> torch.Tensor:
    """``n`` values of ``dtype`` for ``rank``: random, or small integers (``exact``: any order of
    summing them gives the same bytes, as between gloo and MPI at more than two ranks)."""
    rng = np.random.default_rng(1000 + rank)
    if exact or not dtype.is_floating_point:
        values = rng.integers(-3 if dtype.is_signed else 0, 4, n)
    else:
        values = rng.standard_normal(n) * 1e3
    return torch.from_numpy(values).to(dtype)


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of ``tensor``'s values, in order."""
    # contiguous() keeps a one-element tensor's odd stride, which a byte view refuses
    dense = tensor.detach().clone(memory_format=torch.contiguous_format)
    return dense.view(torch.uint8).numpy().tobytes()
