"""``mpisync tune``: measure the host transports here and write the tuning file that
:mod:`mpisync.transports.tuning` reads."""

from __future__ import annotations

import argparse as _argparse
import array as _array
import json as _json
import statistics as _statistics
import sys as _sys
import time as _time

from .. import config as _config
from .._runtime import safefiles
from ..errors import InvalidParamError
from ..transports.tuning import FORMAT, identity, tuning_path
from .outputs import prepare_output


def _measure(comm, params, channel: str, rounds: int, first: bool) -> float:
    """The slowest rank's median seconds of a sync through ``channel`` (a new syncer per sync if
    ``first``)."""
    from mpi4py import MPI

    from ..sync import ParamSync

    times = []
    syncer = None
    for _ in range(rounds + (0 if first else 2)):
        if syncer is None or first:
            if syncer is not None:
                syncer.close()
            syncer = ParamSync(comm)
            syncer._prefer(channel)
        comm.Barrier()
        start = _time.perf_counter()
        syncer.sync(params)
        elapsed = _array.array("d", [_time.perf_counter() - start])
        # a buffer call: nothing from peers is unpickled
        comm.Allreduce(MPI.IN_PLACE, elapsed, op=MPI.MAX)
        times.append(elapsed[0])
    assert syncer is not None  # rounds >= 1: main checks it
    syncer.close()
    return _statistics.median(times if first else times[2:])


def parser() -> _argparse.ArgumentParser:
    """The options of ``mpisync tune``."""
    parser = _argparse.ArgumentParser(prog="mpisync tune")
    parser.add_argument("--rounds", type=int, default=5, help="syncs timed per transport and set")
    parser.add_argument("--output", help="where to write (default: the tuning file's location)")
    return parser


def problem(opt, rank: int = 0) -> str:
    """What is wrong with the options ``opt`` (checked on every rank before anything is measured),
    or "". Rank 0, which writes the file, creates its folder (:mod:`mpisync.tools.outputs`)."""
    if opt.rounds < 1:
        return f"--rounds must be >= 1, got {opt.rounds}"
    try:
        _config.resolve()
    except InvalidParamError as exc:  # a bad MPISYNC_* setting: every measured sync would raise it
        return f"{exc} (see `mpisync info`)"
    path = opt.output or tuning_path()
    if rank != 0:
        return ""
    return prepare_output(path, "--output")


def main(comm, args=None) -> int:
    """Check the options (``args``: ``--rounds``, ``--output``), then :func:`run`; status 2 on
    every rank at once when an option is wrong there."""
    opt = parser().parse_args(args)
    wrong = problem(opt, comm.rank)
    if wrong:
        if comm.rank == 0:
            print(f"mpisync tune: error: {wrong}", file=_sys.stderr, flush=True)
        return 2
    return run(comm, opt)


def run(comm, opt) -> int:
    """Measure each host transport on two parameter sets (small tensors, large ones), first sync and
    repeated, and write the tuning file on rank 0 (the path is printed)."""
    from .._runtime.clock import Deadline
    from ..transports.selection import CHANNELS, gather_facts
    from .workloads import make_params, many_small, resnet50

    dup = comm.Dup()
    try:
        facts = gather_facts(dup, Deadline(None).wait)
        sets = {
            "small": make_params(many_small(), comm.rank),
            "large": make_params(resnet50(), comm.rank),
        }
        entries, measured = {}, {}
        for cls, params in sets.items():
            scores = {}
            for channel in CHANNELS:
                first = _measure(dup, params, channel, opt.rounds, True)
                steady = _measure(dup, params, channel, opt.rounds, False)
                # A job syncs a handful of times: the first sync counts as much as four repeated
                # ones.
                scores[channel] = first + 4 * steady
                measured[f"{cls}/{channel}"] = {
                    "first_ms": round(first * 1e3, 3),
                    "repeated_ms": round(steady * 1e3, 3),
                }
            entries[cls] = min(scores, key=scores.__getitem__)
        if comm.rank == 0:
            path = opt.output or tuning_path()
            doc = {
                "format": FORMAT,
                "identity": identity(facts.layout()),
                "entries": entries,
                "measured": measured,
                "written": _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime()),
            }
            write_file(path, _json.dumps(doc, indent=2))
            print(f"mpisync tune: wrote {path}: {_json.dumps(entries)}")
            for key, row in measured.items():
                print(
                    f"  {key:28s} first {row['first_ms']:9.3f} ms   repeated "
                    f"{row['repeated_ms']:9.3f} ms"
                )
    finally:
        dup.Free()
    return 0


def write_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all, mode ``0644`` less the umask: into a fresh
    file of the target's folder, renamed over ``path``; a folder another user owns or may write
    into, or a symlink at ``path``, is refused (:mod:`mpisync._runtime.safefiles`)."""
    safefiles.write(path, text, 0o644)
