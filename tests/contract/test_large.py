"""Load: a 3 GiB tensor (past 2**31 bytes and elements), 100 000 tiny tensors, 1000 repeated
syncs."""

import os

import numpy as np
import pytest

import mpisync

from mpiutil import need_ranks, same_bytes, values

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

N = 3 * 2**30 + 4099  # bytes and elements of one uint8 tensor
PERIOD = 251  # prime: any chunk landing at the wrong offset shows


STEP = 256 << 20
# byte i of the tensor is i % PERIOD
_TILE = np.resize(np.arange(PERIOD, dtype=np.uint8), STEP + PERIOD)


def _pattern(start, n):
    offset = start % PERIOD
    return _TILE[offset : offset + n]


def test_one_3gib_tensor(comm):
    if comm.size != 2:
        pytest.skip("runs at 2 ranks only: 2 x 3 GiB fits this machine's memory with room to spare")
    root = 1
    data = np.empty(N, np.uint8) if comm.rank == root else np.zeros(N, np.uint8)
    step = STEP
    if comm.rank == root:
        for start in range(0, N, step):
            data[start : start + step] = _pattern(start, min(step, N - start))
    report = mpisync.sync_params({"huge": data}, comm, root=root, verify=True)
    assert report.bytes == N and report.verified
    assert report.transfers == 4  # chunks of at most 1 GiB
    # Idup, facts, validation, verification, and: MPI 4 chunks; cross-memory its probe (2), address
    # exchange and closing all-reduce
    assert report.collectives == {"mpi": 8, "cross-memory": 8}[report.channel]
    for start in range(0, N, step):  # compared chunk by chunk: no second 3 GiB copy
        assert np.array_equal(data[start : start + step], _pattern(start, min(step, N - start))), (
            start
        )


def test_100k_tiny_tensors(comm):
    root = comm.size - 1
    names = [f"t{i:06d}" for i in range(100_000)]
    params = {
        n: np.full(1 + i % 4, (comm.rank * 7 + i) % 127, np.int8) for i, n in enumerate(names)
    }
    report = mpisync.sync_params(params, comm, root=root, verify=True)
    assert report.tensors == 100_000
    for i, n in enumerate(names):
        assert params[n].tolist() == [(root * 7 + i) % 127] * (1 + i % 4), n


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_1000_repeated_syncs_hold_memory_and_communicators_flat(comm):
    shapes = {f"w{i}": ((64, 16 + i), "float32") for i in range(50)}
    params = {n: values(n, comm.rank, s, d) for n, (s, d) in shapes.items()}
    with mpisync.ParamSync(comm, root=0) as syncer:
        for _ in range(100):
            syncer.sync(params)
        rss_100, dup = _rss(), syncer._link.comm
        for step in range(900):
            report = syncer.sync(params, verify=(step % 100 == 0))
            assert syncer._link.comm is dup  # one duplicated communicator for the ParamSync's life
        rss_1000 = _rss()
    assert report.tensors == 50
    for n, (s, d) in shapes.items():
        assert same_bytes(params[n], values(n, 0, s, d))
    assert rss_1000 - rss_100 < 8 << 20, (
        f"RSS grew by {(rss_1000 - rss_100) / 2**20:.1f} MiB over 900 syncs"
    )


def test_3000_cold_calls_free_their_communicators(comm):
    need_ranks(comm, 2)  # one rank alone duplicates nothing
    # MPICH has a few thousand context ids: leaking one duplicated communicator per call would fail
    # here.
    params = {"w": values("w", comm.rank, (8,), "float32")}
    for _ in range(3000):
        mpisync.sync_params(params, comm, root=0)
    assert same_bytes(params["w"], values("w", 0, (8,), "float32"))
