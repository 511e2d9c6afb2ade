"""Host bytes through the node's shared segment: when it is used, that it moves every byte, and fallback."""

import glob

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync import intranode
from mpiutil import same_bytes, values

pytestmark = pytest.mark.mpi


def _everyone(comm, flag: bool) -> bool:
    return bool(comm.allreduce(int(flag), op=MPI.MIN))


def _one_node(comm) -> bool:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return _everyone(comm, node.size == comm.size)
    finally:
        node.Free()


def _segments() -> set:
    return set(glob.glob("/dev/shm/mpisync-*"))


# Slot-sized pieces, an odd number of them, fused buckets and a run of adjacent tensors in one set.
SHAPES = {
    "big": ((3 * (1 << 20) + 12345,), "uint8"),
    "mid": ((70_000,), "float32"),
    **{f"small.{i:03d}": ((i % 17 + 1, 3), "float16") for i in range(300)},
    "empty": ((0,), "float64"),
}


@pytest.mark.parametrize("fusion_bytes", [256 << 10, 3 << 20])
def test_one_node_moves_host_bytes_through_shared_memory(comm, fusion_bytes):
    if comm.size == 1:
        pytest.skip("no peers")
    expected = "shared memory" if _everyone(comm, intranode.enabled()) and _one_node(comm) else "mpi"
    before = _segments()
    params = {n: [values(n, comm.rank, s, d), np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    with mpisync.ParamSync(comm, fusion_bytes=fusion_bytes) as syncer:
        report = syncer.sync(params, verify=True)
        assert report.channel == expected and report.verified
        for name, (shape, dtype) in SHAPES.items():
            for replica in params[name]:
                assert same_bytes(replica, values(name, 0, shape, dtype)), name
    assert _segments() <= before  # the file is unlinked as soon as every rank mapped it


def test_back_to_back_syncs_reuse_slots_in_order(comm):
    # 3 MiB + 1 B is 4 pieces of a 1 MiB slot, plus buckets: the chunk count per sync is not a multiple
    # of the slot count, so slot k of one sync follows a different chunk of the last one.
    shapes = {"w": ((3 * (1 << 20) + 1,), "uint8"), **{f"b{i}": ((1000,), "int32") for i in range(40)}}
    params = {n: values(n, comm.rank, s, d) for n, (s, d) in shapes.items()}
    with mpisync.ParamSync(comm, max_concurrent=4, fusion_bytes=64 << 10, timeout=30) as syncer:
        for step in range(25):  # no barrier between syncs: the slot handshake alone orders them
            for name, (shape, dtype) in shapes.items():
                params[name][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
            syncer.sync(params)
            for name, (shape, dtype) in shapes.items():
                assert same_bytes(params[name], values(f"{name}.{step}", 0, shape, dtype)), (step, name)


def test_one_rank_without_shared_memory_makes_every_rank_use_mpi(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("no peers")
    if comm.rank == comm.size - 1:
        monkeypatch.setenv("MPISYNC_SHARED_MEMORY", "0")
    params = {n: values(n, comm.rank, s, d) for n, (s, d) in SHAPES.items()}
    report = mpisync.sync_params(params, comm, root=0)
    assert report.channel == "mpi"
    for name, (shape, dtype) in SHAPES.items():
        assert same_bytes(params[name], values(name, 0, shape, dtype)), name
