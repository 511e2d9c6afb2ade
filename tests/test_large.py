"""A tensor over 2**31 bytes and elements crosses in chunks of at most 1 GiB."""

import numpy as np
import pytest

import mpisync

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

N = 2**31 + 4099  # elements and bytes, past what a C int holds


def _pattern(n):
    # A period of 251 (prime) makes any misplaced chunk visible.
    return np.resize(np.arange(251, dtype=np.uint8), n)


def test_tensor_over_2gib(comm):
    if comm.size != 2:
        pytest.skip("runs at 2 ranks only: 2 x 4.3 GiB fits this machine's memory, 4 x does not")
    root = 1
    data = _pattern(N) if comm.rank == root else np.zeros(N, np.uint8)
    report = mpisync.sync_params({"huge": data}, comm, root=root, verify=True)
    assert report.bytes == N and report.verified
    assert report.collectives == 1 + 1 + 3 + 1  # Idup, validation, 3 chunks of <= 1 GiB, verification
    expected = _pattern(N)
    assert np.array_equal(data, expected)
