"""Broadcast of parameter sets across hosts, side by side, with the bytes each host's link received.

Run under mpiexec on several hosts, e.g. the namespace hosts of ``ci/multihost.sh``::

    bash ci/multihost.sh 2 2 --bench [options]      # = --run python benchmarks/multihost_bench.py

Per workload, timed interleaved (each iteration runs every strategy once, in a shuffled order
that is the same on every rank; a barrier before each run; a sample is the slowest rank's time):

- ``per-tensor loop``: one blocking ``Bcast`` per tensor, in sorted order;
- ``flat Bcast``: one ``Bcast`` of one buffer of the same bytes (a reference, not a bound);
- ``first sync``: a new :class:`mpisync.ParamSync` (construction included) and its first sync;
- ``steady``: repeated syncs of one ``ParamSync`` (after three untimed ones);
- ``first F/C`` and ``steady F/C`` for every ``--settings F/C`` (fusion_bytes / max_concurrent).

``net/B``: bytes received on ``eth0`` per synced byte, per host that does not hold root, the
largest over those hosts, averaged over the timed runs (1.00 = each host got the payload once).
Only public API (``ParamSync``) and mpi4py are used. ``--json PATH`` writes every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

import numpy as np
from mpi4py import MPI

import mpisync
from mpisync.tools.workloads import make_params, workload

RX_BYTES = "/sys/class/net/eth0/statistics/rx_bytes"
COLLECTIVES: dict = {}  # strategy -> collectives of one steady sync (from its SyncReport)
WORKLOADS = {
    "torch-resnet50": ("resnet50", "torch"),
    "resnet50": ("resnet50", "numpy"),
    "many-small": ("many-small", "numpy"),
    "bert-base": ("bert-base", "numpy"),
    "gpt2-small": ("gpt2-small", "numpy"),
}


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--workloads", default="torch-resnet50,many-small", help=f"from {', '.join(WORKLOADS)}"
    )
    p.add_argument("--iterations", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--root", type=int, default=0)
    rows = p.add_argument_group("rows", "which strategies are timed beside the steady syncs")
    rows.add_argument("--no-loop", action="store_true", help="skip the per-tensor loop")
    rows.add_argument("--no-first", action="store_true", help="skip first-sync rows")
    rows.add_argument(
        "--settings",
        default="",
        metavar="F/C[/T],...",
        help="extra ParamSync settings fusion_bytes/max_concurrent[/timeout], e.g. 262144/16/0",
    )
    rows.add_argument(
        "--sizes", default="", help="also time flat Bcasts of these byte counts (model fitting)"
    )
    results = p.add_argument_group("results")
    results.add_argument(
        "--json", metavar="PATH", help="append every result as one JSON line (rank 0)"
    )
    results.add_argument("--label", default="", help="a label stored with the JSON results")
    return p.parse_args(argv)


class LinkCounter:
    """Bytes received on this host's eth0, summed over runs; read by one rank per host."""

    def __init__(self, comm):
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.reader = node.rank == 0 and os.path.exists(RX_BYTES)
        # which host each rank is on: the world rank of its first rank
        self.host_index = np.empty(comm.size, np.int64)
        leader = np.array([comm.rank], np.int64)
        node.Bcast(leader, root=0)
        comm.Allgather(leader, self.host_index)
        node.Free()

    def read(self) -> int:
        """The counter now (0 on ranks that do not read it)."""
        if not self.reader:
            return 0
        with open(RX_BYTES) as f:
            return int(f.read())


def timed(comm, fn, counter: LinkCounter):
    """Run ``fn`` between barriers: (seconds on this rank, link bytes this host received).

    The counters are read between barriers: read after the barrier that starts the run, a root
    already sending would count its bytes out of the window, or in the window of the run before.
    """
    comm.Barrier()
    before = counter.read()
    comm.Barrier()
    start = MPI.Wtime()
    fn()
    seconds = MPI.Wtime() - start
    comm.Barrier()
    after = counter.read()
    return seconds, after - before


def strategies(comm, params: dict, root: int, settings: list, args) -> dict:
    """name -> (run, close) for every strategy to time."""
    # torch CPU tensors: numpy views, no copy
    arrays = [np.asarray(params[n]) for n in sorted(params)]
    flat = np.ones(sum(a.nbytes for a in arrays), np.uint8)
    out = {}

    def loop():
        for a in arrays:
            comm.Bcast(a, root)

    if not args.no_loop:
        out["per-tensor loop"] = (loop, None)
    out["flat Bcast"] = (lambda: comm.Bcast(flat, root), None)
    for label, kwargs in settings:
        opened = []

        def first(kwargs=kwargs, opened=opened):
            syncer = mpisync.ParamSync(comm, root=root, **kwargs)
            opened.append(syncer)
            syncer.sync(params)

        def close_all(opened=opened):
            while opened:
                opened.pop().close()

        steady_syncer = mpisync.ParamSync(comm, root=root, **kwargs)
        for _ in range(3):  # untimed: the first sync and the channel trial
            report = steady_syncer.sync(params)
        COLLECTIVES[f"steady{label}"] = report.collectives
        if not args.no_first:
            out[f"first sync{label}"] = (first, close_all)
        out[f"steady{label}"] = (lambda s=steady_syncer: s.sync(params), steady_syncer.close)
    return out


def measure(comm, runs: dict, counter: LinkCounter, iterations: int, warmup: int) -> dict:
    """Interleaved timing: name -> (slowest-rank seconds per iteration, link bytes per host per
    run)."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            timed(comm, runs[name][0], counter)
            if runs[name][1] and name.startswith("first"):
                runs[name][1]()
    seconds = {n: [] for n in names}
    received = {n: 0 for n in names}
    for i in range(iterations):
        order = list(names)
        random.Random(i).shuffle(order)
        for name in order:
            s, r = timed(comm, runs[name][0], counter)
            seconds[name].append(s)
            received[name] += r
            if runs[name][1] and name.startswith("first"):
                runs[name][1]()  # each first sync's syncer is closed outside the timing
    out = {}
    for name in names:
        slowest = np.array(seconds[name])
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        per_rank = np.empty(comm.size, np.int64)
        comm.Allgather(np.array([received[name]], np.int64), per_rank)
        out[name] = (slowest.tolist(), per_rank / iterations)
    for name in names:
        if runs[name][1] and not name.startswith("first"):
            runs[name][1]()
    return out


def net_per_byte(counter: LinkCounter, per_rank_bytes, root: int, payload: int):
    """Largest bytes received per synced byte over the hosts that do not hold root (None: no
    counters)."""
    root_host = counter.host_index[root]
    hosts = sorted(set(counter.host_index.tolist()) - {root_host})
    if not hosts or payload == 0 or not os.path.exists(RX_BYTES):
        return None
    return max(per_rank_bytes[h] for h in hosts) / payload  # the host's first rank read the counter


def parse_settings(text: str) -> list:
    """[(label, kwargs)]: the defaults, then each F/C of ``text``."""
    out = [("", {})]
    for item in filter(None, (t.strip() for t in text.split(","))):
        # F/C, or F/C/0: no timeout (waits inside MPI)
        fusion, concurrent, *timeout = item.split("/")
        kwargs = {"fusion_bytes": int(fusion), "max_concurrent": int(concurrent)}
        if timeout:
            kwargs["timeout"] = float(timeout[0])
        out.append(
            (f" {int(fusion) >> 10}K/{concurrent}{'/' + timeout[0] if timeout else ''}", kwargs)
        )
    return out


def table(title: str, results: dict, payload: int, tensors: int, counter, root) -> str:
    """The text table of one workload."""
    flat = statistics.median(results["flat Bcast"][0])
    lines = [
        f"{title}: {tensors} tensors, {payload / 1e6:.2f} MB",
        f"  {'strategy':<26}{'median ms':>10}{'min-max ms':>18}"
        f"{'x flat':>8}{'GB/s':>7}{'net/B':>7}",
    ]
    for name, (samples, per_rank) in results.items():
        med = statistics.median(samples)
        net = net_per_byte(counter, per_rank, root, payload)
        lines.append(
            f"  {name:<26}{med * 1e3:>10.2f}"
            f"{f'{min(samples) * 1e3:.2f}-{max(samples) * 1e3:.2f}':>18}"
            f"{flat / med:>8.2f}{payload / med / 1e9:>7.2f}{'' if net is None else f'{net:.3f}':>7}"
        )
    return "\n".join(lines)


def flat_sizes(comm, sizes: list, counter, root: int, iterations: int) -> dict:
    """Median slowest-rank seconds of a flat Bcast of each size (for the latency-bandwidth fit)."""
    runs = {}
    for size in sizes:
        buf = np.ones(size, np.uint8)
        runs[f"bcast {size}"] = ((lambda b=buf: comm.Bcast(b, root)), None)
    res = measure(comm, runs, counter, 3 * iterations, 2)
    return {int(k.split()[1]): statistics.median(v[0]) for k, v in res.items()}


def main(argv=None) -> int:
    """Run the bench; rank 0 prints the tables."""
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    counter = LinkCounter(comm)
    hosts = len(set(counter.host_index.tolist()))
    settings = parse_settings(args.settings)
    records = []
    header = (
        f"# {hosts} hosts x {comm.size // max(hosts, 1)} ranks ({comm.size} ranks), root "
        f"{args.root}, "
        f"{args.iterations} iterations; MPICH CVARs: "
        + (
            " ".join(
                f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MPIR_CVAR_")
            )
            or "none"
        )
        + "; env: "
        + (
            " ".join(
                f"{k}={v}"
                for k, v in sorted(os.environ.items())
                if k in ("MPISYNC_FUSION_BYTES", "MPISYNC_MAX_CONCURRENT")
            )
            or "defaults"
        )
    )
    if comm.rank == 0:
        print(header, flush=True)
    for name in filter(None, args.workloads.split(",")):
        shapes_name, library = WORKLOADS[name]
        params = make_params(workload(shapes_name), comm.rank, library)
        payload = sum(np.asarray(a).nbytes for a in params.values())
        runs = strategies(comm, params, args.root, settings, args)
        results = measure(comm, runs, counter, args.iterations, args.warmup)
        if comm.rank == 0:
            print(table(name, results, payload, len(params), counter, args.root), flush=True)
        for strategy, (samples, per_rank) in results.items():
            records.append(
                {
                    "label": args.label,
                    "hosts": hosts,
                    "ranks": comm.size,
                    "workload": name,
                    "strategy": strategy,
                    "tensors": len(params),
                    "bytes": payload,
                    "samples": samples,
                    "collectives": COLLECTIVES.get(strategy),
                    "median": statistics.median(samples),
                    "net_per_byte": net_per_byte(counter, per_rank, args.root, payload),
                }
            )
    if args.sizes:
        sweep = flat_sizes(
            comm, [int(s) for s in args.sizes.split(",")], counter, args.root, args.iterations
        )
        if comm.rank == 0:
            print(
                "flat Bcast by size: "
                + ", ".join(f"{s} B {t * 1e6:.1f} us" for s, t in sweep.items()),
                flush=True,
            )
        records += [
            {
                "label": args.label,
                "hosts": hosts,
                "ranks": comm.size,
                "workload": f"bytes-{s}",
                "strategy": "flat Bcast",
                "tensors": 1,
                "bytes": s,
                "median": t,
            }
            for s, t in sweep.items()
        ]
    if comm.rank == 0 and args.json:
        with open(args.json, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
