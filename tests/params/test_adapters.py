"""Unit tests of mpisync.params.adapters.as_array_view: numpy and torch arrays as views of their
memory."""

import numpy as np
import pytest

from mpisync.params.adapters import UnsupportedArray, as_array_view


def test_array_views_alias_memory_and_name_dtypes_alike():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = as_array_view(a)
    view.data[:4] = bytes(4)  # a memoryview of the same memory
    assert a[0, 0] == 0 and view.shape == (2, 3) and view.dtype == "float32" and view.nbytes == 24
    assert as_array_view(np.zeros(3, ">f4")).dtype == ">float32"
    assert as_array_view(np.float64(3.0).reshape(())).shape == ()
    with pytest.raises(UnsupportedArray, match="unsupported object"):
        as_array_view(object())
    torch = pytest.importorskip("torch")
    assert as_array_view(torch.zeros(2, dtype=torch.float32)).dtype == "float32"
    assert as_array_view(torch.zeros((), dtype=torch.bfloat16)).nbytes == 2


def test_non_contiguous_arrays_are_refused_with_the_fix():
    with pytest.raises(UnsupportedArray) as info:
        as_array_view(np.zeros((3, 4)).T)
    assert str(info.value) == (
        "numpy array with strides (8, 32) is not C-contiguous (a transposed or sliced view?); "
        "sync a C-contiguous array instead: a = np.ascontiguousarray(a) before the sync, then use "
        "that copy"
    )
    torch = pytest.importorskip("torch")
    with pytest.raises(UnsupportedArray) as info:
        as_array_view(torch.nn.Linear(3, 4).weight.t())
    assert str(info.value) == (
        "torch tensor with stride (1, 3) is not contiguous (a transposed or sliced view?); make it "
        "contiguous in place before the sync: param.data = param.data.contiguous()"
    )
