"""The torch backend's engine on real MPI, its operations' requests generalized requests that the
test completes, in any order, so that posting order, the cap, timeouts and failures can be driven
exactly."""

import threading
import time

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

from mpisync.torch.engine import Engine  # noqa: E402
from mpisync.torch.entry import MpiCalls, _cancel, _free, _query  # noqa: E402
from mpisync.torch.errors import (  # noqa: E402
    AgreedError,
    OperationError,
    OperationTimeoutError,
)


class Driven(MpiCalls):
    """The engine's own MPI calls (its waits, its wake); each operation's request is an
    ``MPI.Grequest`` that completes when the test says, with the MPI error it names."""

    def __init__(self, threaded=True):
        super().__init__()
        self._threaded = threaded
        self.posted: list = []
        self._errors: dict = {}  # request name -> the MPI error it completes with
        self._names: dict = {}  # id(request) -> its name

    def threaded(self):
        return self._threaded and super().threaded()

    def post(self, key, names):
        """Requests named ``names``, kept as ``REQUESTS[key]`` before they count as posted (the
        engine posts from its worker: a test that sees a name posted finds its request)."""
        requests = [self._request(name) for name in names]
        REQUESTS[key] = requests
        self.posted.extend(names)
        return requests

    def _request(self, name):
        errors = self._errors

        def query(status, *args):
            _query(status)  # as the engine's own wake request
            if name in errors:
                raise MPI.Exception(errors[name])  # the request's outcome: that MPI error

        request = MPI.Grequest.Start(query, _free, _cancel)
        self._names[id(request)] = name
        return request

    def complete(self, request, error=None):
        if error is not None:
            self._errors[self._names[id(request)]] = error
        request.Complete()


def steps(mpi, name, count=1, *, last_steps=1, finished=None):
    """An operation of ``last_steps`` steps, each posting ``count`` requests (kept in
    ``REQUESTS[f"{name}.{step}"]``)."""
    for step in range(last_steps):
        requests = mpi.post(f"{name}.{step}", [f"{name}.{step}.{k}" for k in range(count)])
        yield requests, step == last_steps - 1
    if finished is not None:
        finished.append(name)


REQUESTS: dict = {}


def done(mpi, key):
    for request in REQUESTS[key]:
        mpi.complete(request)


def until(predicate, seconds=5.0):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out waiting for the engine"
        time.sleep(0.001)


@pytest.fixture
def mpi():
    REQUESTS.clear()
    return Driven()


def make(mpi, capacity=16, timeout=None, on_timeout=None):
    return Engine(None, capacity, timeout, on_timeout or (lambda labels: "timed out"), mpi=mpi)


def test_operations_complete_in_any_order(mpi):
    engine = make(mpi)
    finished = []
    entries = [engine.submit(steps(mpi, n, finished=finished), n) for n in "abc"]
    futures = [engine.future(e) for e in entries]
    for key in ("c.0", "a.0", "b.0"):
        done(mpi, key)
        until(lambda k=key: k[0] in finished)  # each completes alone, the others pending
    torch.futures.wait_all(futures)
    assert finished == ["c", "a", "b"]
    assert all(e.done and e.error is None for e in entries)
    engine.close()


def test_the_cap_queues_collectives_and_never_blocks_the_caller(mpi):
    engine = make(mpi, capacity=2)
    entries = [engine.submit(steps(mpi, n), n) for n in "abcd"]  # returns at once: nothing waits
    assert mpi.posted == ["a.0.0", "b.0.0"]
    done(mpi, "a.0")
    until(lambda: "c.0.0" in mpi.posted)
    assert mpi.posted == ["a.0.0", "b.0.0", "c.0.0"]
    for key in ("c.0", "b.0"):
        done(mpi, key)
    until(lambda: "d.0.0" in mpi.posted)
    done(mpi, "d.0")
    for entry in entries:
        engine.wait(entry)
    engine.close()


def test_point_to_point_operations_are_never_held_back_by_the_cap(mpi):
    # Twenty receives, then twenty sends, then the waits: valid, whatever the cap.
    engine = make(mpi, capacity=1)
    blocker = engine.submit(steps(mpi, "collective"), "collective")
    receives = [engine.submit(steps(mpi, f"recv{k}"), f"recv{k}", p2p=True) for k in range(20)]
    sends = [engine.submit(steps(mpi, f"send{k}"), f"send{k}", p2p=True) for k in range(20)]
    assert len(mpi.posted) == 41
    for k in range(20):
        done(mpi, f"send{k}.0")
        done(mpi, f"recv{k}.0")
    for entry in receives + sends:
        assert engine.wait(entry, timeout=5)
    done(mpi, "collective.0")
    engine.wait(blocker)
    engine.close()


def test_an_operation_posts_only_once_the_one_before_posted_its_last_step(mpi):
    engine = make(mpi)
    first = engine.submit(steps(mpi, "first", last_steps=2), "first")
    second = engine.submit(steps(mpi, "second"), "second")
    assert mpi.posted == ["first.0.0"]  # the second waits: collectives keep their order
    done(mpi, "first.0")
    until(lambda: len(mpi.posted) == 3)
    assert mpi.posted == ["first.0.0", "first.1.0", "second.0.0"]
    done(mpi, "second.0")
    done(mpi, "first.1")
    engine.wait(first)
    engine.wait(second)
    engine.close()


def test_an_agreed_error_fails_that_operation_only(mpi):
    class Refused(AgreedError):
        pass

    def refused():
        yield mpi.post("check", ["check"]), False
        raise Refused("every rank refuses")

    engine = make(mpi)
    bad = engine.submit(refused(), "bad")
    good = engine.submit(steps(mpi, "good"), "good")
    assert mpi.posted == ["check"]
    done(mpi, "check")  # the check completes; its verdict fails the operation on every rank
    assert engine.wait(bad, timeout=5)
    with pytest.raises(Refused):
        bad.raise_error()
    until(lambda: "good.0.0" in mpi.posted)
    done(mpi, "good.0")
    engine.wait(good)
    assert good.error is None
    engine.close()


def test_an_mpi_error_in_a_collective_breaks_the_engine(mpi):
    engine = make(mpi)
    failing = engine.submit(steps(mpi, "a"), "a")
    pending = engine.submit(steps(mpi, "b"), "b")
    mpi.complete(REQUESTS["a.0"][0], error=MPI.ERR_OTHER)
    engine.wait(failing)
    engine.wait(pending)
    for entry in (failing, pending):
        with pytest.raises(OperationError, match="MPI error in a: Other MPI error"):
            entry.raise_error()
    with pytest.raises(OperationError, match="unusable"):
        engine.submit(steps(mpi, "c"), "c")
    assert engine.broken
    engine.close()


def test_an_mpi_error_in_a_receive_fails_that_receive_only(mpi):
    engine = make(mpi)
    receive = engine.submit(steps(mpi, "recv"), "recv", p2p=True)
    collective = engine.submit(steps(mpi, "c"), "c")
    mpi.complete(REQUESTS["recv.0"][0], error=MPI.ERR_TRUNCATE)
    engine.wait(receive)
    with pytest.raises(OperationError, match="MPI error in recv: Message truncated"):
        receive.raise_error()
    done(mpi, "c.0")
    engine.wait(collective)
    assert collective.error is None and not engine.broken
    engine.close()


def test_a_wait_with_a_timeout_returns_and_the_operation_completes_later(mpi):
    engine = make(mpi)
    entry = engine.submit(steps(mpi, "slow"), "slow")
    start = time.monotonic()
    assert not engine.wait(entry, timeout=0.2)
    assert 0.19 <= time.monotonic() - start < 2
    assert not entry.done
    done(mpi, "slow.0")
    assert engine.wait(entry, timeout=5) and entry.error is None
    engine.close()


def test_the_timeout_fails_every_pending_operation_when_it_does_not_abort(mpi):
    reported = []

    def on_timeout(labels):
        reported.append((threading.current_thread().name, labels))
        return "mpisync: the operation did not complete within 0.3 s (timed out)"

    engine = make(mpi, timeout=0.3, on_timeout=on_timeout)
    entries = [engine.submit(steps(mpi, n), n) for n in "ab"]
    start = time.monotonic()
    for entry in entries:
        engine.wait(entry)
        with pytest.raises(OperationTimeoutError, match="timed out"):
            entry.raise_error()
    assert 0.29 <= time.monotonic() - start < 3
    assert len(reported) == 1 and reported[0][1] == ["a", "b"]
    assert engine.broken
    engine.close()


def test_the_timeout_is_reported_once_while_waiters_keep_waiting(mpi):
    # By default the report aborts the job: until it does, nobody else raises or returns (a
    # caller raising then, and the interpreter finalizing MPI under the abort, crashed).
    release = threading.Event()
    calls = []

    def on_timeout(labels):
        calls.append(labels)
        release.wait(10)  # the abort, which never returns
        return "timed out"

    engine = make(mpi, timeout=0.2, on_timeout=on_timeout)
    entry = engine.submit(steps(mpi, "a"), "a")
    waiter = threading.Thread(target=engine.wait, args=(entry,), daemon=True)
    waiter.start()
    until(lambda: calls)
    time.sleep(0.2)
    assert waiter.is_alive() and not entry.done and len(calls) == 1
    release.set()
    waiter.join(5)
    assert entry.done and isinstance(entry.error, OperationTimeoutError)
    engine.close()


def test_a_future_callback_may_issue_and_wait_for_more_operations(mpi):
    # Callbacks run where the future completes (the driver); waiting there must drive, not
    # deadlock on itself.
    engine = make(mpi, capacity=1)
    first = engine.submit(steps(mpi, "first"), "first")
    inner = {}

    def complete_inner():
        until(lambda: "inner.0" in REQUESTS)
        done(mpi, "inner.0")

    def callback(_):
        entry = engine.submit(steps(mpi, "inner"), "inner")
        threading.Thread(target=complete_inner, daemon=True).start()
        engine.wait(entry)
        inner["done"] = entry.done
        return True

    chained = engine.future(first).then(callback)
    done(mpi, "first.0")
    assert chained.wait() and inner["done"]
    engine.close()


def test_without_a_worker_collectives_complete_on_the_caller(mpi):
    serial = Driven(threaded=False)
    engine = make(serial, timeout=5)
    completer = threading.Thread(
        target=lambda: (until(lambda: "a.0" in REQUESTS), done(serial, "a.0")), daemon=True
    )
    completer.start()
    entry = engine.submit(steps(serial, "a"), "a")
    assert entry.done and entry.error is None  # complete when submit returned
    assert not engine.threaded
    engine.close()


def test_halt_ends_the_threads_and_leaves_what_is_in_flight(mpi):
    # At exit no mpisync thread may still run Python while the interpreter finalizes (one ended
    # inside torch's C++ aborts the process), and a peer may never complete what is in flight.
    engine = make(mpi)
    first = engine.submit(steps(mpi, "a"), "a")
    settled_on = []
    engine.future(first).then(lambda _: settled_on.append(threading.current_thread().name))
    done(mpi, "a.0")
    until(lambda: settled_on)
    pending = engine.submit(steps(mpi, "b"), "b")
    engine.future(pending)  # the worker drives: it waits for b in MPI
    until(lambda: engine._driver._in_mpi)
    worker = engine._driver._worker
    start = time.monotonic()
    engine.halt()
    assert time.monotonic() - start < 1.0
    assert settled_on == ["mpisync-settler"]
    assert worker is not None and not worker.is_alive()
    assert not engine._settler._running
    assert not pending.done and pending.error is None
    done(mpi, "b.0")  # nobody drives now
    time.sleep(0.05)
    assert not pending.done


def test_close_ends_the_settlers_once_every_future_is_settled(mpi):
    engine = make(mpi)
    entries = [engine.submit(steps(mpi, n), n) for n in "ab"]
    settled = []
    for entry in entries:
        engine.future(entry).then(lambda f: settled.append(f.value()))
    for key in ("a.0", "b.0"):
        done(mpi, key)
    engine.close()
    until(lambda: not engine._settler._running)
    assert len(settled) == 2  # each future settled before its settler ended
