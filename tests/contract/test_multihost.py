"""Checks that mean most across hosts: which node each rank is on, that a sync's bytes cross the
network (the hosts of ci/multihost.sh share no memory: no shortcut may carry them), and a 256 MB+
parameter set."""

import os
import socket

import numpy as np
import pytest
from mpi4py import MPI

import mpisync

from mpiutil import everyone, same_bytes

pytestmark = pytest.mark.mpi

RX_BYTES = "/sys/class/net/eth0/statistics/rx_bytes"  # the host's own link in ci/multihost.sh


def _expected_nodes() -> int:
    return int(os.environ.get("MPISYNC_EXPECT_NODES") or 0)  # set by ci/multihost.sh on every rank


def _ipc_namespace() -> int:
    try:
        return int(os.readlink("/proc/self/ns/ipc").split("[")[1].rstrip("]"))
    except (OSError, IndexError, ValueError):
        return 0


def _rx_bytes() -> int:
    with open(RX_BYTES) as f:
        return int(f.read())


def test_ranks_know_their_nodes(comm):
    expected = _expected_nodes()
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
    assert len(nodes) == expected, nodes
    assert per_node * len(nodes) == comm.size
    # Hosts share no IPC namespace (nor PID, nor /dev/shm), ranks of one host share theirs.
    ipc = np.array([_ipc_namespace()], np.int64)
    every_ipc = np.empty(comm.size, np.int64)
    comm.Allgather(ipc, every_ipc)
    by_node = {}
    for row, ns in zip(names, every_ipc.tolist()):
        by_node.setdefault(bytes(row).rstrip(b"\0"), set()).add(ns)
    assert all(len(v) == 1 for v in by_node.values()), by_node
    assert len({ns for v in by_node.values() for ns in v}) == expected, by_node


def _sync_and_count(comm, syncer, params, root_here: bool):
    """Bytes each host's eth0 received during one sync; rows (received, root's host?) of every
    rank."""
    comm.Barrier()
    before = _rx_bytes()
    comm.Barrier()  # nobody sends before every host has read its counter
    report = syncer.sync(params)
    comm.Barrier()
    row = np.array([_rx_bytes() - before, int(root_here)], np.int64)
    rows = np.empty((comm.size, 2), np.int64)
    comm.Allgather(row, rows)
    return report, rows


def test_sync_bytes_cross_the_network(comm):
    """Every host but root's receives at least the payload on eth0, once per host (not once per
    rank)."""
    if _expected_nodes() < 2 or not everyone(comm, os.path.exists(RX_BYTES)):
        pytest.skip("only meaningful under ci/multihost.sh")
    root = comm.size - 1  # on the last host
    shapes = {f"w{i}": (1 << 20,) for i in range(8)}  # 8 x 4 MiB of float32 ...
    shapes.update({f"b{i:03d}": (100,) for i in range(200)})  # ... and 200 small ones, fused
    params = {n: np.full(s, comm.rank + i, np.float32) for i, (n, s) in enumerate(shapes.items())}
    payload = sum(a.nbytes for a in params.values())
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        root_here = not everyone(node_comm, comm.rank != root)
    finally:
        node_comm.Free()
    with mpisync.ParamSync(comm, root=root) as syncer:
        for which in ("first", "repeated"):
            report, rows = _sync_and_count(comm, syncer, params, root_here)
            assert report.bytes == payload
            received = [int(r[0]) for r in rows if not r[1]]
            assert received and min(received) >= payload, (which, payload, received)
            # one copy per host: ranks of one host share it through the host's memory, not the link
            assert max(received) <= 1.05 * payload + (1 << 20), (which, payload, received)
    for i, (n, s) in enumerate(shapes.items()):
        assert same_bytes(params[n], np.full(s, root + i, np.float32)), n


@pytest.mark.slow
def test_parameter_set_over_256mb(comm):
    root = comm.size - 1
    shapes = {f"block{i:02d}.weight": (1024, 1024) for i in range(64)}  # 256 MiB of float32
    shapes.update({f"block{i:02d}.bias": (1024,) for i in range(64)})

    def fill(rank, i, shape):
        return np.full(shape, rank * 1000 + i, dtype=np.float32)

    params = {n: fill(comm.rank, i, s) for i, (n, s) in enumerate(shapes.items())}
    with mpisync.ParamSync(comm, root=root) as syncer:
        reports = [syncer.sync(params, verify=True) for _ in range(2)]
    assert all(r.bytes > 256 * 2**20 and r.verified for r in reports)
    # ranks on several nodes: no cross-memory
    if os.environ.get("MPISYNC_EXPECT_NODES", "1") != "1":
        assert [r.channel for r in reports] == ["mpi", "mpi"]
    for i, (n, s) in enumerate(shapes.items()):
        assert same_bytes(params[n], fill(root, i, s)), n
