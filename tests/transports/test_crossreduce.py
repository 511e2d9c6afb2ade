"""The cross-memory all-reduce (:mod:`mpisync.transports.crossreduce`) with the real MPI library:
MPI's bytes at two ranks, the same bytes on every rank at any count, a share per rank that may be
empty, a failed copy raised on every rank, and the users that route large arrays through it
(``GradSync``, the torch backend's ``all_reduce``)."""

import numpy as np
import pytest
from mpi4py import MPI

from mpisync import GradSync
from mpisync.transports.crossreduce import (
    CrossReduce,
    CrossReduceError,
    _held,
    combine_of,
    drive,
    reduce_steps,
)
from mpisync.transports.policy import CROSS_REDUCE_MIN_BYTES as MIN_BYTES

from mpiutil import wait

pytestmark = pytest.mark.mpi


def _opened(dup) -> CrossReduce | None:
    held: list = []
    drive(CrossReduce.open_steps(dup, held), wait)
    return held[0]


def _data(rank: int, n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(77 + rank)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(n) * 1e3).astype(dtype)
    return rng.integers(-50, 50, n).astype(dtype)


def _all(comm, n: int, dtype) -> np.ndarray:
    return np.stack([_data(r, n, dtype) for r in range(comm.size)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int64, np.complex64])
@pytest.mark.parametrize("op", ["SUM", "PROD", "MIN", "MAX"])
@pytest.mark.parametrize("n", [1, 7, 300_001])
def test_the_bytes_of_mpis_all_reduce(dup, dtype, op, n):
    """At two ranks MPI's bytes exactly; at more, every rank the same bytes (one rank combines each
    share), equal to the exact result for integers (wrapped on overflow, as numpy's and torch's
    are: Open MPI's vectorised sum saturates 8- and 16-bit integers instead, open-mpi/ompi#8045,
    so MPI's bytes are no reference there)."""
    if np.dtype(dtype).kind == "c" and op in ("MIN", "MAX"):
        pytest.skip("no order of complex numbers")
    cross = _opened(dup)
    if cross is None:
        pytest.skip("cross-memory is not open between these ranks")
    mpi_op = getattr(MPI, op)
    mine = _data(dup.rank, n, dtype)
    ours, theirs = mine.copy(), mine.copy()
    drive(cross.steps(dup, ours, combine_of(mpi_op)), wait)
    dup.Allreduce(MPI.IN_PLACE, theirs, mpi_op)
    everyone = np.empty((dup.size, ours.nbytes), np.uint8)
    dup.Allgather(ours.view(np.uint8), everyone)
    assert (everyone == everyone[0]).all()
    if dup.size <= 2:
        assert ours.tobytes() == theirs.tobytes()
    if np.dtype(dtype).kind in "iu":
        with np.errstate(all="ignore"):
            expected = combine_of(mpi_op).reduce(_all(dup, n, dtype), axis=0, dtype=dtype)
        assert ours.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("op", ["SUM", "MAX"])
@pytest.mark.parametrize("n", [1, 7, 300_001])
@pytest.mark.parametrize("root", ["first", "last"])
def test_a_reduce_has_mpis_bytes_on_its_root(dup, dtype, op, n, root):
    """A reduce to ``root`` (root's share larger, the combined chunks written into root alone):
    MPI's bytes on root at two ranks, the exact result for integers at any count, and every
    other rank's array its input but for its own share (at most half of the values)."""
    cross = _opened(dup)
    if cross is None:
        pytest.skip("cross-memory is not open between these ranks")
    dst = 0 if root == "first" else dup.size - 1
    mpi_op = getattr(MPI, op)
    mine = _data(dup.rank, n, dtype)
    ours, theirs = mine.copy(), np.empty_like(mine)
    drive(cross.steps(dup, ours, combine_of(mpi_op), root=dst), wait)
    dup.Reduce(mine, theirs, mpi_op, root=dst)
    if dup.rank == dst:
        if dup.size <= 2:
            assert ours.tobytes() == theirs.tobytes()
    else:
        assert np.count_nonzero(ours != mine) <= (n + 1) // 2
    if dup.rank == dst and np.dtype(dtype).kind in "iu":
        expected = combine_of(mpi_op).reduce(_all(dup, n, dtype), axis=0, dtype=dtype)
        assert ours.tobytes() == expected.tobytes()


def test_a_share_of_no_values(dup):
    """Fewer values than ranks: the ranks without a share still take part."""
    cross = _opened(dup)
    if cross is None:
        pytest.skip("cross-memory is not open between these ranks")
    x = np.array([dup.rank + 1.0])
    drive(cross.steps(dup, x, np.add), wait)
    assert x.tolist() == [dup.size * (dup.size + 1) / 2]


def test_sizes_that_differ_raise_on_every_rank_and_copy_nothing(dup):
    cross = _opened(dup)
    if cross is None or dup.size == 1:
        pytest.skip("needs cross-memory between two ranks or more")
    x = np.full(5 + dup.rank, float(dup.rank))
    with pytest.raises(CrossReduceError, match="arrays of"):
        drive(cross.steps(dup, x, np.add), wait)
    assert (x == dup.rank).all()
    assert cross.on


def test_a_failed_copy_raises_on_every_rank_and_turns_the_path_off(dup):
    """A peer that cannot be read (here: rank 0 is given a pid nobody has) fails the call on
    every rank, and ``reduce_steps`` leaves later calls to MPI."""
    drive(reduce_steps(dup, np.ones(4), np.add), wait)  # opens the path kept on ``dup``
    cross = _held(dup)[0]
    if cross is None or dup.size == 1:
        pytest.skip("needs cross-memory between two ranks or more")
    if dup.rank == 0:
        cross.pids[1] = 2**22 + 7  # above Linux's pid_max: no such process
    x = np.ones(64)
    with pytest.raises(CrossReduceError, match="partial values"):
        drive(cross.steps(dup, x, np.add), wait)
    assert not cross.on
    done, posted = drive(reduce_steps(dup, x, np.add), wait)
    assert (done, posted) == (False, 0)


def test_off_on_one_rank_is_off_on_every_rank(dup, monkeypatch):
    if dup.rank == dup.size - 1:
        monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")
    assert _opened(dup) is None


def test_gradsync_reduces_a_large_array_by_cross_memory(comm):
    """A gradient of at least ``MIN_BYTES``: the channel says cross-memory on a node where it
    opens, and the bytes are MPI's (two ranks) or every rank's same exact sum (integers)."""
    n = MIN_BYTES // 4 + 3
    dtype = np.float32 if comm.size <= 2 else np.int32
    grads = {"w": _data(comm.rank, n, dtype), "b": _data(comm.rank, 10, dtype)}
    expected = {k: v.copy() for k, v in grads.items()}
    for v in expected.values():
        comm.Allreduce(MPI.IN_PLACE, v)
    with GradSync(comm) as sync:
        report = sync.allreduce(grads)
        again = sync.allreduce({k: _data(comm.rank, v.size, dtype) for k, v in grads.items()})
    for k in grads:
        assert grads[k].tobytes() == expected[k].tobytes(), k
    probe = comm.Dup()
    opens = comm.size > 1 and _opened(probe) is not None
    probe.Free()
    assert report.channel == again.channel == ("cross-memory" if opens else "mpi")


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_a_reduce_scatter_into_a_separate_output_or_in_place(dup, dtype):
    """With ``out``: this rank's block of the sum, MPI's bytes at two ranks; the input untouched
    (a separate output) or only this rank's block written (the output that block)."""
    cross = _opened(dup)
    if cross is None:
        pytest.skip("cross-memory is not open between these ranks")
    size, rank, count = dup.size, dup.rank, 70_001
    mine = _data(rank, count * size, dtype)
    expected = np.empty(count, dtype)
    dup.Reduce_scatter_block(mine, expected, MPI.SUM)
    x, out = mine.copy(), np.empty(count, dtype)
    drive(cross.steps(dup, x, np.add, out=out), wait)
    assert x.tobytes() == mine.tobytes()
    if size <= 2 or np.dtype(dtype).kind == "i":
        assert out.tobytes() == expected.tobytes()
    block = slice(rank * count, (rank + 1) * count)
    drive(cross.steps(dup, x, np.add, out=x[block]), wait)
    assert x[block].tobytes() == out.tobytes()
    assert np.delete(x, np.s_[block]).tobytes() == np.delete(mine, np.s_[block]).tobytes()


@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_gradsync_reduces_many_large_tensors_together(comm, op):
    """Tensors each under ``MIN_BYTES`` that hold more together, with small ones (fused) and
    other dtypes beside them: every array's bytes those of MPI's all-reduce of it (two ranks;
    exact integers beyond), on the first call and a repeated one."""
    exact = comm.size > 2  # small integers, as floats for avg: any order sums them alike
    dtype = np.int64 if exact and op != "avg" else np.float32
    n = MIN_BYTES // 4 // 12 + 1  # 12 of them (plus an odd value each) pass the threshold
    names = [f"w{i:02d}" for i in range(14)]

    def grads(seed: int) -> dict:
        kind = np.int64 if exact else dtype
        out = {
            name: _data(comm.rank + seed + i, n, kind).astype(dtype) for i, name in enumerate(names)
        }
        out["bias"] = _data(comm.rank + seed, 100, kind).astype(dtype)  # fused
        out["steps"] = np.full(3, comm.rank + seed, np.int64)
        return out

    mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "avg": MPI.SUM}[op]
    with GradSync(comm, op=op) as sync:
        for seed in (0, 7):
            mine = grads(seed)
            expected = {k: v.copy() for k, v in mine.items()}
            for v in expected.values():
                comm.Allreduce(MPI.IN_PLACE, v, mpi_op)
                if op == "avg":
                    if v.dtype.kind == "f":
                        v /= v.dtype.type(comm.size)
                    else:
                        v //= comm.size
            sync.allreduce(mine)
            for k in mine:
                assert mine[k].tobytes() == expected[k].tobytes(), (seed, k)
