"""The slot ring's ordered counters (``mpisync._speedups``' C11 atomics): bounds and alignment
refused without MPI, and a store-release seen by a load-acquire on another rank through the
node's shared file mapping, with the bytes written before it, as the ring uses them."""

import mmap
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

from mpisync.transports import nodesegment

from mpiutil import everyone, wait

_ROUNDS = 300
_LINE = 64
_PAYLOAD = 4096


def _atomics_or_skip():
    ordered = nodesegment.atomics()
    if ordered is None:
        pytest.skip("mpisync._speedups' atomics are not built here (or MPISYNC_SPEEDUPS=0)")
    return ordered


def test_a_counter_round_trips_and_bad_offsets_are_refused():
    ordered = _atomics_or_skip()
    buffer = mmap.mmap(-1, mmap.PAGESIZE)
    view = memoryview(buffer)
    ordered.store_release(view, 64, -7)
    ordered.store_release(view, 128, 1 << 62)
    assert ordered.load_acquire(view, 64) == -7
    assert ordered.load_acquire(view, 128) == 1 << 62
    assert ordered.min_acquire(view, [128, 64]) == -7
    assert int.from_bytes(buffer[64:72], "little", signed=True) == -7  # the word itself
    with pytest.raises(ValueError, match="aligned"):
        ordered.load_acquire(view, 4)
    with pytest.raises(IndexError):
        ordered.store_release(view, mmap.PAGESIZE - 4, 1)
    with pytest.raises(IndexError):
        ordered.load_acquire(view, -8)
    with pytest.raises(BufferError):
        ordered.store_release(memoryview(bytes(16)), 0, 1)  # read-only
    with pytest.raises(ValueError):
        ordered.min_acquire(view, [])


def _until(ready, what: str) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within 60 s"
        os.sched_yield()  # the peer may share this core


def _one_node(comm) -> bool:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return everyone(comm, node.size == comm.size)
    finally:
        node.Free()


@pytest.mark.mpi
def test_a_store_release_is_seen_by_a_load_acquire_on_every_peer_after_the_bytes(comm):
    """Root writes a round's bytes into the mapping, then stores the round number with release
    order; each other rank waits for it with acquire loads, checks the bytes, and acks with a
    release store; root waits for the least ack before the next round's bytes."""
    if comm.size == 1:
        pytest.skip("no peers")
    if not (everyone(comm, nodesegment.ring_available()) and _one_node(comm)):
        pytest.skip("the slot ring is not available on every rank (or the ranks span nodes)")
    ordered = nodesegment.atomics()
    segment = nodesegment.NodeSegment.open(comm, 0, 1, _PAYLOAD, wait, True)
    assert segment is not None  # every rank can map the node's file
    header = segment._header
    seq, acks = segment._seq[0], segment._ack
    others = [acks[r] for r in range(comm.size) if r != 0]
    payload = np.frombuffer(segment.arena.view, np.uint64, _PAYLOAD // 8)
    seen = 0
    for k in range(1, _ROUNDS + 1):
        if comm.rank == 0:
            _until(lambda k=k: ordered.min_acquire(header, others) >= k - 1, "ack")
            payload[...] = k
            ordered.store_release(header, seq, k)
        else:
            _until(lambda k=k: ordered.load_acquire(header, seq) == k, "round")
            seen += int((payload == k).all())
            ordered.store_release(header, acks[comm.rank], k)
    if comm.rank == 0:
        _until(lambda: ordered.min_acquire(header, others) >= _ROUNDS, "last ack")
        assert ordered.load_acquire(header, seq) == _ROUNDS
    else:
        assert seen == _ROUNDS  # every round's bytes were there once its number was
    comm.Barrier()
    assert ordered.min_acquire(header, others) == _ROUNDS
    assert all(ordered.load_acquire(header, a) == _ROUNDS for a in others)
    # the counters live where the slot ring's do: one cache line each
    assert seq % _LINE == 0 and all(a % _LINE == 0 for a in acks)
