"""When one rank fails outside mpisync's own calls, every rank learns it within seconds.

Under a launcher (``MPI.COMM_WORLD`` of more than one process), once mpisync is imported:

- **An exception escapes the script** on some rank: ``sys.excepthook`` prints its traceback
  (through the hook that was there before), then one line naming the rank, then aborts the job
  (``MPI_Abort`` on ``MPI.COMM_WORLD``), as ``python -m mpi4py`` does. The launcher ends every
  rank; nobody waits out a timeout for an error one rank already saw.
- **The script ends** on some rank (normally, through ``sys.exit``, or by calling
  ``MPI.Finalize()`` itself) while others still wait for it in an mpisync collective: the rank
  sends every other rank a departure note (one integer), at exit and, should the script finalize
  MPI first, from inside ``MPI_Finalize`` (the delete callback of an attribute on
  ``MPI.COMM_SELF``, which MPI runs first thing in ``MPI_Finalize``, while MPI still works).
  Every mpisync wait polls for notes (at most every :data:`POLL_SECONDS`) and, once a rank of the
  communicator it waits on has left, ends the wait as a timeout does
  (:func:`mpisync._runtime.timeouts.timed_out`): the diagnostic names the rank that left, then
  the job aborts (or, with ``MPISYNC_TIMEOUT_ABORT=0``, :class:`~mpisync.errors.PeerExitedError`
  is raised). Ranks that are not waiting never look: a rank that finishes early while the others
  do other work is no error. After the notes are sent, nothing of mpisync's stays posted: the
  note receive is cancelled and completed before ``MPI_Finalize`` goes on.

The notes travel on a communicator of mpisync's own, never on the caller's: a duplicate of
``MPI.COMM_WORLD`` (so a user's ``recv(source=ANY_SOURCE, tag=ANY_TAG)`` on ``MPI.COMM_WORLD``
or any other communicator of theirs never matches one). Making it is the one collective mpisync
starts at import, and the choice of how follows from two facts: MPI has no way to make a
communicator without every member taking part (``MPI_Comm_create_group`` and
``MPI_Comm_create_from_group`` are collective over the group, and block); and the ranks must
already share it when one of them ends its script before its first mpisync call, however early
(a rank that imports mpisync and exits at once still ends the others' first ``sync_params``).
Waiting for the first mpisync object instead would not do: that call is collective over the
object's communicator only, which need not span the world, and a rank that exits before it would
never share the channel. So :func:`install` starts a *nonblocking* duplication
(``MPI_Comm_idup``): the import never waits for the other ranks; the duplication completes once
every rank has imported mpisync (any later MPI call progresses it), and only then are notes
received or sent (a rank that exits first waits for it at most :data:`_SEND_SECONDS`). Importing
mpisync on every rank, as every mpisync program does, is therefore required of a program that
keeps fail-fast on: on the ranks that imported it the duplication takes its place in the order
of nonblocking collectives on ``MPI.COMM_WORLD``, so a program that imports mpisync on some
ranks only and then runs nonblocking collectives (``Ibarrier``, ``Iallreduce``, ...) on
``MPI.COMM_WORLD`` must set ``MPISYNC_FAIL_FAST=0`` (blocking collectives are unaffected with
MPICH); there, a rank that imported mpisync waits :data:`_SEND_SECONDS` at exit for the
duplication and leaves it pending.

``MPISYNC_FAIL_FAST=0`` turns both off. Departure notes (and the duplication) are used only
where the launcher says every rank is on this node (``MPI_LOCALNRANKS``: MPICH's and Intel MPI's
mpiexec; ``OMPI_COMM_WORLD_LOCAL_SIZE``: Open MPI's) and the world has at most
:data:`MAX_NOTED_WORLD` processes (each rank sends one note to every other at exit). Across nodes
the notes are off: with MPICH over UCX/TCP, messages posted at exit to ranks on other hosts kept
the job from finalizing (3 hosts x 2 ranks, ci/multihost.sh); there only the exception hook is
installed, and a rank that exits is reported by the others' timeout.
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

__all__ = [
    "install",
    "installed",
    "watching",
    "settle",
    "mark_everywhere",
    "departed_in",
    "describe_departure",
    "Lookout",
]

SETTING = "MPISYNC_FAIL_FAST"
#: Seconds between two looks at the departure notes while a wait is in progress.
POLL_SECONDS = 0.05
#: The largest world that sends departure notes (n - 1 small messages per rank at exit).
MAX_NOTED_WORLD = 1024
# Seconds the exit waits for its notes to be sent; a peer that never progresses cannot hold it.
_SEND_SECONDS = 2.0
# Seconds between writing the summary line and aborting, so the launcher forwards the output.
_GRACE_SECONDS = 0.5
# Seconds the first mpisync call on a communicator of the whole world waits for the notes' own
# duplication (every rank is in that call: it completes at once unless a rank never started it).
_SETTLE_SECONDS = 10.0
# The tag of a note on the private communicator, where nothing else travels.
_NOTE_TAG = 0


class _Watch:
    """This process's departure notes: mpisync's own duplicate of ``MPI.COMM_WORLD`` (usable
    once its nonblocking duplication completed), one receive posted on it, the ranks that left."""

    def __init__(self, world):
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.lock = _threading.Lock()
        self.note = _np.zeros(1, dtype=_np.int32)
        self.status = MPI.Status()
        # the private communicator, and its duplication while in flight (None once complete)
        self.comm, self.duplication = world.Idup()
        self.request: MPI.Request | None = None  # the note receive, once the channel is ready
        self.departed: set[int] = set()
        self.closed = False  # the notes of this rank are sent: nothing is posted any more

    def _ready(self) -> bool:
        """Whether the channel is usable (under ``lock``); posts the receive the first time."""
        if self.duplication is not None:
            if not self.duplication.Test():
                return False
            self.duplication = None
            self.request = self.comm.Irecv(self.note, MPI.ANY_SOURCE, _NOTE_TAG)
        return True

    def _collect(self) -> None:
        """Record the notes that arrived (under ``lock``, channel ready)."""
        while self.request is not None and self.request.Test(self.status):
            self.departed.add(self.status.Get_source())
            self.request = self.comm.Irecv(self.note, MPI.ANY_SOURCE, _NOTE_TAG)

    def poll(self, blocking: bool = False) -> None:
        """Collect the notes that arrived (skipped if another thread is collecting)."""
        if not self.lock.acquire(blocking=blocking):
            return
        try:
            if not self.closed and self._ready():
                self._collect()
        finally:
            self.lock.release()

    def depart(self) -> None:
        """Send this rank's note to every rank that has not left, then cancel and complete the
        receive: afterwards nothing of this watch is posted. Bounded by :data:`_SEND_SECONDS`
        (a peer that never progresses cannot hold the exit); what is still in flight then is
        kept alive, never freed under MPI."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            end = _time.monotonic() + _SEND_SECONDS
            while not self._ready():  # every rank imported mpisync: complete at once
                if _time.monotonic() >= end:
                    keep_alive(self.comm, self.duplication)  # a collective: no cancelling it
                    return
                _time.sleep(0.001)
            self._collect()
            note = _np.array([self.rank], dtype=_np.int32)
            pending = [
                self.comm.Isend(note, rank, _NOTE_TAG)
                for rank in range(self.size)
                if rank != self.rank and rank not in self.departed
            ]
            receive, self.request = self.request, None
            if receive is not None:
                receive.Cancel()
                pending.append(receive)
            while not MPI.Request.Testall(pending):
                if _time.monotonic() >= end:
                    keep_alive(note, self.note, self.comm, *pending)
                    return
                _time.sleep(0.001)


_watch: _Watch | None = None
_installed_pid: int | None = None
_previous_hook = None
# The attribute on MPI.COMM_SELF whose deletion (first thing in MPI_Finalize) sends the notes.
_finalize_keyval: int | None = None


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
        _depart_at_finalize()


def _depart_at_finalize() -> None:
    """Send the notes from inside ``MPI_Finalize`` too, for a script that calls it itself:
    ``MPI_Finalize`` deletes ``MPI.COMM_SELF``'s attributes first, while MPI still works (MPI
    standard, "Allowing User Functions at Process Termination"), and Python's exit handlers run
    only after it."""
    global _finalize_keyval
    _finalize_keyval = MPI.Comm.Create_keyval(delete_fn=_finalizing)
    MPI.COMM_SELF.Set_attr(_finalize_keyval, True)


def _finalizing(comm, keyval, value) -> None:
    """The attribute's delete callback: ``MPI_Finalize`` has begun."""
    _depart()


def settle(comm) -> None:
    """Before mpisync duplicates ``comm`` at its first call there: when ``comm`` spans the whole
    world, wait until the notes' own duplication of ``MPI.COMM_WORLD`` (started at import) has
    completed, so that two duplications of one communicator are never in flight at once (Open
    MPI's nonblocking context-id agreement fails now and then with several). Every rank is in
    that call, collective over ``comm``, so the wait is short; bounded by
    :data:`_SETTLE_SECONDS` all the same. A communicator of fewer ranks never waits: the ranks
    outside it need not be in MPI now."""
    watch = _watch
    if watch is None or not installed() or watch.duplication is None:
        return
    if comm is None or comm.Get_size() != watch.size:
        return
    end = _time.monotonic() + _SETTLE_SECONDS
    while watch.duplication is not None and not watch.closed and _time.monotonic() < end:
        watch.poll(blocking=True)
        if watch.duplication is not None:
            _time.sleep(0.001)


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


def mark_everywhere(error: BaseException, comm) -> BaseException:
    """Mark ``error`` as one that every rank of ``comm`` raises with the same message; returns
    it. Uncaught, its traceback is then printed by ``comm``'s first rank only, and the others
    print one line pointing there (mpiexec would interleave as many copies as there are ranks)."""
    if comm is not None and comm.Get_size() > 1 and not MPI.Is_finalized():
        try:
            error.mpisync_printed_by = _world_ranks(comm)[0]  # type: ignore[attr-defined]
        except MPI.Exception:  # the traceback stays on every rank
            pass
    return error


def _excepthook(kind, value, traceback) -> None:
    hook = _previous_hook if _previous_hook is not None else _sys.__excepthook__
    printer = getattr(value, "mpisync_printed_by", None)
    alive = installed() and not MPI.Is_finalized()
    rank = MPI.COMM_WORLD.Get_rank() if alive else None
    pointer = printer is not None and rank is not None and printer != rank
    if pointer:
        _sys.stderr.write(
            f"mpisync: rank {rank}: {kind.__name__}, the same error every rank raised: rank "
            f"{printer} prints its message and traceback\n"
        )
    else:
        hook(kind, value, traceback)  # the traceback first
    if not alive:
        return
    world = MPI.COMM_WORLD
    _sys.stderr.write(
        f"mpisync: rank {world.Get_rank()} of {world.Get_size()} ended with an uncaught "
        f"{kind.__name__}; aborting the job so that no other rank waits for it "
        f"({SETTING}=0 turns this off)\n"
    )
    if pointer:  # the rank that prints the traceback raised the same: let it print first
        _time.sleep(_GRACE_SECONDS * 2)
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
    """At exit, or first thing in ``MPI_Finalize``: a note to every rank that has not left yet,
    once (bounded: never holds the exit)."""
    watch = _watch
    if watch is None or not installed() or MPI.Is_finalized():
        return
    try:
        watch.depart()
    except MPI.Exception:  # a peer already gone: exiting goes on
        pass
