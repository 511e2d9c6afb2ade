"""``torch.compile`` with the mpisync backend: a compiled DDP module (whose reducer calls the
group's collectives from inside the compiled forward), a DDP of a compiled module, and the
functional collectives inside compiled code, each step for step bit-equal to the same program on
a gloo group of the same ranks. Dynamo's ``eager`` backend: what is traced is the same, without
a C++ toolchain's compile time."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torchutil import tensor_bytes  # noqa: E402

import mpisync.torch  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", autouse=True)
def groups():
    """The mpisync default group and a gloo group of the same ranks (the reference)."""
    # a TCP store, on which the gloo group can rendezvous (CPU tensors go to mpisync)
    mpisync.torch.init_process_group(backend="cpu:mpisync,cuda:gloo", timeout=120)
    yield dist.group.WORLD, dist.new_group(backend="gloo")
    dist.destroy_process_group()


def _train(rank: int, group, how: str) -> tuple:
    """Five SGD steps of a small MLP on each rank's own data; the losses and final parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if how == "compile(DDP)":
        net = torch.compile(DDP(model, process_group=group), backend="eager")
    else:
        net = DDP(torch.compile(model, backend="eager"), process_group=group)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(5):
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    torch._dynamo.reset()
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("how", ["compile(DDP)", "DDP(compile)"])
def test_a_compiled_ddp_trains_as_on_gloo(comm, groups, how):
    """Bit-equal to gloo at two ranks; beyond, gloo sums the gradients in another order: the
    same to rounding, and every rank holding the same parameters."""
    if comm.size == 1:
        pytest.skip("DDP of one rank never calls the group")
    ours, gloo = groups
    (our_losses, our_params), (gloo_losses, gloo_params) = (
        _train(comm.rank, group, how) for group in (ours, gloo)
    )
    if comm.size == 2:
        assert our_losses == gloo_losses
        assert tensor_bytes(our_params) == tensor_bytes(gloo_params)
    else:
        assert torch.allclose(our_params, gloo_params, rtol=1e-5, atol=1e-6)
        assert len(set(comm.allgather(tensor_bytes(our_params)))) == 1


def test_functional_collectives_inside_compiled_code_hold_gloos_bytes(comm, groups):
    import torch.distributed._functional_collectives as funcol

    def step(t, group):
        return funcol.all_reduce(t * 2, "sum", group) + 1

    data = torch.arange(12, dtype=torch.float32) + comm.rank
    results = [torch.compile(step, backend="eager")(data, group) for group in groups]
    torch._dynamo.reset()
    assert tensor_bytes(results[0]) == tensor_bytes(results[1])
    expected = (torch.arange(12, dtype=torch.float32) * comm.size + sum(range(comm.size))) * 2 + 1
    assert tensor_bytes(results[0]) == tensor_bytes(expected)
