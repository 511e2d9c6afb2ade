"""The torch backend's argument check is opt-in: off unless ``MPISYNC_TORCH_CHECK=1``.

The rest of the suite runs with it on (tests/conftest.py); these tests create their groups
without it, as a user's job does by default.
"""

import pytest

from mpiutil import need_ranks, raises_everywhere

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.torch.checks import checking  # noqa: E402
from mpisync.torch.errors import ArgumentError, MismatchError  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", autouse=True)
def process_group():
    mpisync.torch.init_process_group(timeout=60)
    yield
    dist.destroy_process_group()


def test_the_check_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("MPISYNC_TORCH_CHECK", raising=False)
    assert checking() is False
    monkeypatch.setenv("MPISYNC_TORCH_CHECK", "1")
    assert checking() is True


def test_a_default_group_reduces_without_the_check(comm, monkeypatch):
    monkeypatch.delenv("MPISYNC_TORCH_CHECK", raising=False)
    group = dist.new_group(backend="mpisync")
    try:
        assert group._checking is False
        tensor = torch.arange(6, dtype=torch.float64) * (comm.rank + 1)
        dist.all_reduce(tensor, group=group)
        factor = comm.size * (comm.size + 1) // 2
        assert tensor.tolist() == [float(i * factor) for i in range(6)]
    finally:
        dist.destroy_process_group(group)


def test_a_default_group_raises_a_local_problem_at_once(comm, monkeypatch):
    """Without the check, arguments wrong on every rank raise on each at once, before anything
    is posted, naming only this rank's arguments."""
    monkeypatch.delenv("MPISYNC_TORCH_CHECK", raising=False)
    group = dist.new_group(backend="mpisync")
    try:
        outputs = [[torch.zeros(2)] if comm.size > 1 else []]
        with pytest.raises(ArgumentError, match="output list 0 holds") as info:
            group.allgather(outputs, [torch.ones(2)])
        assert "rank 1" not in str(info.value)
        assert outputs[0] == [] or outputs[0][0].tolist() == [0.0, 0.0]  # nothing written
    finally:
        dist.destroy_process_group(group)


def test_asked_for_the_check_catches_ranks_that_disagree(comm, monkeypatch):
    need_ranks(comm, 2)
    monkeypatch.setenv("MPISYNC_TORCH_CHECK", "1")
    group = dist.new_group(backend="mpisync")
    try:
        dtype = torch.float32 if comm.rank == 0 else torch.int32
        tensor = torch.arange(4).to(dtype)
        raises_everywhere(
            comm, MismatchError, lambda: dist.all_reduce(tensor, group=group), "rank 0", "int32"
        )
        assert tensor.tolist() == [0, 1, 2, 3]  # nothing written
    finally:
        dist.destroy_process_group(group)
