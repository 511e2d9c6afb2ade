"""Unit tests of mpisync.params.verify: the per-parameter digest and the rows ranks compare."""

import numpy as np
import pytest

from mpisync.params.manifest import build_manifest
from mpisync.params.verify import buffer_digest, param_digests, verify

# Every fixed-size numpy dtype kind a parameter may have (a broadcast moves bytes, not numbers).
DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    ">i4",
    "M8[s]",
    "m8[ms]",
    "S3",
    "U2",
    "V5",
    [("a", "<i2"), ("b", "<f4")],
]


def _bytes_of(array) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def _flip(array, position: int):
    """Flip the lowest bit of one byte of ``array`` in place (0 and 1 stay valid booleans)."""
    array.reshape(-1).view(np.uint8)[position] ^= 1


def test_digest_is_xxh3_128_of_the_bytes():
    # A known answer: every rank, whatever its xxhash release, must compute the same digest.
    assert buffer_digest(b"").hex() == "99aa06d3014798d86001c324468d497f"
    assert len(buffer_digest(b"abc")) == 16
    assert buffer_digest(np.zeros(0, np.float32)) == buffer_digest(b"")
    assert buffer_digest(np.zeros((0, 7), np.float64)) == buffer_digest(b"")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_digest_reads_every_dtypes_bytes_in_place(dtype):
    rng = np.random.default_rng(7)
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, size=5 * 3 * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw %= 2
    array = raw.view(dtype).reshape(5, 3)
    digest = buffer_digest(array)
    assert digest == buffer_digest(array.tobytes())
    assert digest == buffer_digest(memoryview(array.reshape(-1).view(np.uint8)))
    zero_d = array[:1, :1].reshape(())
    assert buffer_digest(zero_d) == buffer_digest(array[:1, :1].tobytes())
    for position in (0, array.nbytes // 2, array.nbytes - 1):
        changed = array.copy()
        _flip(changed, position)
        assert buffer_digest(changed) != digest, position


@pytest.mark.parametrize("size", [1, 15, 16, 17, 128, 129, 240, 241, 1024, 1 << 20, (1 << 20) + 3])
def test_any_one_changed_byte_changes_the_digest(size):
    """One flipped bit at the start, the end and inside each of XXH3's input-length paths."""
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    digest = buffer_digest(data)
    for position in sorted({0, size // 3, size // 2, size - 1}):
        changed = data.copy()
        changed[position] ^= 0x80
        assert buffer_digest(changed) != digest, position


def test_non_contiguous_arrays_are_refused_not_copied():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    for strided in (array[:, ::2], array.T, array[::2]):
        if strided.flags.c_contiguous:
            continue
        with pytest.raises(ValueError, match="contiguous"):
            buffer_digest(strided)


def _mixed_params():
    rng = np.random.default_rng(3)
    params = {}
    for i, dtype in enumerate(DTYPES):
        dtype = np.dtype(dtype)
        raw = rng.integers(0, 256, size=6 * dtype.itemsize, dtype=np.uint8)
        params[f"p{i:02d}"] = (raw % 2 if dtype == np.bool_ else raw).view(dtype).reshape(2, 3)
    params["big"] = rng.standard_normal(300_000).astype(np.float32)
    params["empty"] = np.zeros((0, 3), np.float32)
    params["scalar"] = np.array(2.5)
    return params


def test_rows_hold_each_masters_digest_and_name_the_changed_parameter():
    params = _mixed_params()
    manifest = build_manifest(params, rank=1, size=2, root=0)
    rows = param_digests(manifest)
    assert rows.shape == (len(params), 3) and rows.dtype == np.int64
    for (name, value), row in zip(sorted(params.items()), rows):
        assert row[:2].tobytes() == buffer_digest(_bytes_of(value)), name
        assert row[2] == 1
    for name in ("p00", "p09", "big", "scalar", sorted(params)[-1]):
        value = params[name]
        for position in (0, value.nbytes - 1):
            _flip(value, position)
            changed = param_digests(build_manifest(params, rank=1, size=2, root=0))
            _flip(value, position)
            differs = (changed[:, :2] != rows[:, :2]).any(axis=1)
            assert [manifest.names[i] for i in np.flatnonzero(differs)] == [name]


def test_swapped_parameters_of_one_shape_are_both_named():
    a, b = np.arange(8, dtype=np.int32), np.arange(8, 16, dtype=np.int32)
    rows = param_digests(build_manifest({"a": a, "b": b}, rank=1, size=2, root=0))
    swapped = param_digests(build_manifest({"a": b, "b": a}, rank=1, size=2, root=0))
    assert (swapped[:, :2] != rows[:, :2]).any(axis=1).tolist() == [True, True]
    assert np.array_equal(swapped[::-1, :2], rows[:, :2])


@pytest.mark.parametrize("which", ["first", "last"])
def test_one_rank_names_a_local_replica_that_differs(which):
    params = {
        n: [np.arange(5, dtype=np.int16) * i, np.arange(5, dtype=np.int16) * i]
        for i, n in enumerate("abc")
    }
    manifest = build_manifest(params, rank=0, size=1, root=0)
    assert verify(None, manifest, 0, None) == 0
    _flip(params["b"][1], 0 if which == "first" else params["b"][1].nbytes - 1)
    with pytest.raises(Exception, match=r"rank 0: 'b'$") as info:
        verify(None, manifest, 0, None)
    assert type(info.value).__name__ == "VerificationError"
    assert str(info.value) == (
        "mpisync: verification failed, bytes differ from root rank 0's: rank 0: 'b'"
    )


def test_torch_dtypes_digest_their_bytes():
    torch = pytest.importorskip("torch")
    dtypes = [
        torch.bool,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
    ]
    generator = torch.Generator().manual_seed(5)
    params = {}
    for dtype in dtypes:
        raw = torch.randint(
            0, 256, (4 * 3 * dtype.itemsize,), dtype=torch.uint8, generator=generator
        )
        if dtype == torch.bool:
            raw %= 2
        params[str(dtype)] = raw.view(dtype).reshape(4, 3)
    params["torch.empty"] = torch.zeros(0, 5, dtype=torch.bfloat16)
    manifest = build_manifest(params, rank=1, size=2, root=0)
    rows = param_digests(manifest)
    for name, row in zip(manifest.names, rows):
        expected = params[name].reshape(-1).view(torch.uint8).numpy().tobytes()
        assert row[:2].tobytes() == buffer_digest(expected), name
    for name in ("torch.bfloat16", "torch.float16", "torch.bool", "torch.int8"):
        tensor = params[name]
        tensor.reshape(-1).view(torch.uint8)[-1] ^= 1
        changed = param_digests(build_manifest(params, rank=1, size=2, root=0))
        tensor.reshape(-1).view(torch.uint8)[-1] ^= 1
        differs = (changed[:, :2] != rows[:, :2]).any(axis=1)
        assert [manifest.names[i] for i in np.flatnonzero(differs)] == [name]
