"""The cross-memory broadcast (:mod:`mpisync.transports.crossbcast`) with the real MPI library:
root's bytes on every rank for any root and size (root's part written, the rest read), sizes
that differ raised on every rank with nothing copied, a failed copy raised on every rank with
the path off afterwards, and off on one rank off everywhere."""

import numpy as np
import pytest
from mpi4py import MPI

from mpisync.transports.cma import enabled
from mpisync.transports.crossbcast import bcast_steps, root_part
from mpisync.transports.crossreduce import CrossReduce, CrossReduceError, _held, drive

from mpiutil import everyone, last_rank, wait

pytestmark = pytest.mark.mpi


def _opened(dup) -> CrossReduce | None:
    held = _held(dup)
    drive(bcast_steps(dup, np.zeros(1, np.uint8), 0), wait)  # the probe, kept on ``dup``
    return held[0]


def _data(rank: int, n: int) -> np.ndarray:
    return np.random.default_rng(500 + rank).integers(0, 256, n).astype(np.uint8)


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("n", [0, 1, 4097, 3 * (1 << 20) + 5])
def test_every_rank_gets_roots_bytes(dup, where, n):
    root = 0 if where == "first" else last_rank(dup)
    for round_ in range(2):  # the second call finds the probe's answer kept on the communicator
        x = _data(dup.rank + 10 * round_, n)
        done, _ = drive(bcast_steps(dup, x, root), wait)
        # open wherever every rank may copy and all share one node (as the multi-host runs don't)
        one_node = len(set(dup.allgather(MPI.Get_processor_name()))) == 1
        assert done == (everyone(dup, enabled()) and one_node)
        if done:
            assert x.tobytes() == _data(root + 10 * round_, n).tobytes(), round_
        else:
            assert x.tobytes() == _data(dup.rank + 10 * round_, n).tobytes()  # nothing copied


def test_roots_part_and_the_receivers_part_cover_the_array():
    for size in (2, 3, 4):
        for n in (0, 1, 10, 1 << 20):
            assert 0 <= root_part(n, size) <= n


def test_sizes_that_differ_raise_on_every_rank_and_copy_nothing(dup):
    cross = _opened(dup)
    if cross is None or dup.size == 1:
        pytest.skip("needs cross-memory between two ranks or more")
    x = np.full(100 + dup.rank, dup.rank, np.uint8)
    with pytest.raises(CrossReduceError, match="arrays of different sizes to one broadcast"):
        drive(bcast_steps(dup, x, 0), wait)
    assert (x == dup.rank).all()
    assert cross.on


def test_a_failed_copy_raises_on_every_rank_and_turns_the_path_off(dup):
    """Rank 0 (root) is given a pid nobody has for rank 1: its writes fail, every rank raises,
    and later calls leave the broadcast to MPI."""
    cross = _opened(dup)
    if cross is None or dup.size == 1:
        pytest.skip("needs cross-memory between two ranks or more")
    if dup.rank == 0:
        cross.pids[1] = 2**22 + 7  # above Linux's pid_max: no such process
    x = np.full(64 << 10, dup.rank, np.uint8)
    with pytest.raises(CrossReduceError, match="receivers' arrays hold partial bytes"):
        drive(bcast_steps(dup, x, 0), wait)
    assert not cross.on
    done, posted = drive(bcast_steps(dup, x, 0), wait)
    assert (done, posted) == (False, 0)


def test_off_on_one_rank_is_off_on_every_rank(dup, monkeypatch):
    if dup.rank == dup.size - 1:
        monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")
    assert _opened(dup) is None
