"""An interrupt (``KeyboardInterrupt``, a ``SystemExit`` from a signal handler) that lands while
a Horovod operation waits for its transfers: the buffers MPI may still write into stay alive, the
caller gets the interrupt, and the process set is unusable (the same ``HorovodInternalError`` for
every later operation) until ``shutdown()`` and ``init()``; ranks that were not interrupted get
the timeout, not a wait that never ends. The interrupt is injected deterministically: the run's
wait raises it at its k-th call, after the request was posted and before it is waited for."""

import gc
import sys
import threading
import time
import types
import weakref

import pytest

from mpisync._runtime import keepalive

from mpiutil import last_rank, raises_everywhere

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")
progress = pytest.importorskip("mpisync.horovod.progress")

pytestmark = pytest.mark.mpi

# The waits of an allgather's run: the agreement before its collective, the collective (the one
# interrupted), the agreement after it.
DATA_WAIT = 2
BOUND_SECONDS = 30.0  # far above the short timeout, far below the job's


def interrupting(monkeypatch, exc_type, at: int, ranks) -> dict:
    """From now on, on ``ranks``, the ``at``-th wait of a run raises ``exc_type`` instead of
    waiting; returns what it saw: a weak reference to the receive buffer of the allgather whose
    wait it interrupted."""
    seen: dict = {"calls": 0, "kept": len(keepalive._KEPT)}

    class Interrupting(progress.Deadline):
        def wait(self, request):
            seen["calls"] += 1
            if seen["calls"] == at and ranks:
                caller = sys._getframe(1)
                assert caller.f_code.co_name == "allgather", caller.f_code.co_name
                seen["recv"] = weakref.ref(caller.f_locals["recv"])
                raise exc_type("injected")
            return super().wait(request)

    monkeypatch.setattr(progress, "Deadline", Interrupting)
    return seen


def kept_by_mpisync(seen: dict) -> bool:
    """Whether the interrupted collective's receive buffer is alive and reachable from what
    mpisync keeps for the rest of the process (kept since the injection was installed): alive by
    mpisync's own choice, not by a reference that happens to survive."""
    target = seen["recv"]()
    if target is None:
        return False
    modules = {id(m.__dict__) for m in list(sys.modules.values()) if m is not None}
    todo = list(keepalive._KEPT[seen["kept"] :])
    visited: set = set()
    while todo and len(visited) < 200_000:
        obj = todo.pop()
        if obj is target:
            return True
        if id(obj) in visited or id(obj) in modules or isinstance(obj, types.ModuleType):
            continue
        visited.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return False


def bounded(fn):
    """``fn()`` on a thread: ``(what it raised or None, its result)``, failing the test (not
    hanging it) where it does not end within :data:`BOUND_SECONDS`."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test inspects what it was
            out["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(BOUND_SECONDS)
    assert not thread.is_alive(), f"still waiting after {time.monotonic() - start:.0f} s"
    return out.get("raised"), out.get("result")


@pytest.fixture
def short_timeout(comm, monkeypatch):
    monkeypatch.setenv("MPISYNC_TIMEOUT", "3")
    monkeypatch.setenv("MPISYNC_TIMEOUT_ABORT", "0")
    hvd.init(comm)
    yield comm
    hvd.shutdown()


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_on_every_rank_keeps_the_buffers_and_breaks_the_set(
    short_timeout, monkeypatch, exc_type
):
    comm = short_timeout
    x = torch.arange(4, dtype=torch.float64) + 10 * comm.rank
    assert hvd.allgather(x, name="before").shape == (4 * comm.size,)
    seen = interrupting(monkeypatch, exc_type, DATA_WAIT, ranks=True)
    raised, _ = bounded(lambda: hvd.allgather(x, name="cut"))
    assert isinstance(raised, exc_type), repr(raised)
    del raised  # its traceback holds the buffer too: mpisync must hold it on its own
    monkeypatch.undo()
    raises_everywhere(
        comm,
        hvd.HorovodInternalError,
        lambda: hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum),
        f"interrupted ({exc_type.__name__})",
        "the set is unusable",
    )
    with pytest.raises(hvd.HorovodInternalError, match="unusable"):
        hvd.allgather_async(x, name="later")
    hvd.shutdown()
    gc.collect()
    # MPI may still write into it: never freed, not even by shutdown()
    assert kept_by_mpisync(seen), "the interrupted collective's buffer is not kept"
    hvd.init(comm)  # a new engine, on a new communicator
    got = hvd.allreduce(torch.ones(2), name="again", op=hvd.Sum)
    assert got.tolist() == [float(comm.size)] * 2


def test_an_interrupt_on_one_rank_times_out_the_others(short_timeout, monkeypatch):
    import mpisync

    comm = short_timeout
    if comm.size == 1:
        pytest.skip("needs two ranks")
    mine = comm.rank == last_rank(comm)
    seen = interrupting(monkeypatch, KeyboardInterrupt, DATA_WAIT, ranks=mine)
    raised, _ = bounded(lambda: hvd.allgather(torch.ones(3), name="cut"))
    if mine:
        assert isinstance(raised, KeyboardInterrupt), repr(raised)
        del raised
        with pytest.raises(hvd.HorovodInternalError, match="interrupted"):
            hvd.allreduce(torch.ones(2), name="after")
        hvd.shutdown()
        gc.collect()
        assert kept_by_mpisync(seen), "the interrupted collective's buffer is not kept"
    else:  # its run waits for the interrupted rank's next agreement: the timeout, not forever
        assert isinstance(raised, mpisync.SyncTimeoutError), repr(raised)
        with pytest.raises(mpisync.SyncError):
            hvd.allreduce(torch.ones(2), name="after")
    monkeypatch.undo()
    comm.Barrier()
