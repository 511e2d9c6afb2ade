"""Async operations progress while the caller computes: ``poll`` turns True once the peers have
submitted, without ``synchronize`` (at ``MPI_THREAD_MULTIPLE``, where a worker drives)."""

import time

import pytest
from mpi4py import MPI

from mpiutil import raises_everywhere

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi

# The same on every rank of one job: the level the MPI library was initialized at.
threaded = pytest.mark.skipif(
    MPI.Query_thread() != MPI.THREAD_MULTIPLE, reason="progress without a waiter needs a worker"
)

BOUND_SECONDS = 60.0


def poll_until_done(handle) -> int:
    """Poll without ever waiting in mpisync (the caller "computes" between polls); how many polls
    returned False first. Fails after a bounded time."""
    end, misses = time.monotonic() + BOUND_SECONDS, 0
    while not hvd.poll(handle):
        assert time.monotonic() < end, "poll() stayed False: the operation did not progress"
        misses += 1
        sum(range(1000))  # compute, with no MPI call
    return misses


@threaded
def test_poll_becomes_true_without_synchronize(started):
    comm = started
    x = torch.arange(4, dtype=torch.float32) * (comm.rank + 1)
    handle = hvd.allreduce_async(x, name="overlap", op=hvd.Sum)
    poll_until_done(handle)
    total = sum(range(1, comm.size + 1))
    assert hvd.synchronize(handle).tolist() == [float(i * total) for i in range(4)]
    assert x.tolist() == [float(i * (comm.rank + 1)) for i in range(4)]  # the input untouched


@threaded
def test_late_peers_complete_the_operation_without_a_wait(started):
    comm = started
    if comm.rank != 0:
        time.sleep(0.3)  # rank 0 polls meanwhile: it must not block, nor complete alone
    gathered = hvd.allgather_async(torch.full((comm.rank + 1, 2), float(comm.rank)), name="g")
    reduced = hvd.allreduce_async_(torch.ones(3, dtype=torch.int64), name="r", op=hvd.Sum)
    misses = poll_until_done(gathered) + poll_until_done(reduced)
    if comm.rank == 0 and comm.size > 1:
        assert misses > 0  # its peers were still asleep: it polled before they submitted
    rows = [float(r) for r in range(comm.size) for _ in range(r + 1)]
    assert hvd.synchronize(gathered).tolist() == [[v, v] for v in rows]
    assert hvd.synchronize(reduced).tolist() == [comm.size] * 3


@threaded
def test_operations_in_different_orders_all_complete_without_a_wait(started):
    comm = started
    names = ["a", "b", "c"] if comm.rank % 2 == 0 else ["c", "b", "a"]
    values = {"a": 1.0, "b": 10.0, "c": 100.0}
    handles = {n: hvd.broadcast_async(torch.full((2,), values[n] + comm.rank), 0, n) for n in names}
    for n in names:
        poll_until_done(handles[n])
    for n in names:
        assert hvd.synchronize(handles[n]).tolist() == [values[n]] * 2


@threaded
def test_a_mismatch_found_without_a_wait_raises_the_same_error_everywhere(started):
    comm = started
    if comm.size == 1:
        pytest.skip("needs two ranks")
    handle = hvd.allreduce_async(torch.ones(2 + comm.rank), name="shape", op=hvd.Sum)
    poll_until_done(handle)
    raises_everywhere(
        comm, hvd.HorovodInternalError, lambda: hvd.synchronize(handle), "'allreduce.shape'"
    )
    after = hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum)  # the engine goes on
    assert after.tolist() == [float(comm.size)] * 2


def test_synchronize_gives_values_at_every_thread_level(started):
    comm = started
    handles = [hvd.allreduce_async(torch.full((2,), float(i)), op=hvd.Sum) for i in range(5)]
    assert [hvd.synchronize(h).tolist() for h in handles] == [
        [float(i * comm.size)] * 2 for i in range(5)
    ]
    assert all(hvd.poll(h) for h in handles)


@pytest.fixture
def short_timeout(comm, monkeypatch):
    monkeypatch.setenv("MPISYNC_TIMEOUT", "3")
    monkeypatch.setenv("MPISYNC_TIMEOUT_ABORT", "0")
    hvd.init(comm)
    yield comm
    hvd.shutdown()


def test_synchronize_keeps_the_timeout(short_timeout):
    import mpisync

    comm = short_timeout
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if comm.rank == 0:  # the others never submit it
        handle = hvd.allreduce_async(torch.ones(2), name="lonely", op=hvd.Sum)
        start = time.monotonic()
        with pytest.raises(mpisync.SyncTimeoutError, match="timed out"):
            hvd.synchronize(handle)
        assert time.monotonic() - start < BOUND_SECONDS
        assert hvd.poll(handle)
    comm.Barrier()
