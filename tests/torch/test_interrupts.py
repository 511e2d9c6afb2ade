"""An interrupt (``KeyboardInterrupt``, a signal handler's ``SystemExit``) that leaves a wait of
the "mpisync" backend, injected deterministically: the engine's wait in MPI raises at its k-th
call, before it waits or just after MPI completed a request. The operations stay in flight with
their buffers, a second wait completes them with the right bytes, and the group goes on. A step
that raises while posting leaves its buffers held. Valid at any number of ranks from 2."""

import gc
import threading
import weakref

import numpy as np
import pytest

from mpiutil import need_ranks

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from mpisync.torch import entry as entry_module  # noqa: E402
from mpisync.torch import ledger  # noqa: E402
from mpisync.torch.process_group import ProcessGroupMPISync  # noqa: E402


@pytest.fixture
def group(comm, monkeypatch, request):
    """A group whose waits the main thread drives (no worker takes them over): without a worker
    (``threaded=False``), or with one that sweeps only after a minute."""
    if request.param == "no worker":
        monkeypatch.setattr(entry_module.MpiCalls, "threaded", lambda self: False)
    else:
        monkeypatch.setattr(ledger, "SWEEP_SECONDS", 60.0)
    made = ProcessGroupMPISync(comm, timeout=30)
    yield made
    made.shutdown()


def _inject(monkeypatch, k: int, exc_type, after: bool) -> list:
    """Make the engines' MPI wait raise ``exc_type`` on its ``k``-th call from the main thread
    (``after``: once the real wait returned a completed request, which is then lost to it);
    returns a list that holds True once it has."""
    fired: list = []
    real = entry_module.MpiCalls.waitany
    calls = [0]

    def waitany(self, requests, deadline):
        if threading.current_thread() is not threading.main_thread() or fired:
            return real(self, requests, deadline)
        calls[0] += 1
        if calls[0] < k:
            return real(self, requests, deadline)
        if not after:
            fired.append(True)
            raise exc_type("injected")
        got = real(self, requests, deadline)
        if got[0] >= 0:
            fired.append(True)
            raise exc_type("injected")
        return got

    monkeypatch.setattr(entry_module.MpiCalls, "waitany", waitany)
    return fired


def _operations(group, rank: int, size: int, started) -> tuple:
    """Four 1 MiB all-reduces, a broadcast from the last rank, and a message from the last rank
    to rank 0, each started by ``started(call)`` (the work, or None where the start itself was
    interrupted: without a worker, a collective completes before its call returns); returns
    ``(works, check)``, ``check()`` asserting every result."""
    tensors = [torch.full((1 << 17,), float(rank + i), dtype=torch.float64) for i in range(4)]
    works = [started(lambda t=t: group.allreduce([t])) for t in tensors]
    opts = dist.BroadcastOptions()
    opts.rootRank = size - 1
    shared = torch.full((1000,), float(rank))
    works.append(started(lambda: group.broadcast([shared], opts)))
    message = torch.zeros(300)
    if rank == 0:
        works.append(started(lambda: group.recv([message], size - 1, 7)))
    if rank == size - 1:
        works.append(started(lambda: group.send([torch.arange(300.0)], 0, 7)))

    def check() -> None:
        for i, t in enumerate(tensors):
            assert torch.equal(t, torch.full_like(t, float(sum(r + i for r in range(size)))))
        assert shared.tolist() == [float(size - 1)] * 1000
        if rank == 0:
            assert message.tolist() == [float(v) for v in range(300)]

    return [w for w in works if w is not None], check


@pytest.mark.parametrize("group", ["no worker", "a worker"], indirect=True)
@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("after", [False, True], ids=["in the wait", "after a completion"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_an_interrupted_wait_leaves_the_operations_in_flight(
    comm, group, monkeypatch, exc_type, after, k
):
    need_ranks(comm, 2)
    size, rank = comm.size, comm.rank
    injected = rank == size - 1
    fired = _inject(monkeypatch, k, exc_type, after) if injected else []
    caught = []

    def interrupted(call):
        try:
            return call()
        except exc_type:
            caught.append(True)
            return None

    works, check = _operations(group, rank, size, interrupted)
    for work in works:
        if interrupted(work.wait) is None and caught:
            work.wait()  # the operation is still in flight: wait again
    group._engine.drain()  # an operation whose start was interrupted completes too
    monkeypatch.undo()
    check()
    if injected:
        assert fired and caught == [True]
    assert not group._engine.broken
    tensor = torch.ones(3)
    group.allreduce([tensor]).wait()  # the group goes on
    assert tensor.tolist() == [float(size)] * 3


@pytest.mark.parametrize("group", ["no worker"], indirect=True)
def test_a_step_that_raises_while_posting_leaves_its_buffers_held(comm, group):
    """A receive posted, then an interrupt before the step yields it: its buffer (the step's own
    local) outlives the failed operation, since MPI writes into it once the message comes."""
    need_ranks(comm, 2)
    last = comm.size - 1
    held: list = []
    if comm.rank == 0:

        def steps():
            buffer = np.zeros(1 << 16, dtype=np.uint8)
            held.append(weakref.ref(buffer))
            group._p2p.Irecv(buffer, last, 99)  # lost with the step
            raise KeyboardInterrupt("injected while posting")
            yield [], True  # noqa: B901 (a generator)

        entry = group._engine.submit(steps(), "partial", p2p=True)
        group._engine.wait(entry)
        with pytest.raises(KeyboardInterrupt):
            entry.raise_error()
        del entry
        gc.collect()
        assert held[0]() is not None, "the buffer MPI writes into was freed"
    comm.Barrier()
    if comm.rank == last:
        group._p2p.Send(np.ones(1 << 16, dtype=np.uint8), 0, 99)
    comm.Barrier()
