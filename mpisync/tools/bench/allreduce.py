"""All-reduce benchmark: mpisync's torch backend beside gloo, ``GradSync`` beside plain MPI.

Run under ``mpiexec`` (``mpiexec -n 2 python -m mpisync.tools.bench.allreduce``). Rows, each timed
side by
side with its references in one interleaved loop
(:func:`~mpisync.tools.bench.timing.measure_interleaved`:
medians of the slowest rank's time):

- ``sweep``: ``all_reduce`` of float32 tensors, 4 B to ``--max-bytes`` (powers of 4, and 1 MiB and
  25 MiB): the ``"mpisync"`` backend, gloo, mpi4py's blocking ``Allreduce`` of the same buffer, and
  the all-reduce's limit row (:mod:`mpisync.tools.bench.limits`); not OSU's method (the raw
  ``MPI_Allreduce`` rows by that method are :mod:`mpisync.tools.bench.osu`'s);
- ``grads``: ``GradSync.allreduce`` of the gradient sets of ResNet-50, BERT-base and 5000 x 400 B,
  the one-shot ``mpisync.allreduce`` (a new syncer each call), one flat ``Allreduce`` of the same
  bytes, the limit row, and (5000 x 400 B) a loop of per-tensor ``Allreduce``;
- ``ddp``: one DistributedDataParallel training step of an 8-layer 1024 x 1024 MLP (batch 32) on the
  ``"mpisync"`` backend, on gloo, the same step without communication, and through DDP with a
  communication hook that moves nothing (DDP's own cost: what compute/step is with free
  communication);
- ``collectives``: every other collective too, beside gloo, at 1 KiB, 1 MiB and 25 MiB (those
  not above ``--max-bytes``), and ``check``: the backend's argument check's cost on
  ``all_reduce`` (:mod:`mpisync.tools.bench.collectives`).

Every rank runs torch with ``--threads`` intra-op threads (default 1: ranks share the cores).
"""

from __future__ import annotations

import argparse as _argparse
import json as _json
import sys as _sys

import numpy as _np
from mpi4py import MPI

from ..progressbar import Progress
from ..workloads import make_params, workload
from . import collectives as _collectives
from . import limits as _limits
from .buffers import written
from .text import DOCS, ratio_text
from .timing import measure_interleaved

__all__ = ["GRAD_SETS", "ROWS", "main", "parser", "run", "table"]

GRAD_SETS = ("resnet50", "bert-base", "many-small")
ROWS = ("sweep", "grads", "ddp", "collectives", "check")
# the rows that compare the torch backend with gloo (they need torch)
TORCH_ROWS = ("sweep", "ddp", "collectives", "check")


def _groups(comm):
    """``(mpisync group, gloo group, whether this made the default group)``; the default group is
    gloo over a TCP store on 127.0.0.1 whose port rank 0 shares through MPI (as an int64, never
    pickled), unless the caller (``mpisync bench``'s gloo strategy) made one already."""
    import torch.distributed as dist

    import mpisync.torch  # noqa: F401  (registers the backend)

    if dist.is_initialized():
        gloo = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        return dist.new_group(backend="mpisync"), gloo, False
    port = _np.zeros(1, _np.int64)
    store = None
    if comm.rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, comm.size, True, wait_for_workers=False)
        port[0] = store.port
    comm.Bcast(port, 0)
    if comm.rank != 0:
        store = dist.TCPStore("127.0.0.1", int(port[0]), comm.size, False)
    dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
    return dist.new_group(backend="mpisync"), dist.group.WORLD, True


def _sizes(max_bytes: int) -> list:
    out, size = [], 4
    while size <= max_bytes:
        out.append(size)
        size *= 4
    for extra in (1 << 20, 25 << 20):  # the targets' sizes
        if extra <= max_bytes and extra not in out:
            out.append(extra)
    return sorted(out)


def sweep(comm, groups, max_bytes: int, iterations: int) -> list:
    """``all_reduce`` latency per size on each backend, mpi4py's ``Allreduce`` and the limit row."""
    import torch
    import torch.distributed as dist

    rows = []
    for size in _sizes(max_bytes):
        # torch's allocator, as users' tensors: 4 KiB pages (numpy's would be huge pages)
        tensors = {name: torch.zeros(size // 4) for name in ("mpisync", "gloo")}
        flat = written(size // 4, _np.float32)
        runs: dict = {
            name: (lambda t=tensors[name], g=groups[name]: dist.all_reduce(t, group=g))
            for name in tensors
        }
        runs["mpi Allreduce"] = lambda f=flat: comm.Allreduce(MPI.IN_PLACE, f)
        runs["limit"] = _limits.limit_run(comm, "all-reduce", size)
        # Every size gets every iteration: with fewer samples at the large sizes, gloo's median
        # there moved between runs (docs/allreduce.md, The bench rows).
        timings = measure_interleaved(comm, runs, iterations=iterations, warmup=3)
        row = {"bytes": size, **{f"{k}_us": v.median * 1e6 for k, v in timings.items()}}
        row["samples_s"] = {k: v.samples for k, v in timings.items()}
        row["speedup_vs_gloo"] = timings["gloo"].median / timings["mpisync"].median
        row["of_limit"] = _of_limit(comm, timings["limit"].median, timings["mpisync"].median)
        rows.append(row)
    return rows


def _of_limit(comm, limit: float, row: float) -> float | None:
    """``limit / row``; None at 1 rank (nothing to move: no limit)."""
    return limit / row if comm.size > 1 else None


def grads(comm, iterations: int, sets=GRAD_SETS) -> list:
    """``GradSync.allreduce`` of gradient-shaped sets against flat and per-tensor ``Allreduce``."""
    from ...allreduce.gradsync import GradSync, allreduce

    rows = []
    for name in sets:
        params = make_params(workload(name), comm.rank)
        for array in params.values():
            array[...] = 0  # sums stay finite over every iteration
        nbytes = sum(a.nbytes for a in params.values())
        flat = written(nbytes // 4, _np.float32)
        syncer = GradSync(comm, op="sum")
        runs = {
            "GradSync": lambda s=syncer, p=params: s.allreduce(p),
            "allreduce, one-shot": lambda p=params: allreduce(p, comm, op="sum"),
            "flat Allreduce": lambda f=flat: comm.Allreduce(MPI.IN_PLACE, f),
            "limit": _limits.limit_run(comm, "all-reduce", nbytes),
        }
        if name == "many-small":
            views = [a.reshape(-1) for a in params.values()]
            runs["per-tensor Allreduce"] = lambda vs=views: [
                comm.Allreduce(MPI.IN_PLACE, v) for v in vs
            ]
        timings = measure_interleaved(comm, runs, iterations=iterations, warmup=3)
        channel = syncer.allreduce(params).channel
        syncer.close()
        row = {
            "workload": name,
            "tensors": len(params),
            "bytes": nbytes,
            **{f"{k}_ms": v.median * 1e3 for k, v in timings.items()},
            "samples_s": {k: v.samples for k, v in timings.items()},
        }
        row["channel"] = channel
        row["vs_flat"] = timings["flat Allreduce"].median / timings["GradSync"].median
        row["of_limit"] = _of_limit(comm, timings["limit"].median, timings["GradSync"].median)
        row["one_shot_vs_flat"] = (
            timings["flat Allreduce"].median / timings["allreduce, one-shot"].median
        )
        if "per-tensor Allreduce" in timings:
            row["vs_per_tensor"] = (
                timings["per-tensor Allreduce"].median / timings["GradSync"].median
            )
            row["one_shot_vs_per_tensor"] = (
                timings["per-tensor Allreduce"].median / timings["allreduce, one-shot"].median
            )
        rows.append(row)
    return rows


def _mlp(seed: int):
    import torch

    torch.manual_seed(seed)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def noop_hook(state, bucket):
    """A DDP communication hook that returns each bucket as it is: DDP's own work, no bytes
    moved."""
    import torch

    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def ddp_runs(comm, groups) -> dict:
    """``name -> one DDP step`` (forward, backward, SGD) of the MLP: on each backend of ``groups``,
    without communication, and through DDP with :func:`noop_hook` ("DDP, no-op hook")."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    batch = torch.randn(32, 1024)
    models = {
        name: DistributedDataParallel(_mlp(comm.rank), process_group=g)
        for name, g in groups.items()
    }
    models["no communication"] = _mlp(comm.rank)
    models["DDP, no-op hook"] = DistributedDataParallel(
        _mlp(comm.rank), process_group=groups["mpisync"]
    )
    models["DDP, no-op hook"].register_comm_hook(None, noop_hook)
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-6) for name, m in models.items()}

    def step(name):
        model, optimizer = models[name], optimizers[name]
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    return {name: (lambda n=name: step(n)) for name in models}


def ddp_step(comm, groups, iterations: int) -> dict:
    """The steps of :func:`ddp_runs`, timed side by side, and their ratios."""
    runs = ddp_runs(comm, groups)
    timings = measure_interleaved(comm, runs, iterations=iterations, warmup=3)
    row: dict = {f"{k}_ms": v.median * 1e3 for k, v in timings.items()}
    row["samples_s"] = {k: v.samples for k, v in timings.items()}
    row["speedup_vs_gloo"] = timings["gloo"].median / timings["mpisync"].median
    row["compute_fraction"] = timings["no communication"].median / timings["mpisync"].median
    row["compute_fraction_free_communication"] = (
        timings["no communication"].median / timings["DDP, no-op hook"].median
    )
    return row


def run(comm, args) -> dict:
    """Run the rows ``args.rows`` asks for; return them (every rank)."""
    out = {"ranks": comm.size, "iterations": args.iterations}
    groups, created = None, False
    if set(TORCH_ROWS) & set(args.rows):  # the grads row needs no torch
        import torch

        torch.set_num_threads(args.threads)
        mpisync_group, gloo_group, created = _groups(comm)
        groups = {"mpisync": mpisync_group, "gloo": gloo_group}
    if "sweep" in args.rows:
        out["sweep"] = sweep(comm, groups, args.max_bytes, args.iterations)
    if "grads" in args.rows:
        out["grads"] = grads(comm, args.iterations, args.sets)
    if "ddp" in args.rows:
        out["ddp"] = ddp_step(comm, groups, args.iterations)
    if "collectives" in args.rows:
        out["collectives"] = _every_collective(comm, groups, args)
    if "check" in args.rows:
        assert groups is not None
        checked = _collectives.group_with_check(True)
        unchecked = _collectives.group_with_check(False)
        sizes = [s for s in (1 << 10, 1 << 20) if s <= max(args.max_bytes, 1 << 10)]
        out["check"] = _collectives.check_cost(comm, checked, unchecked, args.iterations, sizes)
        _destroy(unchecked)
        _destroy(checked)
    if groups is not None:
        import torch.distributed as dist

        if created:
            dist.destroy_process_group()  # and every group made on it
        else:
            _destroy(groups["mpisync"])
    return out


def _destroy(group) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


def _every_collective(comm, groups, args) -> list:
    sizes = [s for s in args.sizes if s <= args.max_bytes]
    total = _collectives.cells(sizes, comm.size) * args.iterations
    enabled = comm.rank == 0 and not args.no_progress
    progress = Progress("mpisync bench: collectives", total, enabled=enabled)
    try:
        return _collectives.collectives(
            comm, groups, args.iterations, sizes, lambda: progress.update(1)
        )
    finally:
        progress.close()


def _sweep_lines(rows: list) -> list:
    lines = [
        "",
        "torch all_reduce, float32 sum, size by size (sweep)",
        f"  {'size B':>10} {'mpisync us':>11} {'gloo us':>11} {'Allreduce us':>13} "
        f"{'limit us':>10} {'x gloo':>7} {'of limit':>9}",
    ]
    for row in rows:
        lines.append(
            f"  {row['bytes']:>10} {row['mpisync_us']:11.1f} {row['gloo_us']:11.1f} "
            f"{row['mpi Allreduce_us']:13.1f} {row['limit_us']:10.1f} "
            f"{ratio_text(row['speedup_vs_gloo']):>7} {ratio_text(row.get('of_limit')):>9}"
        )
    lines.append(
        "  us: median time per call, microseconds; mpisync: the torch backend; Allreduce: "
        "mpi4py's in-place MPI_Allreduce of the same bytes (not OSU's method: the raw MPI rows "
        "are); limit: the same reduction as local adds and copies on every rank at once; x gloo: "
        "gloo's time / mpisync's; of limit: the limit's time / mpisync's (1.00x: at the memory "
        f"limit) ({DOCS})"
    )
    return lines


def _grads_lines(rows: list) -> list:
    lines = [
        "",
        "GradSync.allreduce of gradient sets, sum (grads)",
        f"  {'set':<11} {'tensors':>7} {'MB':>7} {'GradSync':>9} {'one-shot':>9} "
        f"{'flat':>8} {'limit':>8} {'x flat':>7} {'of limit':>9}  channel",
    ]
    for row in rows:
        lines.append(
            f"  {row['workload']:<11} {row['tensors']:>7} {row['bytes'] / 1e6:7.1f} "
            f"{row['GradSync_ms']:9.2f} "
            f"{row['allreduce, one-shot_ms']:9.2f} {row['flat Allreduce_ms']:8.2f} "
            f"{row['limit_ms']:8.2f} {ratio_text(row['vs_flat']):>7} "
            f"{ratio_text(row.get('of_limit')):>9}  {row['channel']}"
        )
        if "vs_per_tensor" in row:
            lines.append(
                f"  {'':<11} per-tensor Allreduce loop {row['per-tensor Allreduce_ms']:.2f} ms: "
                f"GradSync {ratio_text(row['vs_per_tensor'])}, one-shot "
                f"{ratio_text(row['one_shot_vs_per_tensor'])} faster"
            )
    lines.append(
        "  times: medians, milliseconds; GradSync: a repeated allreduce of one syncer; "
        "one-shot: mpisync.allreduce (a new syncer per "
        "call); flat: one in-place MPI_Allreduce of the same bytes; limit: the same reduction as "
        "local adds and copies on every rank at once; x flat: flat's time / GradSync's; of limit: "
        f"the limit's time / GradSync's (1.00x: at the memory limit) ({DOCS})"
    )
    return lines


def _ddp_lines(row: dict) -> list:
    return [
        "",
        "one DDP training step, MLP 8 x 1024^2, batch 32 (ddp)",
        f"  mpisync {row['mpisync_ms']:.2f} ms, gloo {row['gloo_ms']:.2f} ms "
        f"(gloo/mpisync {ratio_text(row['speedup_vs_gloo'])}); no communication "
        f"{row['no communication_ms']:.2f} ms (compute/step {row['compute_fraction']:.2f}); "
        f"DDP with a hook that moves nothing {row['DDP, no-op hook_ms']:.2f} ms "
        f"(compute/step {row['compute_fraction_free_communication']:.2f})",
        "  ms: median step time; compute/step: the step without communication / the step "
        f"(1.00: communication costs nothing) ({DOCS})",
    ]


def table(result: dict) -> str:
    """The rows of :func:`run` as plain text, each table with a line saying what its columns
    mean."""
    lines = [
        f"all-reduce bench, {result['ranks']} ranks: medians over "
        f"{result.get('iterations', '?')} iterations of the slowest rank's time"
    ]
    if result.get("sweep"):
        lines += _sweep_lines(result["sweep"])
    if result.get("grads"):
        lines += _grads_lines(result["grads"])
    if "ddp" in result:
        lines += _ddp_lines(result["ddp"])
    return "\n".join(lines + _collectives.table(result))


def parser() -> _argparse.ArgumentParser:
    """The options of this bench (``mpisync bench --allreduce`` passes its own through them)."""
    parser = _argparse.ArgumentParser(
        prog="python -m mpisync.tools.bench.allreduce", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument(
        "--sets",
        nargs="+",
        default=list(GRAD_SETS),
        choices=list(GRAD_SETS),
        help="gradient sets of the grads row",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=list(_collectives.SIZES),
        help="sizes of the collectives row, bytes (those above --max-bytes are left out)",
    )
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    return parser


def main(argv=None) -> int:
    """Command-line entry point: a table (or ``--json``) on rank 0."""
    args = parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    result = run(comm, args)
    if comm.rank == 0:
        print(_json.dumps(result, indent=1) if args.json else table(result))
        _sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
