"""The operations torch calls on the ``"mpisync"`` process group, one method each: every method
builds its :class:`~mpisync.torch.op.Op` (:mod:`mpisync.torch.reductions`,
:mod:`mpisync.torch.movement`, :mod:`mpisync.torch.p2p`) and starts it with the group's
``_start``. A base of :class:`~mpisync.torch.process_group.ProcessGroupMPISync`, which provides
``_start``, ``_rank`` and ``_size``.
"""

from __future__ import annotations

import torch.distributed as dist

from . import movement, p2p, reductions
from .errors import ArgumentError
from .op import Op, combined
from .work import Work

__all__ = ["Operations"]


class Operations:
    """torch's ``ProcessGroup`` operations, built and started on this group."""

    _rank: int
    _size: int

    def _start(self, op: Op, source: list | None = None) -> Work:
        raise NotImplementedError  # the group's

    # torch calls a Python group's collectives as (tensors, ..., opts)
    def allreduce(self, tensors, opts=None):
        """All-reduce each tensor in place (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR; a
        sparse COO tensor: SUM)."""
        return self._start(reductions.all_reduce(self._size, tensors, opts))

    def allreduce_coalesced(self, tensors, opts=None):
        """As :meth:`allreduce`, one operation for all of ``tensors``."""
        return self._start(reductions.all_reduce(self._size, tensors, opts, "all_reduce_coalesced"))

    def reduce(self, tensors, opts):
        """Reduce into ``opts.rootRank``'s tensors."""
        return self._start(reductions.reduce(self._rank, self._size, tensors, opts))

    def broadcast(self, tensors, opts=None):
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

    def gather(self, output_tensors, input_tensors, opts):
        """Every rank's ``input_tensors[0]`` into ``output_tensors[0][rank]`` on the root."""
        op = movement.gather(self._rank, self._size, output_tensors, input_tensors, opts)
        return self._start(op)

    def scatter(self, output_tensors, input_tensors, opts):
        """``input_tensors[0][r]`` on the root into rank ``r``'s ``output_tensors[0]``."""
        op = movement.scatter(self._rank, self._size, output_tensors, input_tensors, opts)
        return self._start(op)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
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
        op = movement.all_to_all(self._size, output_tensors, input_tensors)
        return self._start(op)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """Rows of ``input`` to each rank, of ``output`` from each: equal, or by split sizes."""
        op = movement.all_to_all_single(
            self._rank, self._size, output, input, output_split_sizes, input_split_sizes
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

    def monitored_barrier(self, opts=None, wait_all_ranks: bool = False):
        """Not provided by mpisync: raises at once, on every rank."""
        raise ArgumentError("mpisync: monitored_barrier is not supported by mpisync; use barrier")
