"""Every torch.distributed collective on the ``"mpisync"`` backend beside gloo, and the cost of
the backend's argument check.

- ``collectives``: latency of each collective at each size (1 KiB, 1 MiB and 25 MiB
  by default): ``size`` is the bytes of each rank's input tensor (``scatter``: of each rank's
  output; ``all_to_all``: of each of its input tensors, one per rank; ``send/recv``: one message
  from rank 0 to rank 1; ``broadcast_coalesced``: DDP's start-up broadcast of 8 tensors of that
  many bytes in all), float32. mpisync, gloo and (where :data:`LIMITS` has one) the operation's
  limit row are timed side by side in one interleaved loop
  (:func:`~mpisync.tools.bench.timing.measure_interleaved`: medians of the slowest rank's time);
  ``gloo/mpisync`` above 1 means mpisync is faster, ``of limit`` is the limit's time / mpisync's.
- ``check``: ``all_reduce`` on two mpisync groups, one with the argument check
  (``MPISYNC_TORCH_CHECK=1``) and one without (the default), side by side: what the check
  costs.
"""

from __future__ import annotations

import os as _os
import typing as _typing

from . import limits as _limits
from .timing import measure_interleaved

__all__ = ["COLLECTIVES", "LIMITS", "SIZES", "check_cost", "collectives", "table"]

SIZES = (1 << 10, 1 << 20, 25 << 20)
_Builder = _typing.Callable[[_typing.Any, int, int, int], _typing.Callable[[], object]]


def _floats(nbytes: int):
    """A float32 tensor of ``nbytes`` made by torch's allocator, as users' tensors are (4 KiB
    pages where numpy would take huge pages), every page written."""
    import torch

    return torch.zeros(max(1, nbytes // 4))


def _broadcast(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    return lambda: dist.broadcast(tensor, src=0, group=group)


def _broadcast_coalesced(group, rank, size, nbytes):
    import torch.distributed as dist

    tensors = [t.clone() for t in _floats(nbytes).chunk(8)]
    return lambda: dist._broadcast_coalesced(group, tensors, 250 * 1024 * 1024, 0)


def _all_reduce(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    return lambda: dist.all_reduce(tensor, group=group)


def _reduce(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    return lambda: dist.reduce(tensor, dst=0, group=group)


def _all_gather(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    outputs = [tensor.clone() for _ in range(size)]
    return lambda: dist.all_gather(outputs, tensor, group=group)


def _all_gather_into_tensor(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    output = tensor.repeat(size)
    # torch 2.13 names it all_gather_single (the old name warns on every call)
    call = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    return lambda: call(output, tensor, group=group)


def _gather(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    outputs = [tensor.clone() for _ in range(size)] if rank == 0 else None
    return lambda: dist.gather(tensor, outputs, dst=0, group=group)


def _scatter(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    inputs = [tensor.clone() for _ in range(size)] if rank == 0 else None
    return lambda: dist.scatter(tensor, inputs, src=0, group=group)


def _reduce_scatter(group, rank, size, nbytes):
    import torch.distributed as dist

    pieces = list(_floats(nbytes).repeat(size).chunk(size))
    output = pieces[0].clone()
    return lambda: dist.reduce_scatter(output, pieces, group=group)


def _reduce_scatter_tensor(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    output = tensor[: max(1, tensor.numel() // size)].clone()
    tensor = tensor[: output.numel() * size].clone()
    # torch 2.13 names it reduce_scatter_single (the old name warns on every call)
    call = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    return lambda: call(output, tensor, group=group)


def _all_to_all(group, rank, size, nbytes):
    import torch.distributed as dist

    inputs = list(_floats(nbytes).repeat(size).chunk(size))
    outputs = [t.clone() for t in inputs]
    return lambda: dist.all_to_all(outputs, inputs, group=group)


def _all_to_all_single(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    tensor = tensor[: max(size, tensor.numel() // size * size)].clone()
    output = tensor.clone()
    return lambda: dist.all_to_all_single(output, tensor, group=group)


def _send_recv(group, rank, size, nbytes):
    import torch.distributed as dist

    tensor = _floats(nbytes)
    if rank == 0:
        return lambda: dist.send(tensor, dst=1, group=group)
    if rank == 1:
        return lambda: dist.recv(tensor, src=0, group=group)
    return lambda: None


def _barrier(group, rank, size, nbytes):
    import torch.distributed as dist

    return lambda: dist.barrier(group=group)


COLLECTIVES: dict[str, _Builder] = {
    "broadcast": _broadcast,
    "broadcast_coalesced": _broadcast_coalesced,
    "all_reduce": _all_reduce,
    "reduce": _reduce,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "gather": _gather,
    "scatter": _scatter,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "send/recv": _send_recv,
    "barrier": _barrier,
}


#: collective -> (its operation in :mod:`~mpisync.tools.bench.limits`, the operation's bytes from
#: ``(size, ranks)``), for those with a limit row
LIMITS: dict[str, tuple[str, _typing.Callable[[int, int], int]]] = {
    "broadcast": ("broadcast", lambda b, n: b),
    "broadcast_coalesced": ("broadcast", lambda b, n: b),
    "all_reduce": ("all-reduce", lambda b, n: b),
    "reduce": ("reduce", lambda b, n: b),
    "all_gather": ("all-gather out of place", lambda b, n: b * n),
    "all_gather_into_tensor": ("all-gather out of place", lambda b, n: b * n),
    "reduce_scatter": ("reduce-scatter", lambda b, n: b * n),
    "reduce_scatter_tensor": ("reduce-scatter", lambda b, n: b // 4 // n * n * 4),
}


def _cells(sizes, ranks: int) -> list:
    cells: list = []
    for name in COLLECTIVES:
        if name == "send/recv" and ranks < 2:
            continue
        cells += [(name, 0)] if name == "barrier" else [(name, s) for s in sizes]
    return cells


def collectives(comm, groups: dict, iterations: int, sizes=SIZES, progress=None) -> list:
    """One row per collective and size: its median time on each backend of ``groups``
    (``{"mpisync": group, "gloo": group}``), side by side, and ``gloo/mpisync``."""
    rows = []
    for name, nbytes in _cells(sizes, comm.size):
        runs = {
            backend: COLLECTIVES[name](group, comm.rank, comm.size, nbytes)
            for backend, group in groups.items()
        }
        if name in LIMITS and comm.size > 1:
            operation, total = LIMITS[name]
            runs["limit"] = _limits.limit_run(comm, operation, total(nbytes, comm.size))
        timings = measure_interleaved(
            comm, runs, iterations=iterations, warmup=2, progress=progress
        )
        row = {"collective": name, "bytes": nbytes}
        row.update({f"{k}_us": v.median * 1e6 for k, v in timings.items()})
        row["samples_s"] = {k: v.samples for k, v in timings.items()}
        row["gloo/mpisync"] = timings["gloo"].median / timings["mpisync"].median
        row["of_limit"] = (
            timings["limit"].median / timings["mpisync"].median if "limit" in timings else None
        )
        rows.append(row)
    return rows


def cells(sizes, ranks: int) -> int:
    """How many rows :func:`collectives` measures (for a progress bar)."""
    return len(_cells(sizes, ranks))


def group_with_check(on: bool):
    """A new mpisync group over every rank with the argument check on or off (a collective
    call), whatever ``MPISYNC_TORCH_CHECK`` says."""
    import torch.distributed as dist

    before = _os.environ.get("MPISYNC_TORCH_CHECK")
    _os.environ["MPISYNC_TORCH_CHECK"] = "1" if on else "0"
    try:
        return dist.new_group(backend="mpisync")
    finally:
        if before is None:
            del _os.environ["MPISYNC_TORCH_CHECK"]
        else:
            _os.environ["MPISYNC_TORCH_CHECK"] = before


def check_cost(comm, checked, unchecked, iterations: int, sizes=(1 << 10, 1 << 20)) -> list:
    """``all_reduce`` with and without the argument check, side by side, per size."""
    rows = []
    for nbytes in sizes:
        runs = {
            "checked": _all_reduce(checked, comm.rank, comm.size, nbytes),
            "unchecked": _all_reduce(unchecked, comm.rank, comm.size, nbytes),
        }
        timings = measure_interleaved(comm, runs, iterations=iterations, warmup=3)
        on, off = timings["checked"].median, timings["unchecked"].median
        rows.append(
            {
                "bytes": nbytes,
                "checked_us": on * 1e6,
                "unchecked_us": off * 1e6,
                "cost": on / off - 1,
            }
        )
    return rows


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return "-" if n == 0 else f"{n} B"


def table(result: dict) -> list:
    """The text lines of the ``collectives`` and ``check`` rows of ``result``."""
    lines = []
    if result.get("collectives"):
        lines += [
            "",
            "torch.distributed collectives, mpisync beside gloo (collectives)",
            f"  {'collective':<24} {'size':>9} {'mpisync us':>12} {'gloo us':>12} "
            f"{'limit us':>10} {'gloo/mpisync':>13} {'of limit':>9}",
        ]
        for row in result["collectives"]:
            limit = row.get("limit_us")
            of_limit = row.get("of_limit")
            lines.append(
                f"  {row['collective']:<24} {_size(row['bytes']):>9} {row['mpisync_us']:12.1f} "
                f"{row['gloo_us']:12.1f} {'-' if limit is None else f'{limit:.1f}':>10} "
                f"{row['gloo/mpisync']:12.2f}x {'-' if of_limit is None else f'{of_limit:.2f}x':>9}"
            )
        lines.append(
            "  size: each rank's input (scatter: output; all_to_all: each input tensor, one per "
            "rank; broadcast_coalesced: DDP's start-up broadcast, 8 tensors); us: median time per "
            "call of the slowest rank, "
            "microseconds; limit: the operation's bytes as local copies and adds on every rank at "
            "once (- where none is defined); gloo/mpisync: above 1x, mpisync faster; of limit: "
            "the limit's time / mpisync's (1.00x: at the memory limit) (docs/performance.md)"
        )
    if result.get("check"):
        lines += [
            "",
            "the torch backend's argument check, on all_reduce (check)",
            f"  {'size':>9} {'checked us':>12} {'unchecked us':>13} {'cost':>7}",
        ]
        for row in result["check"]:
            lines.append(
                f"  {_size(row['bytes']):>9} {row['checked_us']:12.1f} "
                f"{row['unchecked_us']:13.1f} {100 * row['cost']:6.1f}%"
            )
        lines.append(
            "  us: median time per call of the slowest rank, microseconds, with the check "
            "(MPISYNC_TORCH_CHECK=1) and without (the default); cost: checked / unchecked - 1"
        )
    return lines
