"""An operation whose run fails on one rank only fails on every rank at once, with the same
error, and the engine goes on (no rank waits out the timeout)."""

import time

import pytest

from mpiutil import last_rank, raises_everywhere

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")
kernels = pytest.importorskip("mpisync.horovod.kernels")

pytestmark = pytest.mark.mpi

FAST_SECONDS = 20.0  # far below the timeout: the failure is heard at once, not waited out


def failing_scaled(monkeypatch, comm, failing_call: int) -> None:
    """On the last rank, the ``failing_call``-th scaling in a kernel raises a TypeError."""
    if comm.rank != last_rank(comm):
        return
    real, calls = kernels.scaled, [0]

    def scaled(tensor, factor):
        calls[0] += 1
        if calls[0] == failing_call:
            raise TypeError("cannot scale this dtype (injected)")
        return real(tensor, factor)

    monkeypatch.setattr(kernels, "scaled", scaled)


# An allreduce of integers with both factors scales each tensor twice: every tensor of the group
# before the group's collective (call 1 of one tensor, calls 1-2 of two), every one after it
# (call 2 of one tensor; call 3 of two: the first tensor's, the second's still to come).
@pytest.mark.parametrize(
    "failing_call, tensors",
    [(1, 1), (2, 1), (3, 2)],
    ids=["before", "after", "after, one of two"],
)
def test_a_run_failing_on_one_rank_raises_the_same_error_everywhere(
    started, monkeypatch, failing_call, tensors
):
    comm = started
    failing_scaled(monkeypatch, comm, failing_call)
    handle = hvd.grouped_allreduce_async(
        [torch.ones(3, dtype=torch.int32)] * tensors,
        name="bad",
        op=hvd.Sum,
        prescale_factor=2.0,
        postscale_factor=0.5,
    )
    start = time.monotonic()
    message = raises_everywhere(
        comm,
        hvd.HorovodInternalError,
        lambda: hvd.synchronize(handle),
        "operation 'allreduce.bad' failed",
        f"rank {last_rank(comm)}: TypeError: cannot scale this dtype (injected)",
    )
    assert time.monotonic() - start < FAST_SECONDS, message
    monkeypatch.undo()
    after = hvd.allreduce(torch.full((2,), 2.0), name="after", op=hvd.Sum)
    assert after.tolist() == [2.0 * comm.size] * 2


def test_a_failing_run_raises_a_runtime_error_and_a_sync_error(started, monkeypatch):
    import mpisync

    comm = started
    failing_scaled(monkeypatch, comm, 1)
    with pytest.raises(RuntimeError) as info:
        hvd.allreduce(torch.ones(2), name="typed", op=hvd.Sum, prescale_factor=2.0)
    assert isinstance(info.value, mpisync.SyncError)
