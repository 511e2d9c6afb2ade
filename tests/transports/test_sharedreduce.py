"""The all-reduce of mid-size arrays through the node's segment
(:mod:`mpisync.transports.sharedreduce`) with the real MPI library: MPI's bytes at two ranks and
for integers (the same bytes on every rank beyond), sizes out of range left to MPI, the same
bytes from the first call on, sizes that differ raised on every rank with the arrays untouched,
and the path off everywhere when one rank turns the segment off."""

import numpy as np
import pytest
from mpi4py import MPI

from mpisync.transports import sharedreduce
from mpisync.transports.crossreduce import drive
from mpisync.transports.policy import SHARED_REDUCE_MAX_BYTES as MAX_BYTES
from mpisync.transports.policy import SHARED_REDUCE_MIN_BYTES as MIN_BYTES
from mpisync.transports.sharedreduce import (
    SharedReduceError,
    _held,
    shared_steps,
)

from mpiutil import wait

pytestmark = pytest.mark.mpi

_OPS = {"sum": (np.add, MPI.SUM), "max": (np.maximum, MPI.MAX), "prod": (np.multiply, MPI.PROD)}


def _data(rank: int, n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(900 + rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


def _in_rank_order(inputs: np.ndarray, combine) -> np.ndarray:
    """Share ``k`` of every rank's row combined as rank ``k`` does: its own first, then its
    peers' in rank order."""
    size, n = inputs.shape
    out = np.empty(n, inputs.dtype)
    for k in range(size):
        lo, hi = k * n // size, (k + 1) * n // size
        share = inputs[k, lo:hi].copy()
        for peer in range(size):
            if peer != k:
                combine(share, inputs[peer, lo:hi], out=share)
        out[lo:hi] = share
    return out


def _opened(dup) -> bool:
    """Open the path on ``dup`` (at its first call in range); whether it is open, the same on
    every rank."""
    a = np.zeros(MIN_BYTES // 8, np.int64)
    done, _ = drive(shared_steps(dup, a, np.add), wait)
    return done


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("op", list(_OPS))
@pytest.mark.parametrize("nbytes", [MIN_BYTES, MIN_BYTES + 4 * 4099 * 2, MAX_BYTES])
def test_the_bytes_are_mpis(dup, dtype, op, nbytes):
    """Two ranks: MPI's bytes for every dtype; more: MPI's for integers, and for floats the same
    bytes on every rank (a share combined by one rank, in rank order)."""
    if not _opened(dup):
        pytest.skip("the node's segment is not open between these ranks")
    rank, size = dup.rank, dup.size
    n = nbytes // np.dtype(dtype).itemsize
    combine, mpi_op = _OPS[op]
    for round_ in range(3):  # the regions reused: no value of an earlier call stays
        a = _data(rank + 10 * round_, n, dtype)
        expected = a.copy()
        dup.Allreduce(MPI.IN_PLACE, expected, mpi_op)
        inputs = np.empty((size, n), a.dtype)
        dup.Allgather(a, inputs)
        done, posted = drive(shared_steps(dup, a, combine), wait)
        assert (done, posted) == (True, 2)
        if size == 2 or np.dtype(dtype).kind != "f":
            assert a.tobytes() == expected.tobytes(), (round_, dtype, op)
        assert a.tobytes() == _in_rank_order(inputs, combine).tobytes()
        everyone = np.empty((size, a.nbytes), np.uint8)
        dup.Allgather(a.view(np.uint8), everyone)
        assert (everyone == everyone[0]).all()


@pytest.mark.parametrize("lengths", [(20000, 3, 30000, 17), (7, 60000, 5), (25000, 25000)])
def test_arrays_laid_end_to_end_reduce_as_one_array(dup, lengths):
    """A list of arrays is reduced as their concatenation, whether a rank's share lies inside
    one array or spans several."""
    if not _opened(dup):
        pytest.skip("the node's segment is not open between these ranks")
    rank = dup.rank
    for round_ in range(2):
        whole = _data(rank + 10 * round_, sum(lengths), np.float64)
        inputs = np.empty((dup.size, whole.size), whole.dtype)
        dup.Allgather(whole, inputs)
        arrays = np.split(whole.copy(), np.cumsum(lengths)[:-1])
        done, posted = drive(shared_steps(dup, arrays, np.add), wait)
        assert (done, posted) == (True, 2)
        got = np.concatenate(arrays)
        assert got.tobytes() == _in_rank_order(inputs, np.add).tobytes(), round_


def test_sizes_out_of_range_go_through_mpi(dup):
    """Nothing posted: the caller's MPI all-reduce takes them, and the segment is not opened."""
    small = np.ones(MIN_BYTES // 4 - 1, np.float32)
    large = np.ones(MAX_BYTES // 4 + 1, np.float32)
    for a in (small, large, small, large):
        assert drive(shared_steps(dup, a, np.add), wait) == (False, 0)
    assert not _held(dup).tried


def test_the_same_inputs_give_the_same_bytes_from_the_first_call(dup):
    """The first call in range already takes the path it keeps, so a call repeated on the same
    inputs sums in the same order every time (at three ranks and more, MPI's order differs)."""
    base = _data(dup.rank, MIN_BYTES // 4, np.float32)
    seen = set()
    for _ in range(3):
        a = base.copy()
        done, _ = drive(shared_steps(dup, a, np.add), wait)
        if not done:
            dup.Allreduce(MPI.IN_PLACE, a, MPI.SUM)
        seen.add(a.tobytes())
    assert len(seen) == 1


def test_sizes_that_differ_raise_on_every_rank_and_write_nothing(dup):
    if not _opened(dup) or dup.size == 1:
        pytest.skip("needs the node's segment between two ranks or more")
    a = np.full(MIN_BYTES // 4 + dup.rank, 3, np.float32)
    with pytest.raises(SharedReduceError, match="arrays of .* bytes"):
        drive(shared_steps(dup, a, np.add), wait)
    assert (a == 3).all()
    b = np.full(MIN_BYTES // 4, dup.rank + 1, np.float32)  # the path still works afterwards
    assert drive(shared_steps(dup, b, np.add), wait) == (True, 2)
    assert (b == dup.size * (dup.size + 1) // 2).all()


def test_off_on_one_rank_is_off_on_every_rank(dup, monkeypatch):
    if dup.size == 1:
        pytest.skip("one rank never opens the segment")
    if dup.rank == dup.size - 1:
        monkeypatch.setenv("MPISYNC_SHARED_MEMORY", "0")
    a = np.full(MIN_BYTES // 4, dup.rank + 1, np.float32)
    assert drive(shared_steps(dup, a, np.add), wait) == (False, 2)  # the opening alone
    assert _held(dup).tried and _held(dup).path is None
    assert drive(shared_steps(dup, a, np.add), wait) == (False, 0)
    assert (a == dup.rank + 1).all()


def test_the_closing_step_follows_the_copy_back(dup, monkeypatch):
    """The step that ends an operation carries no request and comes after the array holds the
    result: the torch backend's engine posts the next operation's first step (its copy into the
    region) only then."""
    if not _opened(dup) or dup.size == 1:
        pytest.skip("needs the node's segment between two ranks or more")
    a = np.full(MIN_BYTES // 4, dup.rank + 1, np.float32)
    steps = shared_steps(dup, a, np.add, last=True)
    seen = []
    try:
        while True:
            requests, last = next(steps)
            for request in requests:
                request.Wait()
            seen.append((len(requests), last, bool((a == dup.size * (dup.size + 1) // 2).all())))
    except StopIteration as stop:
        assert stop.value is True
    assert seen == [(1, False, False), (1, False, False), (0, True, True)]
    assert sharedreduce.SharedReduce is type(_held(dup).path)
