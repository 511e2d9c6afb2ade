"""Host bytes through the node's shared segment: when it is used, that it moves every byte, and fallback."""

import glob

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync import intranode
from mpisync.channels import ChannelTrial
from mpiutil import everyone, same_bytes, values

pytestmark = pytest.mark.mpi


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


@pytest.mark.parametrize("asked", ["1", "0"])
@pytest.mark.parametrize("fusion_bytes", [256 << 10, 3 << 20])
def test_mpi_first_then_the_shared_segment_then_the_faster(comm, fusion_bytes, asked, monkeypatch):
    if comm.size == 1:
        pytest.skip("no peers")
    monkeypatch.setenv("MPISYNC_SHARED_MEMORY", asked)  # on every rank
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")  # its turn in the trial: tests/test_crossmemory.py
    shared = everyone(comm, intranode.enabled()) and _one_node(comm)
    before = _segments()
    params = {n: [np.zeros(s, d), np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    channels = []
    with mpisync.ParamSync(comm, fusion_bytes=fusion_bytes) as syncer:
        for step in range(8):
            _fill(params, comm, step)
            report = syncer.sync(params, verify=True)
            channels.append(report.channel)
            for name, (shape, dtype) in SHAPES.items():
                for replica in params[name]:
                    assert same_bytes(replica, values(f"{name}.{step}", 0, shape, dtype)), (step, name)
        assert syncer.buffer_bytes <= 16 * fusion_bytes + (64 << 10)  # only the winner's buffers stay
    second = "shared memory" if shared else "mpi"
    assert channels[:6] == ["mpi"] * 3 + [second] * 3  # three syncs each: set-up, then two timed
    assert channels[6] == channels[7] and channels[6] in channels[:6]
    assert _segments() <= before  # the file is unlinked as soon as every rank mapped it


@pytest.mark.parametrize("sizes", ["all small", "one large"])
def test_by_default_the_segment_is_tried_for_sets_of_small_tensors_only(comm, sizes, monkeypatch):
    if comm.size == 1:
        pytest.skip("no peers")
    monkeypatch.delenv("MPISYNC_SHARED_MEMORY", raising=False)  # the default, on every rank
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")
    fusion_bytes = 64 << 10
    shapes = {f"s{i:03d}": ((i % 50 + 1, 7), "float32") for i in range(300)}  # 28 B to 1.4 KiB each
    if sizes == "one large":
        shapes["large"] = ((fusion_bytes,), "uint8")  # not smaller than fusion_bytes: a direct transfer
    shared = everyone(comm, intranode.available()) and _one_node(comm) and sizes == "all small"
    params = {n: np.zeros(s, d) for n, (s, d) in shapes.items()}
    channels = []
    with mpisync.ParamSync(comm, fusion_bytes=fusion_bytes) as syncer:
        for step in range(8):
            for name, (shape, dtype) in shapes.items():
                params[name][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
            channels.append(syncer.sync(params).channel)
            for name, (shape, dtype) in shapes.items():
                assert same_bytes(params[name], values(f"{name}.{step}", 0, shape, dtype)), (step, name)
        if channels[-1] == "shared memory":  # a few slots of one bucket each
            assert (syncer._node.slots, syncer._node.slot_bytes) == (intranode.SMALL_SLOTS, fusion_bytes)
            assert syncer.buffer_bytes <= intranode.SMALL_SLOTS * fusion_bytes + (64 << 10)
    assert channels[:6] == ["mpi"] * 3 + ["shared memory" if shared else "mpi"] * 3
    assert channels[6] == channels[7] and channels[6] in channels[:6]


def test_back_to_back_syncs_reuse_slots_in_order(comm):
    # 3 MiB + 1 B is 4 pieces of a 1 MiB slot, plus buckets: the chunk count per sync is not a multiple
    # of the slot count, so slot k of one sync follows a different chunk of the last one.
    shapes = {"w": ((3 * (1 << 20) + 1,), "uint8"), **{f"b{i}": ((1000,), "int32") for i in range(40)}}
    params = {n: values(n, comm.rank, s, d) for n, (s, d) in shapes.items()}
    with mpisync.ParamSync(comm, max_concurrent=4, fusion_bytes=64 << 10, timeout=30) as syncer:
        syncer._prefer("shared memory")  # skip the trial: the shared segment from the first sync on
        for step in range(25):  # no barrier between syncs: the slot handshake alone orders them
            for name, (shape, dtype) in shapes.items():
                params[name][...] = values(f"{name}.{step}", comm.rank, shape, dtype)
            syncer.sync(params)
            for name, (shape, dtype) in shapes.items():
                assert same_bytes(params[name], values(f"{name}.{step}", 0, shape, dtype)), (step, name)


def test_one_rank_without_shared_memory_makes_every_rank_use_mpi(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("no peers")
    monkeypatch.setenv("MPISYNC_SHARED_MEMORY", "0" if comm.rank == comm.size - 1 else "1")
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "0")
    params = {n: [np.zeros(s, d)] for n, (s, d) in SHAPES.items()}
    with mpisync.ParamSync(comm) as syncer:
        for step in range(3):
            _fill(params, comm, step)
            assert syncer.sync(params).channel == "mpi"
            for name, (shape, dtype) in SHAPES.items():
                assert same_bytes(params[name][0], values(f"{name}.{step}", 0, shape, dtype)), name


def test_the_trial_keeps_the_channel_that_moved_bytes_faster():
    trial = ChannelTrial()
    every = ("mpi", "cross-memory", "shared memory")

    def sync(channel, nbytes, seconds, slowest_us):  # one sync on ``channel``, then the next validation
        assert trial.choose(every) == channel
        trial.moved(channel, nbytes, seconds)
        trial.record(slowest_us)

    sync("mpi", 1000, 0.030, 30_000)  # a channel's first sync is not timed: set-up skews it
    assert trial.rates == {}
    sync("mpi", 1000, 0.004, 4000)
    sync("mpi", 1000, 0.002, 2000)  # the best of the timed syncs counts: 2 ms
    assert trial.choose(("mpi",)) == "mpi" and trial.choose(("mpi", "shared memory")) == "shared memory"
    assert not trial.settled(every)
    sync("cross-memory", 1000, 0.050, 50_000)
    sync("cross-memory", 1000, 0.0005, 4000)  # another rank was slower: its time decides
    sync("cross-memory", 1000, 0.0005, 5000)
    assert trial.settled(("mpi", "cross-memory")) and not trial.settled(every)
    sync("shared memory", 1000, 0.0005, 500)
    sync("shared memory", 1000, 0.0005, 1000)
    sync("shared memory", 1000, 0.0005, 1000)
    assert trial.settled(every) and trial.choose(every) == "shared memory"
    assert trial.choose(("mpi", "cross-memory")) == "mpi"  # the segment became unavailable
    sync("shared memory", 1000, 0.1, 100_000)  # later measurements do not reopen the choice
    assert trial.choose(every) == "shared memory"
    assert trial.rates == {"mpi": 0.5, "cross-memory": 0.25, "shared memory": 1.0}
