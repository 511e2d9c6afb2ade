"""DDP's one-time sync of a module's parameters and buffers on an mpisync group
(:mod:`mpisync.torch.module_states`): every rank ends with the root's bytes of every parameter and
buffer, by ``sync_params`` where it takes the tensors and by torch's own where not, on subgroups
and from any root; ``MPISYNC_TORCH_SYNC_PARAMS=0`` keeps torch's. Valid at any number of ranks."""

import hashlib

import pytest
from mpi4py import MPI

from mpiutil import need_ranks

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.torch import module_states  # noqa: E402

_BIG = 250 * 1024 * 1024  # DDP's bucket size for its start-up sync


@pytest.fixture(scope="module", autouse=True)
def process_group():
    mpisync.torch.init_process_group(timeout=120)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def routes(monkeypatch) -> list:
    """Which way each module-state sync of the test went, in order: ``"mpisync"`` or ``"torch"``."""
    taken: list = []
    ours, torchs = module_states.sync_params, module_states._torch_sync

    def by_mpisync(*args, **kwargs):
        taken.append("mpisync")
        return ours(*args, **kwargs)

    def by_torch(*args):
        taken.append("torch")
        return torchs(*args)

    monkeypatch.setattr(module_states, "sync_params", by_mpisync)
    monkeypatch.setattr(module_states, "_torch_sync", by_torch)
    return taken


def _module(seed: int, channels_last: bool = False) -> torch.nn.Module:
    """A convolution with BatchNorm (float and int64 buffers) and a bfloat16 linear layer, every
    value ``seed``'s."""
    torch.manual_seed(seed)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5).to(torch.bfloat16),
    )
    with torch.no_grad():
        module[1].running_mean.uniform_()
        module[1].running_var.uniform_()
        module[1].num_batches_tracked.fill_(seed)
        module[1].weight.uniform_()
    if channels_last:
        module[0].to(memory_format=torch.channels_last)
    return module


def _digest(module: torch.nn.Module) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _check_became(comm, module, root: int, before: str) -> None:
    """``module`` holds, on every rank of ``comm``, what ``root``'s held (``before``, this rank's
    digest before the sync), and the ranks' states differed before it."""
    befores = comm.allgather(before)
    assert len(set(befores)) == comm.size
    assert comm.allgather(_digest(module)) == [befores[root]] * comm.size


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_ddp_start_up_gives_every_rank_rank_0s_state(comm, routes, channels_last):
    """By ``sync_params``; a channels-last convolution (not contiguous) by torch's own."""
    module = _module(comm.rank + 1, channels_last)
    before = _digest(module)
    torch.nn.parallel.DistributedDataParallel(module)
    _check_became(comm, module, 0, before)
    assert routes == ["torch" if channels_last else "mpisync"]
    if channels_last:
        assert not module[0].weight.is_contiguous()


def test_a_layout_on_one_rank_only_takes_torchs_way_on_every_rank(comm, routes):
    """The last rank's convolution is channels-last, the others' contiguous (DDP refuses strides
    that differ by rank before it syncs; torch's module-state sync itself takes them): the ranks
    agree on torch's own, every rank, and end with rank 0's bytes."""
    need_ranks(comm, 2)
    module = _module(comm.rank + 1, channels_last=comm.rank == comm.size - 1)
    before = _digest(module)
    torch.distributed.utils._sync_module_states(
        module, dist.group.WORLD, _BIG, src=0, params_and_buffers_to_ignore=set()
    )
    _check_became(comm, module, 0, before)
    assert routes == ["torch"]


def test_a_subgroup_syncs_from_its_last_rank(comm, routes):
    """DDP's join syncs from the last joiner: ``src`` is a rank of the group, not of the world."""
    members = list(range(1, comm.size)) or [0]
    group = dist.new_group(ranks=members, backend="mpisync")
    if comm.rank in members:
        sub = comm.Split(0, comm.rank)
        module = _module(comm.rank + 1)
        before = _digest(module)
        torch.distributed.utils._sync_module_states(
            module, group, _BIG, src=len(members) - 1, params_and_buffers_to_ignore=set()
        )
        _check_became(sub, module, len(members) - 1, before)
        assert routes == ["mpisync"]
        sub.Free()
        dist.destroy_process_group(group)
    else:
        comm.Split(MPI.UNDEFINED, comm.rank)


def test_tensors_that_share_memory_go_through_torchs_own(comm, routes):
    """A buffer that is a view of a parameter (tied state): torch's joined buckets."""
    module = _module(comm.rank + 1)
    module.register_buffer("tied", module[0].weight.detach()[0])
    before = _digest(module)
    torch.nn.parallel.DistributedDataParallel(module)
    _check_became(comm, module, 0, before)
    assert routes == ["torch"]


def test_the_switch_off_keeps_torchs_sync(comm, routes, monkeypatch):
    monkeypatch.setenv("MPISYNC_TORCH_SYNC_PARAMS", "0")
    group = dist.new_group(backend="mpisync")
    monkeypatch.delenv("MPISYNC_TORCH_SYNC_PARAMS")
    module = _module(comm.rank + 1)
    before = _digest(module)
    torch.nn.parallel.DistributedDataParallel(module, process_group=group)
    _check_became(comm, module, 0, before)
    assert routes == ["torch"]
    dist.destroy_process_group(group)


def test_after_operations_in_flight(comm, routes):
    """Operations issued before the sync, not yet waited for, complete first (the sync waits for
    the group's engine) and keep their bytes."""
    tensors = [torch.full((1000,), float(comm.rank + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    module = _module(comm.rank + 1)
    before = _digest(module)
    torch.nn.parallel.DistributedDataParallel(module)
    _check_became(comm, module, 0, before)
    for work in works:
        work.wait()
    for i, t in enumerate(tensors):
        assert t.tolist() == [float(sum(r + i for r in range(comm.size)))] * 1000
    assert routes == ["mpisync"]
