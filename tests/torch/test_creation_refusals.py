"""A setting that one rank cannot read when a process group is created (an invalid switch, an
invalid number): every rank raises the same ``InvalidParamError`` naming that rank, promptly,
directly or through ``torch.distributed.new_group``; the next creation, with the setting fixed,
works. Valid at any number of ranks from 2."""

import pytest

from mpiutil import need_ranks, raises_everywhere

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync  # noqa: E402
import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.torch.process_group import ProcessGroupMPISync  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def process_group():
    # short: a rank that raised alone would leave the others to this timeout (the job aborts)
    mpisync.torch.init_process_group(timeout=20)
    yield dist.group.WORLD
    dist.destroy_process_group()


_SETTINGS = [
    ("MPISYNC_TORCH_SYNC_PARAMS", "maybe"),
    ("MPISYNC_TORCH_CHECK", "maybe"),
    ("MPISYNC_CROSS_MEMORY", "nope"),
    ("MPISYNC_MAX_CONCURRENT", "many"),
]


def _works(group) -> None:
    tensor = torch.ones(3)
    group.allreduce([tensor]).wait()
    assert tensor.tolist() == [float(group.size())] * 3


@pytest.mark.parametrize("how", ["directly", "new_group"])
@pytest.mark.parametrize(("name", "value"), _SETTINGS, ids=[n for n, _ in _SETTINGS])
def test_a_setting_one_rank_cannot_read_is_refused_on_every_rank(
    comm, monkeypatch, how, name, value
):
    need_ranks(comm, 2)
    bad = comm.size - 1
    if comm.rank == bad:
        monkeypatch.setenv(name, value)

    def create():
        if how == "directly":
            return ProcessGroupMPISync(comm, timeout=20)
        return dist.new_group(backend="mpisync")

    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        create,
        "was refused on every rank",
        f"rank {bad}: ",
        name,
    )
    monkeypatch.delenv(name, raising=False)
    group = create()
    _works(group)
    if how == "directly":
        group.shutdown()
    else:
        dist.destroy_process_group(group)


def test_a_name_mpisync_does_not_know_on_one_rank_is_no_refusal(comm, monkeypatch):
    """``MPISYNC_HUGE_PAGES`` is gone: a warning where it is set, the group made everywhere."""
    need_ranks(comm, 2)
    if comm.rank == comm.size - 1:
        monkeypatch.setenv("MPISYNC_HUGE_PAGES", "nope")
    group = ProcessGroupMPISync(comm, timeout=20)
    _works(group)
    group.shutdown()
