"""The cross-memory all-gather (:mod:`mpisync.transports.crossgather`) with the real MPI library:
every rank's bytes in every rank's blocks, in place or from a separate input, sizes that differ
and a failed copy raised on every rank, and the path off everywhere when one rank turns it off."""

import numpy as np
import pytest

from mpisync.transports.crossgather import gather_steps
from mpisync.transports.crossreduce import CrossReduceError, _held, drive

from mpiutil import wait

pytestmark = pytest.mark.mpi


def _data(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(500 + rank).integers(0, 256, n, dtype=np.uint8)


def _opened(dup) -> bool:
    """Whether the path is open on ``dup`` (probing it if needed; the same on every rank)."""
    done, _ = drive(
        gather_steps(dup, np.zeros(1, np.uint8), [np.zeros(1, np.uint8)] * dup.size), wait
    )
    return done


@pytest.mark.parametrize("n", [0, 1, 4097, 300001])
@pytest.mark.parametrize("form", ["separate blocks", "one output, in place", "one output, plain"])
def test_every_ranks_bytes_land_in_every_ranks_blocks(dup, n, form):
    rank, size = dup.rank, dup.size
    if not _opened(dup):
        pytest.skip("cross-memory is not open between these ranks")
    if form == "separate blocks":
        send = _data(rank, n)
        blocks = [np.full(n, 7, np.uint8) for _ in range(size)]
    else:
        out = np.full(n * size, 7, np.uint8)
        blocks = [out[r * n : (r + 1) * n] for r in range(size)]
        send = blocks[rank] if form == "one output, in place" else _data(rank, n)
        send[...] = _data(rank, n)
    done, posted = drive(gather_steps(dup, send, blocks), wait)
    assert (done, posted) == (True, 2)
    for r in range(size):
        assert blocks[r].tobytes() == _data(r, n).tobytes(), r
    assert send.tobytes() == _data(rank, n).tobytes()


def test_sizes_that_differ_raise_on_every_rank_and_copy_nothing(dup):
    if not _opened(dup) or dup.size == 1:
        pytest.skip("needs cross-memory between two ranks or more")
    send = np.full(5 + dup.rank, 3, np.uint8)
    blocks = [np.zeros(5 + dup.rank, np.uint8) for _ in range(dup.size)]
    with pytest.raises(CrossReduceError, match="inputs of different sizes"):
        drive(gather_steps(dup, send, blocks), wait)
    assert all((b == 0).all() for b in blocks)
    assert _held(dup)[0].on


def test_a_failed_copy_raises_on_every_rank_and_turns_the_path_off(dup):
    """A peer that cannot be read (rank 0 is given a pid nobody has) fails the call on every
    rank; later calls post nothing and leave the gather to MPI."""
    if not _opened(dup) or dup.size == 1:
        pytest.skip("needs cross-memory between two ranks or more")
    cross = _held(dup)[0]
    if dup.rank == 0:
        cross.pids[1] = 2**22 + 7  # above Linux's pid_max: no such process
    send = _data(dup.rank, 64)
    blocks = [np.zeros(64, np.uint8) for _ in range(dup.size)]
    with pytest.raises(CrossReduceError, match="partial blocks"):
        drive(gather_steps(dup, send, blocks), wait)
    assert not cross.on
    assert drive(gather_steps(dup, send, blocks), wait) == (False, 0)


def test_off_on_one_rank_is_off_on_every_rank(dup, monkeypatch):
    if dup.rank == dup.size - 1:
        monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")
    send = _data(dup.rank, 8)
    assert drive(gather_steps(dup, send, [send] * dup.size), wait) == (False, 2)
