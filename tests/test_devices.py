"""Device buffers on the simulated backend: the staged and CUDA-aware pipelines with real MPI.

The simulated device runs every copy asynchronously on a worker thread per
stream, so these tests exercise the pipeline's ordering, chunking, slot reuse
and overlap exactly as a GPU would (tests/test_gpu.py runs them on real GPUs).
"""

import numpy as np
import pytest

import mpisync
from mpisync.devices.simulated import BACKEND, SimulatedDeviceArray as Dev
from mpiutil import last_rank, need_ranks, raises_everywhere, values

pytestmark = pytest.mark.mpi


def _params(rank):
    return {
        "big": [Dev(values("big", rank, (300, 1001), "float32"), 0), Dev(np.zeros((300, 1001), np.float32), 1),
                Dev(np.zeros((300, 1001), np.float32), 0)],  # replicas on another device and on the same one
        "odd": Dev(values("odd", rank, (12345,), "uint8"), 1),
        "host": [values("host", rank, (17,), "float64"), np.zeros(17)],
        **{f"tiny{i:02d}": Dev(values(f"tiny{i:02d}", rank, (i + 1,), "int16"), i % 2) for i in range(30)},
        "empty": Dev(np.zeros((0, 3), np.float32), 0),
    }


def _check(params, root):
    expected = _params(root)
    for name, value in params.items():
        want = expected[name][0] if isinstance(expected[name], list) else expected[name]
        want = want.get() if isinstance(want, Dev) else want
        for replica in value if isinstance(value, list) else [value]:
            got = replica.get() if isinstance(replica, Dev) else replica
            assert got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize("transport", ["staged", "cuda-aware"])
@pytest.mark.parametrize("chunk", [1000, 1 << 20])
def test_device_params_reach_every_replica(comm, transport, chunk):
    root = last_rank(comm)
    params = _params(comm.rank)
    with mpisync.ParamSync(comm, root=root, gpu_transport=transport, fusion_bytes=64, max_concurrent=3) as syncer:
        syncer._device_chunk_bytes = chunk  # every rank sets it: small chunks exercise the pipeline
        report = syncer.sync(params, verify=True)
    _check(params, root)
    assert report.transport == ("local" if comm.size == 1 else transport)
    assert report.verified


def test_pinned_slots_bounded_reused_and_pipelined(comm):
    need_ranks(comm, 2)
    params = {"w": Dev(values("w", comm.rank, (1 << 18,), "float32"), 0)}  # 1 MiB = 8 chunks of 128 KiB
    with mpisync.ParamSync(comm, root=0, gpu_transport="staged", max_concurrent=3, fusion_bytes=4096) as syncer:
        syncer._device_chunk_bytes = 128 << 10
        syncer.sync(params)
        slots = syncer._device_slots
        allocations = BACKEND.pinned_allocations
        for _ in range(5):
            syncer.sync(params)
        assert BACKEND.pinned_allocations == allocations  # reused across syncs
        assert slots.pinned_bytes <= 3 * (128 << 10)  # max_concurrent x chunk, whatever the model
        assert slots.max_busy == 3  # three chunks in flight at once: copies overlap broadcasts
    assert params["w"].get().tobytes() == values("w", 0, (1 << 18,), "float32").tobytes()


def test_ranks_may_use_different_transports(comm):
    need_ranks(comm, 2)
    params = _params(comm.rank)
    transport = "staged" if comm.rank % 2 == 0 else "cuda-aware"
    report = mpisync.sync_params(params, comm, root=0, gpu_transport=transport)
    _check(params, 0)
    assert report.transport == transport


def test_device_on_one_rank_host_on_root_is_a_mismatch(comm):
    need_ranks(comm, 2)
    bad = last_rank(comm)
    params = {"w": values("w", comm.rank, (4,), "float32")}
    if comm.rank == bad:
        params["w"] = Dev(params["w"], 0)
    raises_everywhere(comm, mpisync.ManifestMismatchError, lambda: mpisync.sync_params(params, comm, root=0),
                      f"rank {bad}: parameter 'w' is in device memory, on root in host memory")


def test_host_and_device_replicas_of_one_name_are_refused(comm):
    params = {"w": [Dev(values("w", comm.rank, (4,), "float32"), 0), np.zeros(4, np.float32)]}
    raises_everywhere(comm, mpisync.InvalidParamError, lambda: mpisync.sync_params(params, comm),
                      "replica 1 is in host memory and the master is not")


def test_sync_state_with_device_leaves(comm):
    root = comm.size // 2
    tree = {"step": comm.rank, "m": Dev(values("m", comm.rank, (9,), "float32"), 0)}
    out = mpisync.sync_state(tree, comm, root=root)
    assert out["step"] == root
    assert tree["m"].get().tobytes() == values("m", root, (9,), "float32").tobytes()


@pytest.mark.parametrize("transport", ["staged", "cuda-aware"])
def test_fan_out_waits_for_every_chunk_whatever_order_they_complete(comm, transport):
    # A big chunk then a tiny one: MPI may complete the tiny Ibcast first. The replicas must
    # still be copied only after every chunk of their master has landed.
    need_ranks(comm, 2)
    n = (8 << 20) + 1
    with mpisync.ParamSync(comm, root=0, gpu_transport=transport, fusion_bytes=0, max_concurrent=4) as syncer:
        syncer._device_chunk_bytes = 8 << 20
        for step in range(30):
            master = Dev(np.full(n, (comm.rank + step) % 251, np.uint8), 0)
            replicas = [master, Dev(np.zeros(n, np.uint8), 1), Dev(np.zeros(n, np.uint8), 0)]
            syncer.sync({"w": replicas, "after": Dev(np.full(3, comm.rank, np.uint8), 0)})
            for replica in replicas:
                assert (replica.get() == step % 251).all(), step
