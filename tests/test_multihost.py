"""Checks that mean most across hosts: which node each rank is on, and a 256 MB+ parameter set."""

import os
import socket

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpiutil import same_bytes

pytestmark = pytest.mark.mpi


def test_ranks_know_their_nodes(comm):
    expected = os.environ.get("MPISYNC_EXPECT_NODES")  # set by ci/multihost.sh on every rank
    if not expected:
        pytest.skip("only meaningful under ci/multihost.sh")
    name = MPI.Get_processor_name().encode()[:64].ljust(64, b"\0")
    names = np.empty((comm.size, 64), np.uint8)
    comm.Allgather(np.frombuffer(name, np.uint8), names)
    nodes = {bytes(row).rstrip(b"\0") for row in names}
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        per_node = node_comm.size
    finally:
        node_comm.Free()
    assert socket.gethostname().encode()[:64] == name.rstrip(b"\0")
    assert len(nodes) == int(expected), nodes
    assert per_node * len(nodes) == comm.size


@pytest.mark.slow
def test_parameter_set_over_256mb(comm):
    root = comm.size - 1
    shapes = {f"block{i:02d}.weight": (1024, 1024) for i in range(64)}  # 256 MiB of float32
    shapes.update({f"block{i:02d}.bias": (1024,) for i in range(64)})

    def fill(rank, i, shape):
        return np.full(shape, rank * 1000 + i, dtype=np.float32)

    params = {n: fill(comm.rank, i, s) for i, (n, s) in enumerate(shapes.items())}
    with mpisync.ParamSync(comm, root=root) as syncer:
        reports = [syncer.sync(params, verify=True) for _ in range(2)]  # MPI, then a shared segment if it can
    assert all(r.bytes > 256 * 2**20 and r.verified for r in reports)
    if os.environ.get("MPISYNC_EXPECT_NODES", "1") != "1":  # ranks on several nodes: no segment to share
        assert [r.channel for r in reports] == ["mpi", "mpi"]
    for i, (n, s) in enumerate(shapes.items()):
        assert same_bytes(params[n], fill(root, i, s)), n
