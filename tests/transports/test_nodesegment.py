"""Host bytes through the node's shared segment: when it is used, that it moves every byte, and
fallback."""

import glob

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync.transports import nodesegment as intranode

from mpiutil import everyone, same_bytes, values


def _one_node(comm) -> bool:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return everyone(comm, node.size == comm.size)
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


def _fill(params, comm, step):
    for name, replicas in params.items():
        shape, dtype = SHAPES[name]
        replicas[0][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
        for replica in replicas[1:]:
            replica[...] = 0


def _peers_with_shared_memory(comm, monkeypatch, setting: str | None) -> None:
    """Skip a job of one rank; else ``MPISYNC_SHARED_MEMORY`` is ``setting`` (``None``: unset, the
    default) and cross-memory copies are off (tests/transports/test_crossmemory.py has those)."""
    if comm.size == 1:
        pytest.skip("no peers")
    if setting is None:
        monkeypatch.delenv("MPISYNC_SHARED_MEMORY", raising=False)
    else:
        monkeypatch.setenv("MPISYNC_SHARED_MEMORY", setting)
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")


def _set_step(params, shapes, rank, step) -> None:
    """Each array of ``params`` (one per name of ``shapes``) takes ``rank``'s values of ``step``."""
    for name, (shape, dtype) in shapes.items():
        params[name][...] = values(f"{name}.{step}", rank, shape, dtype)


def _assert_roots_step(params, shapes, step) -> None:
    """Each array of ``params`` (one per name of ``shapes``) holds root 0's values of ``step``."""
    for name, (shape, dtype) in shapes.items():
        assert same_bytes(params[name], values(f"{name}.{step}", 0, shape, dtype)), (step, name)


@pytest.mark.mpi
@pytest.mark.parametrize("asked", ["1", "0"])
@pytest.mark.parametrize("fusion_bytes", [256 << 10, 3 << 20])
def test_the_setting_decides_the_segment_from_the_first_sync(
    comm, fusion_bytes, asked, monkeypatch
):
    _peers_with_shared_memory(comm, monkeypatch, asked)  # on every rank
    shared = everyone(comm, intranode.enabled() and intranode.ring_available()) and _one_node(comm)
    before = _segments()
    params = {n: [np.zeros(s, d), np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    channels = []
    with mpisync.ParamSync(comm, fusion_bytes=fusion_bytes) as syncer:
        for step in range(4):
            _fill(params, comm, step)
            report = syncer.sync(params, verify=True)
            channels.append(report.channel)
            for name, (shape, dtype) in SHAPES.items():
                for replica in params[name]:
                    assert same_bytes(replica, values(f"{name}.{step}", 0, shape, dtype)), (
                        step,
                        name,
                    )
        assert syncer.buffer_bytes <= 16 * fusion_bytes + (64 << 10)  # one transport's buffers
    # no trial: the same from the first sync
    assert channels == ["shared memory" if shared else "mpi"] * 4
    assert _segments() <= before  # the file is unlinked as soon as every rank mapped it


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", ["all small", "one large"])
def test_by_default_the_segment_carries_sets_of_small_tensors_only(comm, sizes, monkeypatch):
    _peers_with_shared_memory(comm, monkeypatch, None)  # the default, on every rank
    fusion_bytes = 64 << 10
    shapes = {f"s{i:03d}": ((i % 50 + 1, 7), "float32") for i in range(300)}  # 28 B to 1.4 KiB each
    if sizes == "one large":
        # not smaller than fusion_bytes: a direct transfer
        shapes["large"] = ((fusion_bytes,), "uint8")
    shared = everyone(comm, intranode.ring_available()) and _one_node(comm) and sizes == "all small"
    params = {n: np.zeros(s, d) for n, (s, d) in shapes.items()}
    channels = []
    with mpisync.ParamSync(comm, fusion_bytes=fusion_bytes) as syncer:
        for step in range(4):
            _set_step(params, shapes, comm.rank, step)
            channels.append(syncer.sync(params).channel)
            _assert_roots_step(params, shapes, step)
        if shared:  # a few slots of one bucket each
            assert syncer.buffer_bytes <= intranode.SMALL_SLOTS * fusion_bytes + (64 << 10)
    assert channels == ["shared memory" if shared else "mpi"] * 4


@pytest.mark.mpi
def test_one_shot_sync_params_takes_the_segment_too(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("no peers")
    monkeypatch.delenv("MPISYNC_SHARED_MEMORY", raising=False)
    shared = everyone(comm, intranode.ring_available()) and _one_node(comm)
    shapes = {f"s{i:04d}": ((100,), "float32") for i in range(2000)}
    before = _segments()
    for step in range(3):
        params = {n: values(f"{n}.{step}", comm.rank, s, d) for n, (s, d) in shapes.items()}
        report = mpisync.sync_params(params, comm)
        assert report.channel == ("shared memory" if shared else "mpi")
        _assert_roots_step(params, shapes, step)
    assert _segments() <= before


@pytest.mark.mpi
def test_back_to_back_syncs_reuse_slots_in_order(comm):
    # 3 MiB + 1 B is 4 pieces of a 1 MiB slot, plus buckets: the chunk count per sync is not a
    # multiple
    # of the slot count, so slot k of one sync follows a different chunk of the last one.
    shapes = {
        "w": ((3 * (1 << 20) + 1,), "uint8"),
        **{f"b{i}": ((1000,), "int32") for i in range(40)},
    }
    params = {n: values(n, comm.rank, s, d) for n, (s, d) in shapes.items()}
    with mpisync.ParamSync(comm, max_concurrent=4, fusion_bytes=64 << 10, timeout=30) as syncer:
        syncer._prefer("shared memory")  # skip the trial: the shared segment from the first sync on
        for step in range(25):  # no barrier between syncs: the slot handshake alone orders them
            _set_step(params, shapes, comm.rank, step)
            syncer.sync(params)
            _assert_roots_step(params, shapes, step)


@pytest.mark.mpi
def test_one_rank_without_shared_memory_makes_every_rank_use_mpi(comm, monkeypatch):
    _peers_with_shared_memory(comm, monkeypatch, "1")
    if comm.rank == comm.size - 1:
        monkeypatch.setattr(intranode, "available", lambda: False)
    params = {n: [np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    with mpisync.ParamSync(comm) as syncer:
        for step in range(3):
            _fill(params, comm, step)
            assert syncer.sync(params).channel == "mpi"
            for name, (shape, dtype) in SHAPES.items():
                assert same_bytes(params[name][0], values(f"{name}.{step}", 0, shape, dtype)), name


@pytest.mark.mpi
def test_a_setting_that_differs_between_ranks_is_the_same_error_everywhere(comm, monkeypatch):
    _peers_with_shared_memory(comm, monkeypatch, "0" if comm.rank == comm.size - 1 else "1")
    params = {n: [np.zeros(s, d)] for n, (s, d) in SHAPES.items()}  # "big": not a small set
    with mpisync.ParamSync(comm) as syncer:
        _fill(params, comm, 0)
        before = {n: p[0].copy() for n, p in params.items()}
        with pytest.raises(mpisync.ManifestMismatchError) as info:
            syncer.sync(params)
        assert "MPISYNC_SHARED_MEMORY: " in str(info.value), info.value
        assert f"rank {comm.size - 1}=False" in str(info.value), info.value
        for name, array in before.items():
            assert same_bytes(params[name][0], array), f"{name} was written"


@pytest.mark.mpi
def test_a_segment_file_removed_during_set_up_fails_no_rank(comm, monkeypatch):
    # A cleaner removes root's file between its creation and the others opening it: every rank
    # learns it in the set-up's all-reduce and keeps MPI, within the sync, with root's bytes.
    import os
    import time

    _peers_with_shared_memory(comm, monkeypatch, "1")
    if comm.rank == 0:
        real = os.posix_fallocate

        def fallocate_then_remove(fd, offset, length):
            real(fd, offset, length)
            for path in glob.glob(f"/dev/shm/{intranode._owner_prefix()}{os.getpid()}-*"):
                os.unlink(path)

        monkeypatch.setattr(intranode._os, "posix_fallocate", fallocate_then_remove)
    params = {n: [np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    _fill(params, comm, 0)
    start = time.monotonic()
    with mpisync.ParamSync(comm, timeout=60) as syncer:
        report = syncer.sync(params, verify=True)
    assert time.monotonic() - start < 30
    assert report.channel == "mpi"
    for name, (shape, dtype) in SHAPES.items():
        assert same_bytes(params[name][0], values(f"{name}.0", 0, shape, dtype)), name


def test_shared_memory_setting_is_every_set_never_or_small_sets(monkeypatch):
    from mpisync.transports import nodesegment as intranode

    for raw, expected in (
        ("1", True),
        ("on", True),
        ("0", False),
        ("off", False),
        ("", None),
        (" ", None),
    ):
        monkeypatch.setenv("MPISYNC_SHARED_MEMORY", raw)
        assert intranode.setting() is expected, raw
    monkeypatch.delenv("MPISYNC_SHARED_MEMORY")
    assert intranode.setting() is None and not intranode.enabled()


def test_stale_segment_files_of_dead_creators_are_removed(tmp_path):
    import os
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    prefix = intranode._owner_prefix()
    stale = f"/dev/shm/{prefix}{dead.pid}-feedbeef"
    live = f"/dev/shm/{prefix}{os.getpid()}-feedbeef"
    # this process's own name: in an MPI pass another rank's finally must not remove it first
    other = f"/dev/shm/mpisync-not-ours-{os.getpid()}"
    for path in (stale, live, other):
        open(path, "wb").close()
    try:
        removed = intranode.remove_stale_segments()
        # (in an MPI pass every rank runs this: another rank's clean-up may take the file first)
        assert live not in removed and other not in removed
        assert not os.path.exists(stale) and os.path.exists(live) and os.path.exists(other)
    finally:
        for path in (stale, live, other):
            if os.path.exists(path):
                os.unlink(path)
