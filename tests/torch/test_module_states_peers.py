"""DDP's module-state sync on an mpisync group beside the user's own operations: a receive the
user posted before building DDP, matched by a send its peer makes after, completes (the sync
waits for the group's collectives only); a module that differs between ranks is refused on every
rank naming the module's own parameter or buffer. Valid at any number of ranks from 2."""

import pytest

from mpiutil import need_ranks, raises_everywhere

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync  # noqa: E402
import mpisync.torch  # noqa: E402  (registers the backend)


@pytest.fixture(scope="module", autouse=True)
def process_group():
    # short: a sync that waited for the user's receive would time out (and abort the job)
    mpisync.torch.init_process_group(timeout=20)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _module(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def _state(module: torch.nn.Module) -> list:
    return [t.tolist() for t in module.state_dict().values()]


def test_a_receive_posted_before_ddp_is_matched_after_it(comm):
    """Rank 0 posts ``irecv`` from the last rank, then builds DDP; the last rank builds DDP, then
    sends: both build DDP (rank 0's state everywhere) and the receive gets the bytes."""
    need_ranks(comm, 2)
    last = comm.size - 1
    module = _module(comm.rank + 1)
    buf = torch.zeros(5)
    work = dist.irecv(buf, src=last) if comm.rank == 0 else None
    torch.nn.parallel.DistributedDataParallel(module)
    if comm.rank == last:
        dist.send(torch.arange(5.0), dst=0)
    if work is not None:
        work.wait()
        assert buf.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _state(module) == _state(_module(1))


def test_an_extra_buffer_on_one_rank_is_named_as_the_module_names_it(comm):
    need_ranks(comm, 2)
    module = _module(comm.rank + 1)
    if comm.rank == comm.size - 1:
        module.register_buffer("extra", torch.zeros(2))
    message = raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: torch.nn.parallel.DistributedDataParallel(module),
        "'extra' is not on root rank 0",
    )
    assert "'2'" not in message and "'0" not in message
    tensor = torch.ones(2)
    dist.all_reduce(tensor)  # the group goes on
    assert tensor.tolist() == [float(comm.size)] * 2


def test_a_buffer_of_another_shape_is_named(comm):
    need_ranks(comm, 2)
    module = _module(comm.rank + 1)
    if comm.rank == comm.size - 1:
        module[1].register_buffer("running_mean", torch.zeros(4))
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: torch.nn.parallel.DistributedDataParallel(module),
        "'1.running_mean' has shape (4,), root has (3,)",
    )
