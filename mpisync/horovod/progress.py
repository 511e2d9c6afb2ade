"""The negotiation rounds of a Horovod :class:`~mpisync.horovod.engine.Engine`, run as operations
of the torch backend's progress engine (:class:`mpisync.torch.engine.Engine`), so that
``*_async`` operations progress while the caller computes.

A *round* gathers every rank's message (its pending operations, as JSON bytes) in two
nonblocking collectives on the set's own duplicate communicator; its completion hands the
messages to the engine, which runs the operations pending on every rank, then starts the next
round if this rank still has something to say. One round is in flight at a time, so round k of
every rank meets round k of the others, and the transfers that follow a round run in the same
order everywhere. At ``MPI_THREAD_MULTIPLE`` the progress engine's worker drives a round that
nobody waits for: an operation completes once its peers have submitted it, without a
``synchronize``. Below it, rounds run only inside a waiting call, on the caller's thread.

A round that cannot complete within mpisync's timeout is reported as any other (the job aborts,
or with ``MPISYNC_TIMEOUT_ABORT=0`` every pending operation fails with the timeout).
"""

from __future__ import annotations

import threading as _threading
import time as _time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as _np
from mpi4py import MPI

from .._runtime.clock import Deadline
from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired
from .._runtime.timeouts import timed_out
from ..errors import PeerExitedError, SyncTimeoutError

if TYPE_CHECKING:
    from ..torch.entry import Entry

__all__ = ["Rounds"]

# After a round in which nothing ran (operations pending on some ranks only, none waiting on
# every rank), the next starts after a pause rather than at once: the first pause is short (a
# peer a little behind submits soon), each idle round after it doubles it up to the longest
# (Horovod's cycle time), so peers far behind do not keep the cores busy with empty rounds.
IDLE_ROUND_SECONDS = (0.00005, 0.002)

PHASE = "Horovod negotiation"


class Rounds:
    """The rounds of one engine on a duplicate of ``comm``. ``say()`` gives this rank's message
    for the next round and the names it waits for (``None``: nothing to say, no round);
    ``settle(comm, call, messages)`` acts on a round's messages (``call(request)`` waits for one
    request, under the timeout) and returns whether anything ran."""

    def __init__(
        self,
        comm,
        timeout: float | None,
        say: Callable[[], tuple[bytes, list] | None],
        settle: Callable,
    ):
        from ..torch.communicators import duplicates
        from ..torch.engine import Engine as Progress

        self.timeout = timeout
        self.comm = duplicates(comm, 1, timeout, "the Horovod engine's communicator")[0]
        self._say, self._settle = say, settle
        self._progress = Progress(self.comm, 1, timeout, self._timed_out)
        self.threaded = self._progress.threaded
        self._lock = _threading.RLock()  # a round completes inside submit() below THREAD_MULTIPLE
        self._busy = False  # a round is in flight (posted, its completion not yet run)
        self._entry: Entry | None = None  # the latest round's entry
        self._names: list = []  # what the latest round waits for (the timeout's diagnostic)
        self._told: Entry | None = None  # the failed round failure() reported
        self._pause = IDLE_ROUND_SECONDS[0]  # before the next round, after an idle one

    def kick(self):
        """Start a round unless one is in flight or this rank has nothing to say; the round in
        flight (its progress entry), or ``None``."""
        with self._lock:
            if self._busy:
                return self._entry
            said = self._say()
            if said is None:
                return None
            payload, self._names = said
            self._busy = True
            self._entry = entry = self._progress.submit(self._round(payload), PHASE)
        if self.threaded:
            self._progress.future(entry)  # the worker drives it while nobody waits
        return entry

    def wait(self, entry) -> BaseException | None:
        """Wait for the round ``entry`` (driving it); what it failed with, or ``None``."""
        self._progress.wait(entry)
        return entry.error

    def failure(self) -> BaseException | None:
        """What the latest round failed with (a timeout, a broken engine), the first time it is
        asked; else ``None`` (operations submitted after it are not failed with it)."""
        with self._lock:
            entry = self._entry
            if entry is None or not entry.done or entry.error is None or entry is self._told:
                return None
            self._told = entry
            return entry.error

    def close(self, abandon: bool = False) -> None:
        """Stop the progress engine; a round still in flight (peers that never answered), or
        any where ``abandon`` (a run was interrupted), is abandoned, its communicator kept (MPI
        may still use it)."""
        with self._lock:
            busy = self._busy and self._entry is not None and not self._entry.done
        if busy or abandon or self._progress.broken:
            self._progress.abort("mpisync.horovod was shut down")
            self._progress.close()
            keep_alive(self.comm)
        else:
            self._progress.close()
            self.comm.Free()

    def _round(self, payload: bytes):
        comm = self.comm
        lengths = _np.empty(comm.size, dtype=_np.int64)
        yield [comm.Iallgather(_np.array([len(payload)], dtype=_np.int64), lengths)], False
        displs = _np.zeros(comm.size, dtype=_np.int64)
        _np.cumsum(lengths[:-1], out=displs[1:])
        recv = _np.empty(int(lengths.sum()), dtype=_np.uint8)
        send = _np.frombuffer(payload, dtype=_np.uint8)
        counts = (lengths.tolist(), displs.tolist())
        yield [comm.Iallgatherv(send, [recv, counts, MPI.BYTE])], True
        messages = [recv[d : d + n].tobytes() for d, n in zip(displs.tolist(), lengths.tolist())]
        deadline = Deadline(self.timeout, comm=comm)
        try:
            progressed = self._settle(comm, deadline.wait, messages)
        except Expired:
            timed_out(comm, PHASE, self._names, self.timeout, pending_what="pending operation(s)")
            raise
        finally:
            with self._lock:
                self._busy = False
        if self.threaded:
            if progressed:
                self._pause = IDLE_ROUND_SECONDS[0]
            else:
                _time.sleep(self._pause)
                self._pause = min(2 * self._pause, IDLE_ROUND_SECONDS[1])
            self.kick()

    def _timed_out(self, labels: list) -> str:
        try:
            timed_out(self.comm, PHASE, self._names, self.timeout, pending_what="pending")
        except (PeerExitedError, SyncTimeoutError) as exc:
            return str(exc)
        return "timed out"
