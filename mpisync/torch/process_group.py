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
from ..errors import PeerExitedError, SyncTimeoutError
from . import movement, p2p, reductions
from .checks import checked, checking
from .communicators import agree_on_settings, duplicates
from .engine import Engine
from .errors import ArgumentError, MismatchError
from .identity import Identity, backend_type
from .mixed import routed
from .op import Op, combined
from .work import Work, joint

__all__ = ["ProcessGroupMPISync"]


@routed
class ProcessGroupMPISync(Identity, dist.ProcessGroup):
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

    Raises:
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
    ) -> None:
        # torch binds ProcessGroup(rank, size) too; its stubs list only (store, rank, size)
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]
        settings = _config.resolve(max_concurrent, None, None, timeout)
        self._timeout = settings.timeout.value
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
            agree_on_settings(comm, self._timeout, "the process group")
        except MismatchError:
            comm.Free()
            p2p.Free()
            raise
        self._checking = checking()
        self._engine = Engine(comm, settings.max_concurrent.value, self._timeout, self._timed_out)
        self._on_shutdown = on_shutdown
        self._name, self._desc = "", ""
        self._coalesced: list | None = None  # entries since _start_coalescing
        self._others = dict(others or {})
        for kind, backend in self._others.items():  # torch's C++ callers ask the group too
            self._register_backend(torch.device(kind), backend_type(backend), backend)

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

    # -- collectives (torch calls a Python group's collectives as (tensors, ..., opts); its stubs
    # list the C++ overloads as well: the override ignores) ------------------------------------
    def allreduce(self, tensors, opts=None):  # type: ignore[override]
        """All-reduce each tensor in place (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR; a
        sparse COO tensor: SUM)."""
        return self._start(reductions.all_reduce(self._size, tensors, opts))

    def allreduce_coalesced(self, tensors, opts=None):
        """As :meth:`allreduce`, one operation for all of ``tensors``."""
        return self._start(reductions.all_reduce(self._size, tensors, opts, "all_reduce_coalesced"))

    def reduce(self, tensors, opts):  # type: ignore[override]
        """Reduce into ``opts.rootRank``'s tensors."""
        return self._start(reductions.reduce(self._rank, self._size, tensors, opts))

    def broadcast(self, tensors, opts=None):  # type: ignore[override]
        """``opts.rootRank``'s tensors into every rank's."""
        opts = dist.BroadcastOptions() if opts is None else opts
        return self._start(movement.broadcast(self._size, tensors, opts))

    def allgather(self, output_tensors, input_tensors, opts=None):
        """Every rank's ``input_tensors[i]`` into ``output_tensors[i][rank]``."""
        return self._start(movement.all_gather(self._size, output_tensors, input_tensors))

    def all_gather_single(self, output, input, opts=None):
        """``all_gather_into_tensor``: every rank's ``input`` end to end in ``output``."""
        return self._start(movement.all_gather_into_tensor(self._rank, self._size, output, input))

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``all_gather_coalesced``: every rank's ``input_list[i]`` into
        ``output_lists[rank][i]``."""
        return self._start(movement.all_gather_coalesced(self._size, output_lists, input_list))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """:meth:`all_gather_single` of each pair, as one operation."""
        ops = [
            movement.all_gather_into_tensor(self._rank, self._size, o, i)
            for o, i in zip(outputs, inputs)
        ]
        return self._start(combined("all_gather_into_tensor", ops, list(outputs)))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts):  # type: ignore[override]
        """Every rank's ``input_tensors[0]`` into ``output_tensors[0][rank]`` on the root."""
        op = movement.gather(self._rank, self._size, output_tensors, input_tensors, opts)
        return self._start(op)

    def scatter(self, output_tensors, input_tensors, opts):  # type: ignore[override]
        """``input_tensors[0][r]`` on the root into rank ``r``'s ``output_tensors[0]``."""
        op = movement.scatter(self._rank, self._size, output_tensors, input_tensors, opts)
        return self._start(op)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):  # type: ignore[override]
        """``input_tensors[0][r]`` reduced over the ranks into rank ``r``'s ``output_tensors[0]``
        (pieces of any sizes, the same on every rank)."""
        ops = [
            reductions.reduce_scatter(self._rank, self._size, out, pieces, opts)
            for out, pieces in zip(output_tensors, input_tensors)
        ]
        return self._start(
            ops[0] if len(ops) == 1 else combined("reduce_scatter", ops, output_tensors)
        )

    def reduce_scatter_single(self, output, input, opts=None):
        """``reduce_scatter_tensor``: ``input`` reduced; this rank keeps its block."""
        op = reductions.reduce_scatter_tensor(self._rank, self._size, output, input, opts)
        return self._start(op)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """:meth:`reduce_scatter_single` of each pair, as one operation."""
        ops = [
            reductions.reduce_scatter_tensor(self._rank, self._size, o, i, opts)
            for o, i in zip(outputs, inputs)
        ]
        return self._start(combined("reduce_scatter_tensor", ops, list(outputs)))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """``input_tensors[j]`` to rank ``j``, ``output_tensors[j]`` from it."""
        op = movement.all_to_all(self._rank, self._size, output_tensors, input_tensors)
        return self._start(op)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """Rows of ``input`` to each rank, of ``output`` from each: equal, or by split sizes."""
        op = movement.all_to_all_single(
            self._size, output, input, output_split_sizes, input_split_sizes
        )
        return self._start(op)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        """Complete once every rank reached it (and everything issued before it completed)."""
        return self._start(movement.barrier())

    def send(self, tensors, dstRank: int, tag: int = 0):  # noqa: N803
        """Send ``tensors`` to ``dstRank`` with ``tag``."""
        return self._start(p2p.send(self._rank, self._size, tensors, dstRank, tag))

    def recv(self, tensors, srcRank: int, tag: int = 0):  # noqa: N803
        """Receive ``tensors`` from ``srcRank`` with ``tag`` (of exactly their size)."""
        source = [srcRank]
        return self._start(p2p.recv(self._rank, self._size, tensors, srcRank, tag, source), source)

    def recv_anysource(self, tensors, tag: int = 0):
        """Receive ``tensors`` from any rank with ``tag``; the work's ``_source_rank()`` names
        the sender."""
        source = [-1]
        return self._start(p2p.recv(self._rank, self._size, tensors, None, tag, source), source)

    def _start_coalescing(self, device) -> None:
        """torch's coalescing manager: the operations issued until :meth:`_end_coalescing` are
        posted as they come (in issue order, as always) and waited for together."""
        self._coalesced = []

    def _end_coalescing(self, device):
        """One work for the operations issued since :meth:`_start_coalescing`."""
        entries, self._coalesced = self._coalesced or [], None
        return joint(self._engine, entries)

    def monitored_barrier(self, opts=None, wait_all_ranks: bool = False):
        """Not provided by mpisync: raises at once, on every rank."""
        raise ArgumentError("mpisync: monitored_barrier is not supported by mpisync; use barrier")
