"""Real GPU buffers (CuPy, torch CUDA): staged and, when the MPI says so, CUDA-aware.

Skipped on every rank when no rank has a GPU; with ``MPISYNC_REQUIRE_GPU=1``
(ci/gpu-check.sh) a missing GPU fails instead.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync.devices.detect import cuda_aware_mpi

pytestmark = [pytest.mark.mpi, pytest.mark.gpu]
LIBRARIES = ("cupy", "torch")


def _available() -> list:
    found = []
    try:
        import cupy

        found.append(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        found.append(False)
    try:
        import torch

        found.append(torch.cuda.is_available())
    except Exception:
        found.append(False)
    return found


@pytest.fixture
def libraries(comm):
    flags = np.array(_available(), dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MIN)  # skip only on a fact every rank shares
    libs = [lib for lib, ok in zip(LIBRARIES, flags) if ok]
    if not libs:
        if os.environ.get("MPISYNC_REQUIRE_GPU") == "1":
            pytest.fail(
                "MPISYNC_REQUIRE_GPU=1, but neither CuPy nor torch sees a CUDA device on every rank"
            )
        pytest.skip("no GPU (CuPy or torch CUDA) on every rank")
    return libs


class _Lib:
    """The few array operations the tests need, for CuPy or torch."""

    def __init__(self, name, rank):
        self.name = name
        if name == "cupy":
            import cupy

            self.xp, self.ndev = cupy, cupy.cuda.runtime.getDeviceCount()
        else:
            import torch

            self.xp, self.ndev = torch, torch.cuda.device_count()
        self.device = rank % self.ndev

    def array(self, host: np.ndarray, device=None):
        device = self.device if device is None else device
        if self.name == "cupy":
            with self.xp.cuda.Device(device):
                return self.xp.asarray(host)
        return self.xp.from_numpy(host).to(f"cuda:{device}")

    def host(self, array) -> np.ndarray:
        return array.get() if self.name == "cupy" else array.cpu().numpy()


def _values(name, rank, shape, dtype):
    seed = sum(map(ord, name)) * 31 + rank
    return np.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype)


@pytest.mark.parametrize("transport", ["staged", "cuda-aware"])
def test_device_parameters_mixed_with_host(comm, libraries, transport):
    if transport == "cuda-aware" and not cuda_aware_mpi()[0]:
        pytest.skip(f"this MPI is not CUDA-aware: {cuda_aware_mpi()[1]}")
    root = comm.size - 1
    for name in libraries:
        lib = _Lib(name, comm.rank)
        other = (lib.device + 1) % lib.ndev
        shapes = {
            "big": ((1024, 1027), "float32"),
            "small": ((33,), "float16"),
            "scalar": ((), "int64"),
        }
        params = {
            n: [
                lib.array(_values(n, comm.rank, s, d)),
                lib.array(np.zeros(s, d)),
                lib.array(np.zeros(s, d), other),
            ]
            for n, (s, d) in shapes.items()
        }
        params.update(
            {
                f"tiny{i}": lib.array(_values(f"tiny{i}", comm.rank, (i + 1,), "int8"))
                for i in range(40)
            }
        )
        params["host"] = _values("host", comm.rank, (5,), "float64")
        report = mpisync.sync_params(params, comm, root=root, gpu_transport=transport, verify=True)
        assert report.transport == ("local" if comm.size == 1 else transport)
        for n, (s, d) in shapes.items():
            for replica in params[n]:
                assert lib.host(replica).tobytes() == _values(n, root, s, d).tobytes(), (name, n)
        for i in range(40):
            assert (
                lib.host(params[f"tiny{i}"]).tobytes()
                == _values(f"tiny{i}", root, (i + 1,), "int8").tobytes()
            )
        assert params["host"].tobytes() == _values("host", root, (5,), "float64").tobytes()


def test_one_gib_tensor_staged(comm, libraries):
    lib = _Lib(libraries[0], comm.rank)
    n = 1 << 30
    pattern = (np.arange(1 << 20, dtype=np.int64) % 251).astype(np.uint8)
    if comm.rank == 0:
        data = lib.array(np.resize(pattern, n))
    else:
        data = lib.array(np.zeros(n, np.uint8))
    report = mpisync.sync_params({"huge": data}, comm, root=0, gpu_transport="staged", verify=True)
    assert report.verified
    assert lib.host(data[: 1 << 20]).tobytes() == pattern.tobytes()
    assert (
        lib.host(data[n - (1 << 20) :]).tobytes()
        == np.resize(pattern, n)[n - (1 << 20) :].tobytes()
    )


def test_buckets_packed_by_copies_when_kernels_are_unavailable(comm, libraries):
    # As if NVRTC were missing: root packs every bucket of small tensors with one device copy each.
    from mpisync.devices import _get

    root = comm.size - 1
    for name in libraries:
        lib = _Lib(name, comm.rank)
        backend = _get(name)
        saved = backend.kernel_failure
        backend.kernel_failure = "test: kernels marked unavailable"
        try:
            params = {
                f"t{i}": lib.array(_values(f"t{i}", comm.rank, (i + 1,), "int16"))
                for i in range(50)
            }
            report = mpisync.sync_params(
                params, comm, root=root, gpu_transport="staged", verify=True
            )
        finally:
            backend.kernel_failure = saved
        assert report.verified
        for i in range(50):
            assert (
                lib.host(params[f"t{i}"]).tobytes()
                == _values(f"t{i}", root, (i + 1,), "int16").tobytes()
            )


def test_torch_staging_views_resolve_to_their_pinned_tensor(comm, libraries):
    if "torch" not in libraries:
        pytest.skip("torch does not see a GPU on every rank")
    import torch

    from mpisync.devices import _get

    backend = _get("torch")
    host = backend.pinned(1 << 20)
    view = host[4096:8192]
    tensor = backend._pinned_tensor(view)
    assert tensor.is_pinned() and tensor.data_ptr() == view.ctypes.data and tensor.numel() == 4096
    device = (torch.arange(4096, device="cuda:0") % 256).to(torch.uint8)
    backend.to_host(view, device, torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert view.tobytes() == (np.arange(4096) % 256).astype(np.uint8).tobytes()
