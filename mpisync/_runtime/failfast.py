"""When one rank fails outside mpisync's own calls, every rank learns it within seconds.

Under a launcher (``MPI.COMM_WORLD`` of more than one process), once mpisync is imported:

- **An exception escapes the script** on some rank: ``sys.excepthook`` prints its traceback
  (through the hook that was there before), then one line naming the rank, then aborts the job
  (``MPI_Abort`` on ``MPI.COMM_WORLD``), as ``python -m mpi4py`` does. The launcher ends every
  rank; nobody waits out a timeout for an error one rank already saw.
- **The script ends** on some rank (normally, or through ``sys.exit``) while others still wait
  for it in an mpisync collective: at exit the rank sends every other rank a departure note (one
  integer, a reserved tag on ``MPI.COMM_WORLD``). Every mpisync wait polls for notes (at most
  every :data:`POLL_SECONDS`) and, once a rank of the communicator it waits on has left, ends
  the wait as a timeout does (:func:`mpisync._runtime.timeouts.timed_out`): the diagnostic names
  the rank that left, then the job aborts (or, with ``MPISYNC_TIMEOUT_ABORT=0``,
  :class:`~mpisync.errors.PeerExitedError` is raised). Ranks that are not waiting never look:
  a rank that finishes early while the others do other work is no error.

``MPISYNC_FAIL_FAST=0`` turns both off. Departure notes are sent only where the launcher says
every rank is on this node (``MPI_LOCALNRANKS``: MPICH's and Intel MPI's mpiexec;
``OMPI_COMM_WORLD_LOCAL_SIZE``: Open MPI's) and the world has at most :data:`MAX_NOTED_WORLD`
processes (each rank sends one note to every other at exit). Across nodes the notes are off:
with MPICH over UCX/TCP, messages posted at exit to ranks on other hosts kept the job from
finalizing (3 hosts x 2 ranks, ci/multihost.sh); there only the exception hook is installed, and
a rank that exits is reported by the others' timeout.
"""

from __future__ import annotations

import atexit as _atexit
import os as _os
import sys as _sys
import threading as _threading
import time as _time

import numpy as _np
from mpi4py import MPI

from .. import config as _config
from .abort import abort_job
from .keepalive import keep_alive

__all__ = ["install", "installed", "watching", "departed_in", "describe_departure", "Lookout"]

SETTING = "MPISYNC_FAIL_FAST"
#: Seconds between two looks at the departure notes while a wait is in progress.
POLL_SECONDS = 0.05
#: The largest world that sends departure notes (n - 1 small messages per rank at exit).
MAX_NOTED_WORLD = 1024
# Seconds the exit waits for its notes to be sent; a peer that never progresses cannot hold it.
_SEND_SECONDS = 2.0
# Seconds between writing the summary line and aborting, so the launcher forwards the output.
_GRACE_SECONDS = 0.5


class _Watch:
    """This process's departure notes: one receive always posted, the world ranks that left."""

    def __init__(self, world):
        self.world = world
        # MPI's largest tag: mpisync's own point-to-point tags stay below 32768 (the minimum
        # TAG_UB), so a note never meets a message of mpisync's, and a user's almost never.
        self.tag = int(world.Get_attr(MPI.TAG_UB))
        self.lock = _threading.Lock()
        self.note = _np.zeros(1, dtype=_np.int32)
        self.status = MPI.Status()
        self.request = world.Irecv(self.note, MPI.ANY_SOURCE, self.tag)
        self.departed: set[int] = set()

    def poll(self, blocking: bool = False) -> None:
        """Collect the notes that arrived (skipped if another thread is collecting)."""
        if not self.lock.acquire(blocking=blocking):
            return
        try:
            while self.request is not None and self.request.Test(self.status):
                self.departed.add(self.status.Get_source())
                self.request = self.world.Irecv(self.note, MPI.ANY_SOURCE, self.tag)
        finally:
            self.lock.release()


_watch: _Watch | None = None
_installed_pid: int | None = None
_previous_hook = None


def installed() -> bool:
    """Whether this process aborts the job on an uncaught exception."""
    return _installed_pid == _os.getpid()


def watching() -> bool:
    """Whether waits should look for departure notes (several ranks, notes on)."""
    return _watch is not None and installed()


def install() -> None:
    """Install the exception hook and the departure notes, once per process; nothing in a world
    of one, before MPI is initialised, or with ``MPISYNC_FAIL_FAST=0``."""
    global _watch, _installed_pid, _previous_hook
    if installed() or not _config.env_switch(SETTING, True):
        return
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        return
    _installed_pid = _os.getpid()
    _previous_hook = _sys.excepthook
    _sys.excepthook = _excepthook
    if world.Get_size() <= MAX_NOTED_WORLD and _one_node(world.Get_size()):
        _watch = _Watch(world)
        _atexit.register(_depart)


def _one_node(size: int) -> bool:
    """Whether the launcher says all ``size`` ranks run on this node."""
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        raw = _os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw) == size
    return False


def departed_in(comm) -> list[int]:
    """The ranks of ``comm`` (in ``comm``'s numbering) whose scripts have ended; ``[]`` when
    none did or nobody watches. Polling loops call it through a :class:`Lookout`, which spaces
    the looks :data:`POLL_SECONDS` apart."""
    watch = _watch
    if watch is None or comm is None or not installed():
        return []
    watch.poll()
    if not watch.departed:
        return []
    return [
        rank for rank, world_rank in enumerate(_world_ranks(comm)) if world_rank in watch.departed
    ]


class Lookout:
    """One wait's look at the departure notes for ``comm``'s ranks: :meth:`gone` costs a
    comparison until :data:`POLL_SECONDS` have passed (a wait's polling loop calls it between
    two tests of its requests, and MPI progresses only inside those)."""

    __slots__ = ("comm", "next_look")

    def __init__(self, comm):
        self.comm = comm if comm is not None and watching() else None
        self.next_look = _time.monotonic() + POLL_SECONDS

    def gone(self, now: float) -> bool:
        """Whether a rank of ``comm`` has ended its script (``now``: ``time.monotonic()``)."""
        if self.comm is None or now < self.next_look:
            return False
        self.next_look = now + POLL_SECONDS
        return bool(departed_in(self.comm))


def describe_departure(comm, gone: list[int]) -> str:
    """The sentence a wait on ``comm`` ends with when the ranks ``gone`` have left."""
    who = f"rank {gone[0]}" if len(gone) == 1 else f"ranks {', '.join(map(str, gone))}"
    verb = "has" if len(gone) == 1 else "have"
    return (
        f"{who} of this communicator {verb} already ended its script (it exited while this rank "
        "waits for it in a collective), so the collective can never complete; look for that "
        "rank's output above"
    )


def _world_ranks(comm) -> list:
    """``comm``'s ranks as ``MPI.COMM_WORLD`` numbers them."""
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world)
    finally:
        group.Free()
        world.Free()


def _excepthook(kind, value, traceback) -> None:
    hook = _previous_hook if _previous_hook is not None else _sys.__excepthook__
    hook(kind, value, traceback)  # the traceback first
    if not installed() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    _sys.stderr.write(
        f"mpisync: rank {world.Get_rank()} of {world.Get_size()} ended with an uncaught "
        f"{kind.__name__}; aborting the job so that no other rank waits for it "
        f"({SETTING}=0 turns this off)\n"
    )
    if _sys.stderr is _sys.__stderr__:
        _abort_now()
    # A hook installed after this one (torch's, which prefixes each line with the rank) holds
    # what was written in a buffer until this hook returns: abort once it has written it, at the
    # first exit handler (registered last, run first), or from a thread should the exit wait.
    _atexit.register(_abort_now)
    timer = _threading.Timer(_GRACE_SECONDS * 4, _abort_now)
    timer.daemon = True
    timer.start()


def _abort_now() -> None:
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the job from ending
            pass
    _time.sleep(_GRACE_SECONDS)
    abort_job(MPI.COMM_WORLD)


def _depart() -> None:
    """At exit: a note to every rank that has not left yet (bounded: never holds the exit)."""
    watch = _watch
    if watch is None or not installed() or MPI.Is_finalized():
        return
    world = watch.world
    try:
        watch.poll(blocking=True)
        with watch.lock:
            receive, watch.request = watch.request, None
            note = _np.array([world.Get_rank()], dtype=_np.int32)
            pending = [
                world.Isend(note, rank, watch.tag)
                for rank in range(world.Get_size())
                if rank != world.Get_rank() and rank not in watch.departed
            ]
        if receive is not None:
            receive.Cancel()
            pending.append(receive)
        end = _time.monotonic() + _SEND_SECONDS
        while not MPI.Request.Testall(pending):
            if _time.monotonic() >= end:
                keep_alive(note, *pending)
                return
            _time.sleep(0.001)
    except MPI.Exception:  # a peer already gone: exiting goes on
        pass
