"""``ProcessGroupMPISync``: a torch.distributed process group over an MPI communicator.

Collectives are posted on a private duplicate of the communicator through the
progress engine (:mod:`mpisync.torch.engine`), in the order torch issues
them. Broadcasts (DDP's start-up and buffer broadcasts among them) go through
mpisync's fused parameter sync instead, after everything issued before them
has completed.
"""

from __future__ import annotations

import numpy as _np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

from .. import config as _config
from .._runtime.keepalive import keep_alive
from .._runtime.timeouts import abort_job, timed_out
from ..errors import SyncTimeoutError
from ..sync import ParamSync
from .buffers import ReduceBuffer, byte_view, check_reducible, in_place_array, mpi_reduce_op
from .engine import Engine

__all__ = ["ProcessGroupMPISync"]


class _Work(dist._Work):
    """torch's work object for one operation of the engine."""

    def __init__(self, engine, operation):
        super().__init__()
        self._engine, self._operation = engine, operation

    def wait(self, timeout=None) -> bool:
        self._engine.wait(self._operation)
        self._operation.raise_error()
        return True

    def is_completed(self) -> bool:
        return self._engine.test(self._operation)

    def get_future(self):
        return self._engine.future(self._operation)


# _create_work_from_future (imported with an attr-defined ignore: private, and missing from
# torch's stubs) is torch's documented way for a Python process group to make a Work of a future.
def _work(future) -> object:
    return _create_work_from_future(future)


def _done(result) -> object:
    future: torch.futures.Future[object] = torch.futures.Future()
    future.set_result(result)
    return _work(future)


def _host_bytes(tensor: torch.Tensor) -> tuple:
    """``(uint8 numpy view MPI can use, copy-back or None)`` for any tensor."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return byte_view(tensor), None
    host = tensor.detach().to("cpu").contiguous()

    def back():
        with torch.no_grad():
            tensor.copy_(host)

    return byte_view(host), back


class ProcessGroupMPISync(dist.ProcessGroup):
    """The ``"mpisync"`` backend over ``comm`` (duplicated: its traffic never meets the
    caller's)."""

    def __init__(self, comm, *, timeout: float | None = None, max_concurrent: int | None = None):
        # torch binds ProcessGroup(rank, size) too; its stubs list only (store, rank, size)
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]
        settings = _config.resolve(max_concurrent, None, None, timeout)
        self._timeout = settings.timeout.value
        self._comm = comm.Dup()
        self._rank, self._size = comm.rank, comm.size
        self._engine = Engine(
            self._comm, settings.max_concurrent.value, self._timeout, self._timed_out
        )
        self._param_syncs: dict = {}  # root -> ParamSync (each duplicates self._comm on first use)

    # -- identity -----------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """The backend's name, ``"mpisync"``."""
        return "mpisync"

    def getRank(self) -> int:  # noqa: N802
        """This process's rank in the group (its rank in the group's communicator)."""
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        """The number of ranks in the group."""
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupMPISync(rank={self._rank}, size={self._size})"

    @property
    def threaded(self) -> bool:
        """Whether a progress thread completes operations (MPI_THREAD_MULTIPLE), else the caller
        does."""
        return self._engine.threaded

    def shutdown(self) -> None:
        """Complete what is in flight, stop the progress thread, free the communicators."""
        if self._comm is None:
            return
        self._engine.close()
        for syncer in self._param_syncs.values():
            syncer.close()
        if self._engine.broken:  # freeing it with requests in flight can crash the MPI library
            keep_alive(self._comm)
        else:
            self._comm.Free()
        self._comm = None

    def abort(self) -> None:
        """Abort the MPI job (MPI cannot cancel collectives in flight)."""
        abort_job(MPI.COMM_WORLD)

    def _timed_out(self, labels: list) -> str:
        assert self._timeout is not None  # the engine reports timeouts only when there is one
        try:
            timed_out(self._comm, "torch.distributed operation", labels, self._timeout)
        except SyncTimeoutError as exc:
            return str(exc)
        return "timed out"

    def _submit(self, post, finish, result, label) -> _Work:
        return _Work(self._engine, self._engine.submit(post, finish, result, label))

    # -- collectives ----------------------------------------------------------------------------
    # torch calls a Python process group's collectives as (tensors, opts); its stubs list the C++
    # overloads as well: the override ignores.
    def allreduce(self, tensors, opts=None):  # type: ignore[override]
        """All-reduce each tensor of ``tensors`` in place (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR,
        BXOR)."""
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        mpi_op, average = mpi_reduce_op(op)
        if len(tensors) == 1 and not average:  # the common case (a synchronous call, a DDP bucket)
            array = in_place_array(tensors[0], mpi_op)
            if array is not None:
                return self._submit(
                    lambda comm: (comm.Iallreduce(MPI.IN_PLACE, array, mpi_op),),
                    None,
                    tensors,
                    "all_reduce",
                )
        check_reducible(mpi_op, tensors)
        buffers = [ReduceBuffer(t, self._size if average else 0, wide=average) for t in tensors]

        def post(comm):
            return (comm.Iallreduce(MPI.IN_PLACE, b.array, mpi_op) for b in buffers)

        def finish():
            for b in buffers:
                b.finish()

        return self._submit(post, finish, list(tensors), "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        """As :meth:`allreduce`, one collective per tensor."""
        return self.allreduce(tensors, opts)

    def broadcast(self, tensor_list, opts=None):  # type: ignore[override]
        """Broadcast from ``opts.rootRank`` through mpisync's fused parameter sync (after a
        drain)."""
        root = 0 if opts is None else opts.rootRank
        # collectives issued before this one complete first (MPI ordering rule)
        self._engine.drain()
        syncer = self._param_syncs.get(root)
        if syncer is None:
            syncer = self._param_syncs[root] = ParamSync(
                self._comm, root=root, timeout=self._timeout
            )
        syncer.sync({f"{k:08d}": t for k, t in enumerate(tensor_list)})
        return _done(list(tensor_list))

    def allgather(self, output_tensors, input_tensors, opts=None):
        """Gather every rank's tensor into ``output_tensors[i][rank]`` (bytes: any dtype)."""
        parts = []
        for outputs, tensor in zip(output_tensors, input_tensors):
            send, _ = _host_bytes(tensor.contiguous())
            recv = _np.empty(send.nbytes * self._size, _np.uint8)
            parts.append((send, recv, outputs))

        def post(comm):
            return (comm.Iallgather(send, recv) for send, recv, _ in parts)

        def finish():
            with torch.no_grad():
                for send, recv, outputs in parts:
                    n = send.nbytes
                    for r, out in enumerate(outputs):
                        src = (
                            torch.from_numpy(recv[r * n : (r + 1) * n])
                            .view(out.dtype)
                            .reshape(out.shape)
                        )
                        out.copy_(src)

        return self._submit(post, finish, output_tensors, "all_gather")

    def all_gather_single(self, output, input, opts=None):
        """``all_gather_into_tensor``: every rank's ``input`` laid end to end in ``output``."""
        recv, back = _host_bytes(output)
        send, _ = _host_bytes(input.contiguous())
        if recv.nbytes != send.nbytes * self._size:
            raise ValueError(
                f"mpisync backend: output has {recv.nbytes} bytes, expected "
                f"{send.nbytes * self._size} ({self._size} x input)"
            )
        return self._submit(
            lambda comm: [comm.Iallgather(send, recv)], back, output, "all_gather_into_tensor"
        )

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output, input, opts=None):
        """``reduce_scatter_tensor``: reduce ``input`` over ranks; this rank keeps its
        ``output``-sized block."""
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        mpi_op, average = mpi_reduce_op(op)
        check_reducible(mpi_op, (input, output))
        send = ReduceBuffer(input.contiguous(), wide=average)
        result = ReduceBuffer(output, self._size if average else 0, wide=average)
        if send.array.size != result.array.size * self._size:
            raise ValueError(
                f"mpisync backend: input has {send.array.size} elements, expected "
                f"{result.array.size * self._size} ({self._size} x output)"
            )
        return self._submit(
            lambda comm: [comm.Ireduce_scatter_block(send.array, result.array, mpi_op)],
            result.finish,
            output,
            "reduce_scatter_tensor",
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):  # type: ignore[override]
        """``reduce_scatter``: ``input_tensors[i][r]`` reduced over ranks lands in rank ``r``'s
        ``output_tensors[i]``."""
        works = [
            self.reduce_scatter_single(out, torch.cat([t.reshape(-1) for t in ins]), opts)
            for out, ins in zip(output_tensors, input_tensors)
        ]
        future = torch.futures.collect_all([w.get_future() for w in works]).then(
            lambda _: output_tensors
        )
        return _work(future)

    def barrier(self, opts=None):
        """Complete when every rank has reached it (and everything issued before it has
        completed)."""
        return self._submit(lambda comm: [comm.Ibarrier()], None, [], "barrier")

    def send(self, tensors, dst_rank: int, tag: int = 0):
        """Send ``tensors`` (bytes) to ``dst_rank`` with ``tag``."""
        views = [_host_bytes(t.contiguous())[0] for t in tensors]
        return self._submit(
            lambda comm: (comm.Isend(v, dst_rank, tag) for v in views),
            None,
            list(tensors),
            f"send to {dst_rank}",
        )

    def recv(self, tensors, src_rank: int, tag: int = 0):
        """Receive ``tensors`` (bytes) from ``src_rank`` with ``tag``."""
        targets = [_host_bytes(t) for t in tensors]

        def finish():
            for _, back in targets:
                if back is not None:
                    back()

        return self._submit(
            lambda comm: (comm.Irecv(v, src_rank, tag) for v, _ in targets),
            finish,
            list(tensors),
            f"recv from {src_rank}",
        )
