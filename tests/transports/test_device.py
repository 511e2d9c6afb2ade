"""Device buffers on the simulated backend: the staged and CUDA-aware pipelines with real MPI.

The simulated device runs every copy asynchronously on a worker thread per
stream, so these tests exercise the pipeline's ordering, chunking, slot reuse
and overlap exactly as a GPU would (tests/devices/test_gpu.py runs them on real GPUs).
"""

import numpy as np
import pytest

import mpisync
from mpisync.devices.simulated import BACKEND
from mpisync.devices.simulated import SimulatedDeviceArray as Dev

from mpiutil import last_rank, need_ranks, raises_everywhere, values

pytestmark = pytest.mark.mpi


def _params(rank):
    return {
        "big": [
            Dev(values("big", rank, (300, 1001), "float32"), 0),
            Dev(np.zeros((300, 1001), np.float32), 1),
            # replicas on another device and on the same one
            Dev(np.zeros((300, 1001), np.float32), 0),
        ],
        "odd": Dev(values("odd", rank, (12345,), "uint8"), 1),
        "host": [values("host", rank, (17,), "float64"), np.zeros(17)],
        **{
            f"tiny{i:02d}": Dev(values(f"tiny{i:02d}", rank, (i + 1,), "int16"), i % 2)
            for i in range(30)
        },
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
    with mpisync.ParamSync(
        comm, root=root, gpu_transport=transport, fusion_bytes=64, max_concurrent=3
    ) as syncer:
        syncer._device_chunk_bytes = chunk  # every rank sets it: small chunks exercise the pipeline
        report = syncer.sync(params, verify=True)
    _check(params, root)
    assert report.transport == ("local" if comm.size == 1 else transport)
    assert report.verified


def test_pinned_slots_bounded_reused_and_pipelined(comm):
    need_ranks(comm, 2)
    # 1 MiB = 8 chunks of 128 KiB
    params = {"w": Dev(values("w", comm.rank, (1 << 18,), "float32"), 0)}
    with mpisync.ParamSync(
        comm, root=0, gpu_transport="staged", max_concurrent=3, fusion_bytes=4096
    ) as syncer:
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
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.sync_params(params, comm, root=0),
        f"rank {bad}: parameter 'w' is in device memory, on root in host memory",
    )


def test_host_and_device_replicas_of_one_name_are_refused(comm):
    params = {"w": [Dev(values("w", comm.rank, (4,), "float32"), 0), np.zeros(4, np.float32)]}
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm),
        "replica 1 is in host memory and the master is not",
    )


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
    with mpisync.ParamSync(
        comm, root=0, gpu_transport=transport, fusion_bytes=0, max_concurrent=4
    ) as syncer:
        syncer._device_chunk_bytes = 8 << 20
        for step in range(30):
            master = Dev(np.full(n, (comm.rank + step) % 251, np.uint8), 0)
            replicas = [master, Dev(np.zeros(n, np.uint8), 1), Dev(np.zeros(n, np.uint8), 0)]
            syncer.sync({"w": replicas, "after": Dev(np.full(3, comm.rank, np.uint8), 0)})
            for replica in replicas:
                assert (replica.get() == step % 251).all(), step


# -- kernels that cannot be built: fused buckets are packed with per-tensor copies
# ---------------------


@pytest.mark.parametrize("fault", ["build", "pack"])
def test_pack_falls_back_to_copies_when_the_kernel_cannot_be_built(comm, fault):
    # "build": the kernel fails to compile when checked, before the first broadcast (as CuPy without
    # NVRTC); "pack": it fails only when a bucket is packed, in the middle of a sync. Either way the
    # sync completes with the same bytes, the buckets packed by one device copy per tensor.
    need_ranks(comm, 2)
    root = last_rank(comm)
    BACKEND.simulate_kernel_fault(fault)
    try:
        packs, copies = BACKEND.copies["pack"], BACKEND.copies["copy"]
        for _ in range(2):
            params = _params(comm.rank)
            with mpisync.ParamSync(
                comm, root=root, gpu_transport="staged", fusion_bytes=64, max_concurrent=3
            ) as s:
                report = s.sync(params, verify=True)
            _check(params, root)
            assert report.transport == "staged" and report.fused_buckets > 0
        if comm.rank == root:
            assert "simulated" in BACKEND.kernel_failure
            assert BACKEND.copies["pack"] == packs  # no bucket was packed by the kernel
            assert BACKEND.copies["copy"] - copies >= 2 * 30  # one copy per tiny tensor, each sync
    finally:
        BACKEND.simulate_kernel_fault(None)
    params = _params(comm.rank)
    mpisync.sync_params(params, comm, root=root, gpu_transport="staged", fusion_bytes=64)
    _check(params, root)
    if comm.rank == root:
        assert BACKEND.kernel_failure is None and BACKEND.copies["pack"] > packs  # kernels again


# -- root posts each broadcast as soon as its chunk is on the host
# -----------------------------------


def _flight(states, nbytes=16):
    """Transfers in flight on COMM_SELF, in the given states, over simulated pinned chunks."""
    from mpisync.transports.device_pipeline import DeviceSlots, DeviceStep, _Item

    slots = DeviceSlots(len(states), nbytes)
    flight = []
    for slot, state in enumerate(states):
        view = BACKEND.flat_bytes(Dev(np.full(nbytes, slot, np.uint8)))
        step = DeviceStep(False, nbytes, [view], [], BACKEND, 0, (0,), (f"t{slot}",))
        item = _Item(step, slot)
        item.buffer = slots.pinned(BACKEND, slot)[:nbytes]
        item.buffer[:] = slot + 100
        item.state = state
        item.arrived = False
        flight.append(item)
    return slots, flight


def _ready(done: bool):
    import threading

    event = threading.Event()
    if done:
        event.set()
    return event


def test_root_posts_a_chunk_on_the_host_while_an_earlier_broadcast_is_on_the_wire():
    # Real MPI requests on COMM_SELF: transfer 0's "broadcast" is a receive nobody has sent yet,
    # so it stays incomplete; transfers 1 and 2 have their chunks on the host (events done).
    from mpi4py import MPI

    from mpisync.transports.device_pipeline import _advance

    comm = MPI.COMM_SELF.Dup()
    slots, flight = _flight(["broadcasting", "preparing", "preparing", "preparing"])
    hold = np.zeros(1, np.uint8)
    flight[0].request = comm.Irecv(hold, source=0, tag=7)
    flight[1].event, flight[2].event, flight[3].event = _ready(True), _ready(True), _ready(False)
    try:
        assert _advance(comm, 0, flight, slots, True, True, None)
        assert flight[0].state == "broadcasting" and not flight[0].arrived
        assert [item.state for item in flight[1:3]] == ["broadcasting", "broadcasting"]  # posted
        assert flight[3].state == "preparing"  # its chunk is not on the host yet
        flight[3].event.set()
        _advance(comm, 0, flight, slots, True, True, None)
        assert flight[3].state == "broadcasting"
        assert slots.max_posted >= 3
    finally:
        comm.Send(np.ones(1, np.uint8), dest=0, tag=7)
        flight[0].request.Wait()
        comm.Free()
    assert hold[0] == 1


def test_postings_keep_plan_order_and_arrivals_are_acted_on_in_plan_order():
    import time

    from mpi4py import MPI

    from mpisync.transports.device_pipeline import _advance

    comm = MPI.COMM_SELF.Dup()
    # Root: transfer 1's chunk is late, so transfer 2 (ready) must wait for it: postings stay in
    # order.
    slots, flight = _flight(["preparing", "preparing", "preparing"])
    flight[0].event, flight[1].event, flight[2].event = _ready(True), _ready(False), _ready(True)
    _advance(comm, 0, flight, slots, True, True, None)
    assert flight[0].state in ("broadcasting", "done")  # posted
    assert [item.state for item in flight[1:]] == ["preparing", "preparing"]
    flight[0].request.Wait()
    # Another rank: transfer 1 arrived before transfer 0; it is acted on (copied to the device) only
    # after.
    slots, flight = _flight(["broadcasting", "broadcasting"])
    hold = np.zeros(1, np.uint8)
    flight[0].request = comm.Irecv(hold, source=0, tag=8)
    flight[1].request = comm.Ibcast([flight[1].buffer, MPI.BYTE], 0)
    try:
        _advance(comm, 1, flight, slots, True, False, None)
        deadline = time.monotonic() + 10
        while not flight[1].arrived and time.monotonic() < deadline:  # MPI may need a few tests
            _advance(comm, 1, flight, slots, True, False, None)
        assert flight[1].arrived and flight[1].state == "broadcasting"  # arrived, held back
    finally:
        comm.Send(np.ones(1, np.uint8), dest=0, tag=8)
        flight[0].request.Wait()
    flight[0].arrived = True
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the simulated stream's worker thread runs the copies
        _advance(comm, 1, flight, slots, True, False, None)
        if all(item.state == "done" for item in flight):
            break
        time.sleep(0.001)
    assert [item.state for item in flight] == ["done", "done"]
    # the pinned chunks reached the "device"
    assert [item.step.views[0][0] for item in flight] == [100, 101]
    comm.Free()


def test_late_device_to_host_copies_still_give_every_byte(comm, monkeypatch):
    # Every other chunk's device-to-host copy is slow on root: later chunks are posted as they land.
    import time

    need_ranks(comm, 2)
    calls = []
    fast = BACKEND.to_host

    def slow_to_host(dst, src, stream):
        calls.append(1)
        if len(calls) % 2:
            stream.enqueue(lambda: time.sleep(0.02))
        fast(dst, src, stream)

    monkeypatch.setattr(BACKEND, "to_host", slow_to_host)
    params = {"w": Dev(values("w", comm.rank, (1 << 17,), "float32"), 0)}  # 512 KiB = 8 chunks
    with mpisync.ParamSync(
        comm, root=0, gpu_transport="staged", max_concurrent=4, fusion_bytes=4096
    ) as syncer:
        syncer._device_chunk_bytes = 64 << 10
        for _ in range(3):
            syncer.sync(params)
            assert params["w"].get().tobytes() == values("w", 0, (1 << 17,), "float32").tobytes()
    if comm.rank == 0:
        assert len(calls) == 3 * 8


# -- pinned buffers belong to the syncer that uses them
# ----------------------------------------------


def test_pinned_buffers_are_freed_with_their_syncer(comm):
    import gc

    need_ranks(comm, 2)
    chunk = 64 << 10
    params = {"w": Dev(values("w", comm.rank, (1 << 16,), "float32"), 0)}  # 256 KiB = 4 chunks

    def syncer():
        s = mpisync.ParamSync(
            comm, root=0, gpu_transport="staged", max_concurrent=2, fusion_bytes=4096
        )
        s._device_chunk_bytes = chunk
        return s

    gc.collect()
    before = BACKEND.pinned_live_bytes
    first = syncer()
    first.sync(params)
    held = BACKEND.pinned_live_bytes - before
    assert 0 < held <= 2 * chunk  # max_concurrent x chunk
    first.sync(params)
    second = syncer()
    second.sync(params)
    assert BACKEND.pinned_live_bytes - before == 2 * held  # each syncer has its own
    second.close()
    gc.collect()
    assert BACKEND.pinned_live_bytes - before == held
    first.close()
    gc.collect()
    assert BACKEND.pinned_live_bytes == before
    for _ in range(4):  # one-shot calls keep nothing pinned behind them
        mpisync.sync_params(params, comm, root=0, gpu_transport="staged", fusion_bytes=4096)
    gc.collect()
    assert BACKEND.pinned_live_bytes == before
    assert params["w"].get().tobytes() == values("w", 0, (1 << 16,), "float32").tobytes()


def test_torch_backend_finds_a_pinned_views_tensor_through_its_base_and_keeps_nothing():
    import gc
    import weakref

    torch = pytest.importorskip("torch")
    from mpisync.devices.torch_backend import TorchBackend

    backend = TorchBackend()
    backend._pin = lambda nbytes: torch.zeros(nbytes, dtype=torch.uint8)  # a CPU build cannot pin
    host = backend.pinned(1000)
    view = host[100:300]
    tensor = backend._pinned_tensor(view)
    assert tensor.data_ptr() == view.ctypes.data and tensor.numel() == 200
    tensor.fill_(7)
    assert (host[100:300] == 7).all() and host[99] == 0 and host[300] == 0
    foreign = np.zeros(5, np.uint8)
    # not pinned: from_numpy
    assert backend._pinned_tensor(foreign).data_ptr() == foreign.ctypes.data
    owner = weakref.ref(host.base)
    del host, view, tensor
    gc.collect()
    assert owner() is None  # the backend held no reference: the memory went with its last view
    assert not [
        name
        for name, value in vars(backend).items()
        if isinstance(value, (list, dict, set)) and name != "_kernels_checked"
    ]
