"""Units: the per-sync re-check of prepared arrays (mpisync.params.recheck) and the names' digest
encoding."""

import numpy as np
import pytest

from mpisync.params import recheck
from mpisync.params.manifest import build_manifest, params_digest

from unitutil import LOOP_FORMS, loops_of


@pytest.fixture(params=LOOP_FORMS)
def path(request, monkeypatch):
    monkeypatch.setattr(recheck, "loops", loops_of(request.param))
    return request.param


def test_unchanged_arrays_pass(path):
    values = (np.zeros(5), np.ones((2, 3), np.float32), np.zeros(0, np.int8), np.array(3.0))
    assert recheck.unchanged(values, recheck.snapshot(values))


@pytest.mark.parametrize("change", ["read-only", "resized", "reshaped", "dtype", "strides"])
def test_each_change_is_seen(path, change):
    arrays = [np.arange(12, dtype=np.float64), np.zeros((3, 4), np.float32)]
    values = tuple(arrays)
    state = recheck.snapshot(values)
    a = arrays[0]
    if change == "read-only":
        a.flags.writeable = False
    elif change == "resized":
        a.resize((5000,), refcheck=False)
    elif change == "reshaped":
        a.shape = (3, 4)
    elif change == "dtype":
        a.dtype = np.int64
    else:
        arrays[1].strides = (4, 12)
    assert not recheck.unchanged(values, state)


def test_torch_data_re_pointed_is_seen(path):
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, 4)
    values = (t,)
    state = recheck.snapshot(values)
    assert recheck.unchanged(values, state)
    t.data = t.data.t()  # the same object and storage, other strides
    assert not recheck.unchanged(values, state)


def test_names_split_differently_at_a_nul_digest_differently():
    def digest(names):
        return build_manifest(
            {n: np.zeros(3, np.float32) for n in names}, rank=0, size=2, root=0
        ).digest()

    assert digest(["a\0b", "c"]) != digest(["a", "b\0c"])
    assert digest(["ab", "c"]) != digest(["a", "bc"])
    runs = [["float32", 2]]
    shapes = np.array([1, 3, 1, 3], np.int64).tobytes()
    assert params_digest(["a\0b", "c"], runs, shapes, [[1, 2]], [["h", 2]]) != params_digest(
        ["a", "b\0c"], runs, shapes, [[1, 2]], [["h", 2]]
    )


def test_a_name_with_a_lone_surrogate_has_a_digest():
    manifest = build_manifest({"\ud800": np.zeros(1)}, rank=0, size=2, root=0)
    assert len(manifest.digest()) == 16


def test_a_dtype_changed_twice_is_seen(path):
    # The C loop compares dtypes by address: a dtype freed after the snapshot must not come back
    # at the same address as another dtype and pass as unchanged.
    x = np.zeros(8, dtype=">f4")
    values = (x,)
    state = recheck.snapshot(values)
    # (an equal but new dtype object may count as changed: that only prepares again)
    for _ in range(20):
        x.dtype = np.float32
        x.dtype = ">i4"
        assert not recheck.unchanged(values, state)


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_torch_lazy_conj_and_neg_views_are_seen(path, view):
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, dtype=torch.complex64)
    values = (t,)
    state = recheck.snapshot(values)
    # same storage, a lazy bit set
    t.data = t.data.conj() if view == "conj" else torch._neg_view(t.data)
    assert not recheck.unchanged(values, state)


def test_a_check_that_raises_counts_as_changed(path):
    class Odd:
        @property
        def dtype(self):
            raise RuntimeError("no dtype today")

    values = (np.zeros(3), Odd())
    state = recheck.Snapshot(None, ((1, ("x",)),))
    assert recheck.unchanged(values[:1], recheck.snapshot(values[:1]))
    assert not recheck.unchanged(values, state)


def _torch_snapshot(values):
    from mpisync.params.adapters import torch_cpu_views

    views = torch_cpu_views(values)
    return recheck.snapshot(
        values, dtypes=tuple({id(v.dtype): v.dtype for v in views}.values()), views=views
    )


@pytest.mark.parametrize(
    "change", ["re-pointed", "transposed", "conj", "neg", "resized", "dtype", "not a tensor"]
)
def test_torch_tensors_checked_through_their_numpy_views(path, change):
    # A bulk-prepared torch set is recorded and re-checked through Tensor.numpy() views.
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, 4, dtype=torch.complex64)
    grad = torch.nn.Parameter(torch.zeros(3))
    values = (t, grad)
    state = _torch_snapshot(values)
    assert recheck.unchanged(values, state)
    grad.requires_grad_(False)  # the same memory either way: still unchanged
    assert recheck.unchanged(values, state)
    if change == "re-pointed":
        t.data = torch.zeros(4, 4, dtype=torch.complex64)
    elif change == "transposed":
        t.data = t.data.t()
    elif change == "conj":
        t.data = t.data.conj()
    elif change == "neg":
        t.data = torch._neg_view(t.data)
    elif change == "resized":  # smaller: a storage numpy views cannot grow
        t.resize_(2)
    elif change == "dtype":
        t.data = t.data.view(torch.float64)
    else:
        values = (np.zeros((4, 4), np.complex64), grad)
    assert not recheck.unchanged(values, state)
