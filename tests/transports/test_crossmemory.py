"""Large host tensors by cross-memory copies: the trial, byte-exact results, rebinding, fallback to
MPI."""

import logging

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync.transports import cma as crossmemory

from mpiutil import everyone, last_rank, same_bytes, values

pytestmark = pytest.mark.mpi

# Direct transfers (above the 64 KiB fusion size) with a second replica each, a run of views end to
# end in one buffer (a span), small tensors (read in runs of root's memory), and an empty one.
SHAPES = {
    "big": ((3 * (1 << 20) + 12345,), "uint8"),
    "mid": ((70_000,), "float32"),
    "odd": ((333, 777), "float16"),
    **{f"small.{i:03d}": ((i % 17 + 1, 3), "float16") for i in range(100)},
    "empty": ((0,), "float64"),
}
SPAN = {f"flat.{i}": ((40_000,), "float32") for i in range(3)}


def _one_node(comm) -> bool:
    return len(set(comm.allgather(MPI.Get_processor_name()))) == 1


def _make(comm):
    params = {n: [np.zeros(s, d), np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    flat = np.zeros(sum(np.prod(s) for s, _ in SPAN.values()), np.float32)
    for i, name in enumerate(SPAN):
        params[name] = flat[i * 40_000 : (i + 1) * 40_000]
    return params


def _fill(params, comm, step):
    for name, (shape, dtype) in {**SHAPES, **SPAN}.items():
        replicas = params[name] if isinstance(params[name], list) else [params[name]]
        replicas[0][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
        for replica in replicas[1:]:
            replica[...] = 0


def _check(params, root, step):
    for name, (shape, dtype) in {**SHAPES, **SPAN}.items():
        replicas = params[name] if isinstance(params[name], list) else [params[name]]
        for replica in replicas:
            assert same_bytes(replica, values(f"{name}.{step}", root, shape, dtype)), (step, name)


@pytest.mark.parametrize("where", ["first", "last"])
def test_large_tensors_on_one_node_take_cross_memory_from_the_first_sync(comm, where, monkeypatch):
    if comm.size == 1:
        pytest.skip("no peers")
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "1")
    root = 0 if where == "first" else last_rank(comm)
    cross = everyone(comm, crossmemory.enabled()) and _one_node(comm)
    params = _make(comm)
    channels = []
    with mpisync.ParamSync(comm, root=root, fusion_bytes=64 << 10) as syncer:
        for step in range(4):
            _fill(params, comm, step)
            report = syncer.sync(params, verify=True)
            channels.append(report.channel)
            _check(params, root, step)
    # no trial: the same from the first sync
    assert channels == ["cross-memory" if cross else "mpi"] * 4


def test_an_array_replaced_on_one_rank_is_reached_by_every_rank(comm):
    # Bare arrays: the fast path reuses a rank's steps while its arrays stay the same objects. A new
    # array has a new address, so every rank must bind again, or root would write into (and
    # receivers read from) memory that no longer holds the parameter.
    if comm.size == 1:
        pytest.skip("no peers")
    params = {n: np.zeros(s, d) for n, (s, d) in SHAPES.items()}

    def check(step):
        for name, (shape, dtype) in SHAPES.items():
            assert same_bytes(params[name], values(f"{name}.{step}", 0, shape, dtype)), (step, name)

    with mpisync.ParamSync(comm, fusion_bytes=64 << 10, timeout=30) as syncer:
        syncer._prefer("cross-memory")
        for step, who in enumerate([None, None, last_rank(comm), 0, None]):
            if comm.rank == who:
                params["big"] = np.zeros_like(params["big"])
                params["odd"] = params["odd"].copy()
            for name, (shape, dtype) in SHAPES.items():
                params[name][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
            channel = syncer.sync(params).channel
            check(step)
            assert channel == comm.bcast(channel, 0)


def test_one_rank_without_cross_memory_makes_every_rank_use_mpi(comm, monkeypatch):
    # The OS refuses the copies on one rank (no process_vm_readv there): every rank keeps MPI.
    # (A setting that differs between ranks is an error instead: tests/contract/test_errors.py.)
    if comm.size == 1:
        pytest.skip("no peers")
    if comm.rank == last_rank(comm):
        monkeypatch.setattr(crossmemory, "_CALLS", None)
    # the next choice after cross-memory, where it is on
    params = _make(comm)
    with mpisync.ParamSync(comm, fusion_bytes=64 << 10) as syncer:
        syncer._prefer("cross-memory")
        for step in range(3):
            _fill(params, comm, step)
            assert syncer.sync(params).channel == "mpi"
            _check(params, 0, step)


def test_failed_copies_on_one_rank_are_redone_through_mpi_on_every_rank(comm, monkeypatch, caplog):
    if comm.size == 1:
        pytest.skip("no peers")
    # the next choice after cross-memory, where it is on
    cross = everyone(comm, crossmemory.enabled()) and _one_node(comm)
    params = _make(comm)
    with mpisync.ParamSync(comm, fusion_bytes=64 << 10) as syncer:
        syncer._prefer("cross-memory")
        _fill(params, comm, 0)
        assert syncer.sync(params).channel == ("cross-memory" if cross else "mpi")
        _check(params, 0, 0)
        # this rank's copies fail from now on (root has written its share)
        if comm.rank == last_rank(comm):
            monkeypatch.setattr(crossmemory.Copies, "run", lambda copies: False)
        _fill(params, comm, 1)
        with caplog.at_level(logging.WARNING, logger="mpisync"):
            first = syncer.sync(params)
        _check(params, 0, 1)  # the direct transfers went again through MPI, in the same sync
        if cross:
            assert first.channel == "cross-memory" and "redoes them through MPI" in caplog.text
        _fill(params, comm, 2)
        assert syncer.sync(params).channel == "mpi"  # and every later sync keeps MPI
        _check(params, 0, 2)


def test_thousands_of_small_tensors_in_runs_of_root_memory(comm):
    # More small tensors than one system call takes (1024 iovecs a side), with allocator gaps
    # between them on root, read a run at a time; a second replica each for the fan-out.
    if comm.size == 1:
        pytest.skip("no peers")
    shapes = {f"t{i:04d}": ((i % 13 + 1,), "int16") for i in range(3000)}
    params = {n: [np.zeros(s, d), np.zeros(s, d)] for n, (s, d) in shapes.items()}
    with mpisync.ParamSync(comm) as syncer:
        syncer._prefer("cross-memory")
        for step in range(2):
            for name, (shape, dtype) in shapes.items():
                params[name][0][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
            report = syncer.sync(params)
            for name, (shape, dtype) in shapes.items():
                for replica in params[name]:
                    assert same_bytes(replica, values(f"{name}.{step}", 0, shape, dtype)), (
                        step,
                        name,
                    )
            assert report.channel == comm.bcast(report.channel, 0)
