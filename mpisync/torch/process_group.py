"""``ProcessGroupMPISync``: the ``"mpisync"`` backend's process group over an MPI communicator.

torch's form for a backend written in Python is a ``ProcessGroup`` subclass
(torch's ``Backend`` binding has no constructor a Python class can call): torch
uses the object the backend's creator returns as the group, sets its name and
description through the overridden accessors (so ``group_name``,
``destroy_process_group`` of any group and the group registry work as with
gloo), and calls its Python methods for every collective. Each method builds an
:class:`~mpisync.torch.op.Op` on the calling thread (arguments checked, host
buffers ready, nothing posted), puts it behind the argument check
(:mod:`mpisync.torch.checks`) and hands it to the group's engine
(:mod:`mpisync.torch.engine`), which posts it on the group's own communicator in
issue order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from mpi4py import MPI

from .. import config as _config
from .._runtime.keepalive import keep_alive
from .._runtime.timeouts import timed_out
from ..errors import InvalidParamError, PeerExitedError, SyncTimeoutError
from .checks import checked, checking
from .communicators import agree_on_settings, duplicates
from .engine import Engine
from .errors import ArgumentError, MismatchError, OperationError
from .identity import Identity, backend_type
from .mixed import routed
from .op import Op
from .operations import Operations
from .work import Work, joint

__all__ = ["ProcessGroupMPISync"]


def _settings(max_concurrent, timeout) -> tuple:
    """``(max_concurrent, timeout, refusal)`` of a group being created: the resolved values and
    None, or, where this rank cannot resolve them (an invalid ``MPISYNC_*`` value here only),
    the built-in values (the timeout given, if it is valid) and why, for the ranks to agree on
    before any of them raises."""
    try:
        settings = _config.resolve(max_concurrent, None, None, timeout)
        return settings.max_concurrent.value, settings.timeout.value, None
    except InvalidParamError as exc:
        refusal = str(exc)
    try:
        limit = _config.resolve(None, None, None, timeout, environment=False).timeout.value
    except InvalidParamError:
        limit = _config.BUILTIN_DEFAULTS["timeout"]
    return _config.BUILTIN_DEFAULTS["max_concurrent"], limit, refusal


# torch's stubs list its C++ overloads, which the operations' Python signatures do not repeat
@routed
class ProcessGroupMPISync(Identity, Operations, dist.ProcessGroup):  # type: ignore[misc]
    """The ``"mpisync"`` backend's process group over an MPI communicator.

    torch creates it: :func:`init_process_group`,
    ``torch.distributed.init_process_group("mpisync")`` and ``new_group`` return
    one, and torch's operations (``all_reduce``, ``broadcast``, ...) call its
    methods, which follow torch's ``ProcessGroup`` interface. Construct one
    directly only to use a communicator outside torch's registry.
    Operations are posted in issue order by one engine per group and
    complete as torch's work objects; an operation's errors are raised by its
    ``wait()`` (or by the call, without ``async_op``).

    Args:
        comm: The intracommunicator of the group's ranks. Two duplicates of it are made
            within ``timeout`` (one for the collectives, one for ``send``/``recv``); with
            ``adopt=True`` ``comm`` itself is the first, freed with the group.
        timeout: Seconds each operation, and the group's creation, may take (default
            ``MPISYNC_TIMEOUT``, else 300 s).
        max_concurrent: The most operations in flight at once (``MPISYNC_MAX_CONCURRENT``).
        adopt: Take ``comm`` (and ``p2p``, if given) as the group's own communicators.
        p2p: With ``adopt=True``: the communicator for ``send``/``recv``.
        on_shutdown: Called with whether the group broke when it shuts down.
        others: Device type -> torch backend, from a mixed backend string: those backends serve
            their devices' tensors instead.
        _refusal: Why this rank refuses the group (its creator found it): raised on every rank
            as an ``InvalidParamError`` naming each rank's reason.

    Raises:
        InvalidParamError: At creation, on every rank: some rank's ``MPISYNC_*`` settings or
            arguments cannot be read (the message names each such rank and why).
        MismatchError: The ranks' mpisync settings differ (at creation, on every rank); also an
            operation whose ranks passed different dtypes, sizes, ops or roots.
        ArgumentError: An operation's arguments are invalid or not supported (on every rank,
            before anything is posted).
        CountError: A ``recv`` got a message of another size than its tensor.
        WaitTimeoutError: ``work.wait(timeout)`` timed out.
        OperationTimeoutError: An operation did not complete within the group's timeout (with
            ``MPISYNC_TIMEOUT_ABORT=0``; by default the job is aborted).
        OperationError: An MPI error, or the group is unusable after an earlier failure or
            shut down.
        PeerExitedError: A rank of the group ended its script while others waited.
    """

    def __init__(
        self,
        comm: MPI.Intracomm,
        *,
        timeout: float | None = None,
        max_concurrent: int | None = None,
        adopt: bool = False,
        p2p: MPI.Intracomm | None = None,
        on_shutdown: Callable[[bool], None] | None = None,
        others: dict | None = None,
        _refusal: str | None = None,
    ) -> None:
        # torch binds ProcessGroup(rank, size) too; its stubs list only (store, rank, size)
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]
        capacity, self._timeout, refusal = _settings(max_concurrent, timeout)
        what = "the process group's communicators"
        if not adopt:
            comm, p2p = duplicates(comm, 2, self._timeout, what)
        elif p2p is None:
            p2p = duplicates(comm, 1, self._timeout, what)[0]
        # None once the group is shut down
        self._comm: MPI.Intracomm | None = comm
        self._p2p: MPI.Intracomm | None = p2p
        self._rank, self._size = comm.rank, comm.size
        try:
            # a local refusal (the creator's, or a setting this rank cannot read) is agreed here,
            # so that every rank raises it
            agree_on_settings(comm, self._timeout, "the process group", _refusal or refusal)
        except (MismatchError, InvalidParamError):
            comm.Free()
            p2p.Free()
            raise
        self._checking = checking()
        # DDP's module-state sync by sync_params (mpisync.torch.module_states), agreed above
        self._syncs_states = _config.env_switch("MPISYNC_TORCH_SYNC_PARAMS", True)
        self._engine = Engine(comm, capacity, self._timeout, self._timed_out)
        self._on_shutdown = on_shutdown
        self._name, self._desc = "", ""
        self._coalesced: list | None = None  # entries since _start_coalescing
        self._others = dict(others or {})
        register = getattr(self, "_register_backend", None)  # absent: C++ asks no group
        for kind, backend in self._others.items():  # torch's C++ callers ask the group too
            if register is not None:
                register(torch.device(kind), backend_type(backend), backend)

    @property
    def threaded(self) -> bool:
        """Whether a worker thread completes operations (MPI_THREAD_MULTIPLE), else the caller."""
        return self._engine.threaded

    # -- lifetime ---------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Complete what is in flight (within the timeout), stop the worker, free the
        communicator (kept instead, if operations may still be in flight)."""
        if self._comm is None or self._p2p is None:  # shut down already (both go together)
            return
        self._engine.close()
        if self._engine.broken:  # freeing them with requests in flight can crash the MPI library
            keep_alive(self._comm, self._p2p)
        else:
            self._comm.Free()
            self._p2p.Free()
        self._comm = self._p2p = None
        if self._on_shutdown is not None:
            self._on_shutdown(self._engine.broken)
        for backend in self._others.values():
            backend.shutdown()
        self._others = {}

    def _state_communicator(self) -> tuple:
        """``(communicator, timeout)`` for a sync of module state by :func:`mpisync.sync_params`
        once every collective issued before it is done (they may write the module's tensors):
        the group's ``send``/``recv`` communicator, on which no collective of the engine travels
        (the sync's own run on its duplicate), and the group's timeout. Point-to-point operations
        are not waited for: a receive may be matched only by a send its peer makes after the
        sync."""
        if self._p2p is None:
            raise OperationError("mpisync: the process group is shut down")
        self._engine.drain(collectives_only=True)
        return self._p2p, self._timeout

    def _break_states(self, reason: str) -> None:
        """A module-state sync ended without completing on this rank (an interrupt, a timeout):
        the ranks' sequences on the group's communicators may differ, so the group is unusable
        (every later operation raises :class:`OperationError`)."""
        self._engine.abort(reason)

    def abort(self) -> None:
        """Fail every pending operation and refuse later ones; the job goes on (MPI cannot cancel
        what is in flight: its buffers are kept)."""
        self._engine.abort("the process group was aborted")

    def _timed_out(self, labels: list) -> str:
        # the engine reports a timeout, or a rank of the group that ended its script
        try:
            timed_out(self._comm, "torch.distributed operation", labels, self._timeout)
        except PeerExitedError as exc:
            return str(exc)
        except SyncTimeoutError as exc:
            return f"{exc} The process group's timeout is {self._timeout:g} s."
        return "timed out"

    def _start(self, op: Op, source: list | None = None) -> Work:
        if op.problem is not None and (op.p2p or not self._checking):
            raise ArgumentError(f"mpisync: {op.kind}: {op.problem}")
        if self._checking and not op.p2p:
            steps = checked(self._comm, op, self._rank)
        else:
            steps = op.body(self._p2p if op.p2p else self._comm)
        entry = self._engine.submit(steps, op.label, op.result, op.p2p)
        if self._coalesced is not None:
            self._coalesced.append(entry)
        if op.prepare is not None:
            op.prepare()  # while the check is in flight
        return Work(self._engine, entry, self._rank, source)

    def _start_coalescing(self, device) -> None:
        """torch's coalescing manager: the operations issued until :meth:`_end_coalescing` are
        posted as they come (in issue order, as always) and waited for together."""
        self._coalesced = []

    def _end_coalescing(self, device):
        """One work for the operations issued since :meth:`_start_coalescing`."""
        entries, self._coalesced = self._coalesced or [], None
        return joint(self._engine, entries)
