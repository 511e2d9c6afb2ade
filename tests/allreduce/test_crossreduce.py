"""Large tensors reduced by cross-memory reads on one node (mpisync.allreduce.crossreduce): the
same bytes on every rank as the reference, the channel named, and a failed read on one rank redone
through MPI on every rank."""

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync.allreduce import crossreduce
from mpisync.transports import cma

from mpiutil import everyone

pytestmark = pytest.mark.mpi

_LARGE = crossreduce.MIN_BYTES // 4 + 13  # float32 values: just over the floor, an odd count


def _reachable(comm) -> bool:
    """Whether the cross-memory reads can serve this job (facts every rank shares)."""
    hosts = comm.allgather(cma.host_word())
    return comm.size > 1 and everyone(comm, cma.enabled()) and len(set(hosts)) == 1


def _values(rank: int, count: int, dtype, seed: int) -> np.ndarray:
    # small whole numbers: every order of adding them gives the same bits, so the reference is exact
    rng = np.random.default_rng(seed * 1009 + rank)
    return rng.integers(-50, 50, count).astype(dtype)


def _reference(comm, count: int, dtype, seed: int, op: str) -> np.ndarray:
    stack = np.stack([_values(r, count, dtype, seed) for r in range(comm.size)])
    if op in ("sum", "avg"):
        total = stack.sum(axis=0, dtype=dtype)
        if op == "avg":
            return (total / comm.size).astype(dtype) if dtype != np.int32 else total // comm.size
        return total
    return stack.max(axis=0) if op == "max" else stack.min(axis=0)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_large_tensors_match_the_reference_on_every_rank(comm, op, dtype):
    sizes = {"big": _LARGE, "small": 100, "bigger": 3 * _LARGE, "tiny": 3}
    through = "cross-memory" if _reachable(comm) else "mpi"
    with mpisync.GradSync(comm, op=op) as syncer:
        for call in range(3):  # the reads are bound once and reused
            params = {n: _values(comm.rank, c, dtype, call + len(n)) for n, c in sizes.items()}
            report = syncer.allreduce(params)
            for name, count in sizes.items():
                expected = _reference(comm, count, dtype, call + len(name), op)
                assert params[name].tobytes() == expected.tobytes(), (name, call)
            assert report.channel in (through, "shared memory"), report.channel


def test_a_set_of_large_tensors_only_names_the_channel(comm):
    through = "cross-memory" if _reachable(comm) else "mpi"
    params = {"w": _values(comm.rank, _LARGE, np.float32, 1)}
    report = mpisync.allreduce(params, comm)
    assert report.channel == through
    assert params["w"].tobytes() == _reference(comm, _LARGE, np.float32, 1, "sum").tobytes()


@pytest.mark.parametrize("phase", ["combine", "gather"])
def test_a_failed_read_on_the_last_rank_is_redone_through_mpi_on_every_rank(
    comm, monkeypatch, phase
):
    if not _reachable(comm):
        pytest.skip("needs cross-memory reads between every two ranks of one node")
    real = getattr(crossreduce.CrossProgram, phase)

    def fails_on_the_last_rank(self, *args):
        done = real(self, *args)  # half the work is done, then the read "fails"
        return done and comm.rank != comm.size - 1

    monkeypatch.setattr(crossreduce.CrossProgram, phase, fails_on_the_last_rank)
    sizes = {"a": _LARGE, "b": 2 * _LARGE}
    with mpisync.GradSync(comm, op="sum") as syncer:
        for call in range(2):
            params = {n: _values(comm.rank, c, np.float32, call + c) for n, c in sizes.items()}
            syncer.allreduce(params)
            for name, count in sizes.items():
                expected = _reference(comm, count, np.float32, call + count, "sum")
                assert params[name].tobytes() == expected.tobytes(), (phase, name, call)
    # the ranks agree after each phase: none is left behind
    assert comm.allreduce(1, op=MPI.SUM) == comm.size
