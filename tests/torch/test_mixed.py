"""Mixed backend strings ("cpu:mpisync,cuda:gloo", "cpu:gloo,cuda:mpisync"): the mpisync group
creates the other pairs' backends and hands each operation to its tensors' device's backend.
Without a GPU, gloo stands in for the other backend on CPU tensors."""

import pytest

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.errors import InvalidParamError  # noqa: E402
from mpisync.torch.errors import ArgumentError  # noqa: E402
from mpisync.torch.process_group import ProcessGroupMPISync  # noqa: E402
from mpisync.torch.work import Work  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def process_group():
    mpisync.torch.init_process_group(backend="cpu:mpisync,cuda:gloo", timeout=60)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_the_default_group_holds_both_backends(comm):
    group = dist.group.WORLD
    assert isinstance(group, ProcessGroupMPISync)
    assert dist.get_backend(group) == "cpu:mpisync,cuda:gloo"
    assert [device.type for device in group._device_types] == ["cpu", "cuda"]
    assert group._get_backend(torch.device("cpu")) is group
    assert isinstance(group._get_backend(torch.device("cuda")), dist.ProcessGroupGloo)
    tensor = torch.full((5,), float(comm.rank + 1))
    work = group.allreduce([tensor])
    assert isinstance(work, Work)  # CPU tensors: mpisync's own work
    work.wait()
    assert tensor.tolist() == [comm.size * (comm.size + 1) / 2] * 5


def _cpu_on_gloo():
    return dist.new_group(backend="cpu:gloo,cuda:mpisync")


def test_cpu_tensors_go_to_the_backend_the_string_names_for_cpu(comm):
    group = _cpu_on_gloo()
    assert isinstance(group, ProcessGroupMPISync)
    assert isinstance(group._get_backend(torch.device("cpu")), dist.ProcessGroupGloo)
    tensor = torch.full((7,), float(comm.rank))
    work = group.allreduce([tensor])
    assert not isinstance(work, Work)  # gloo's work: the operation went to gloo
    work.wait()
    assert tensor.tolist() == [float(sum(range(comm.size)))] * 7
    out = torch.empty(3 * comm.size)
    dist.all_gather_into_tensor(out, torch.arange(3.0) + 10 * comm.rank, group=group)
    assert out.tolist() == [10.0 * r + i for r in range(comm.size) for i in range(3)]
    block = torch.empty(2)
    dist.reduce_scatter_tensor(block, torch.arange(2.0 * comm.size), group=group)
    assert block.tolist() == [comm.size * (2.0 * comm.rank + i) for i in range(2)]
    dist.destroy_process_group(group)


def test_coalesced_forms_go_to_the_other_backend_as_one_work(comm):
    group = _cpu_on_gloo()
    outputs = [torch.empty(2 * comm.size), torch.empty(comm.size)]
    inputs = [torch.full((2,), float(comm.rank)), torch.full((1,), 5.0 + comm.rank)]
    group.allgather_into_tensor_coalesced(outputs, inputs).wait()
    assert outputs[0].tolist() == [float(r) for r in range(comm.size) for _ in range(2)]
    assert outputs[1].tolist() == [5.0 + r for r in range(comm.size)]
    results = [torch.empty(1), torch.empty(2)]
    sources = [torch.ones(comm.size), torch.full((2 * comm.size,), 2.0)]
    group.reduce_scatter_tensor_coalesced(results, sources, dist.ReduceScatterOptions()).wait()
    assert results[0].tolist() == [float(comm.size)]
    assert results[1].tolist() == [2.0 * comm.size] * 2
    dist.destroy_process_group(group)


def test_a_backend_string_without_mpisync_is_refused_before_anything():
    with pytest.raises(InvalidParamError, match="names no mpisync part"):
        mpisync.torch.init_process_group(backend="cpu:gloo")


def test_a_pair_no_rank_can_create_is_the_same_error_everywhere(comm):
    if dist.is_nccl_available():
        pytest.skip("this torch has NCCL: the pair could be created")
    with pytest.raises(ArgumentError, match=r"cannot create the backend string's other pairs"):
        dist.new_group(backend="cpu:mpisync,cuda:nccl")
    tensor = torch.ones(3)
    dist.all_reduce(tensor)  # the default group goes on
    assert tensor.tolist() == [float(comm.size)] * 3
