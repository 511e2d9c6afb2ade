"""The backend's all_reduce (and reduce) of large tensors by cross-memory reads on one node: the
reference's bytes on every rank, every op, the reads taken where every two ranks reach each other,
and a failed read on one rank redone through MPI on every rank."""

import numpy as np
import pytest

from mpiutil import everyone

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.allreduce import crossreduce  # noqa: E402
from mpisync.torch.reductions import CROSS_BYTES  # noqa: E402
from mpisync.transports import cma  # noqa: E402

R = dist.ReduceOp
_COUNT = CROSS_BYTES // 4 + 5  # 4-byte values: just over the floor, an odd count


@pytest.fixture(scope="module", autouse=True)
def process_group():
    mpisync.torch.init_process_group(timeout=60)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _reachable(comm) -> bool:
    hosts = comm.allgather(cma.host_word())
    return comm.size > 1 and everyone(comm, cma.enabled()) and len(set(hosts)) == 1


def _values(rank: int, dtype, seed: int = 0) -> torch.Tensor:
    # small whole numbers: every order of combining them gives the same bits
    rng = np.random.default_rng(seed * 7919 + rank)
    return torch.from_numpy(rng.integers(1, 4, _COUNT)).to(dtype)


def _reference(comm, dtype, op: str, seed: int = 0) -> torch.Tensor:
    stack = torch.stack([_values(r, dtype, seed) for r in range(comm.size)])
    if op == "sum":
        return stack.sum(0).to(dtype)
    if op == "prod":
        return stack.prod(0).to(dtype)
    if op == "max":
        return stack.max(0).values
    if op == "min":
        return stack.min(0).values
    if op == "avg":
        total = stack.sum(0).to(dtype)
        return total / comm.size if dtype.is_floating_point else total // comm.size
    out = stack[0].clone()
    for row in stack[1:]:
        out = {"band": out & row, "bor": out | row, "bxor": out ^ row}[op]
    return out


@pytest.fixture
def combines(monkeypatch):
    """How many times this rank combined its slices by cross-memory reads."""
    calls = []
    real = crossreduce.CrossProgram.combine

    def counted(self, combine):
        calls.append(1)
        return real(self, combine)

    monkeypatch.setattr(crossreduce.CrossProgram, "combine", counted)
    return calls


_CASES = [
    ("sum", torch.float32),
    ("sum", torch.int64),
    ("prod", torch.float64),
    ("max", torch.float32),
    ("min", torch.int32),
    ("avg", torch.float32),
    ("avg", torch.int32),
    ("band", torch.int32),
    ("bor", torch.int64),
    ("bxor", torch.int32),
]


@pytest.mark.parametrize("op, dtype", _CASES)
def test_all_reduce_of_a_large_tensor_gives_the_reference_bytes(comm, combines, op, dtype):
    tensor = _values(comm.rank, dtype, seed=3)
    dist.all_reduce(tensor, op=getattr(R, {"prod": "PRODUCT"}.get(op, op.upper())))
    assert tensor.numpy().tobytes() == _reference(comm, dtype, op, seed=3).numpy().tobytes()
    assert len(combines) == (1 if _reachable(comm) else 0)


def test_coalesced_tensors_and_reduce_take_the_reads_too(comm, combines):
    first, second = _values(comm.rank, torch.float32, 1), _values(comm.rank, torch.float32, 2)
    dist.all_reduce_coalesced([first, second])
    assert torch.equal(first, _reference(comm, torch.float32, "sum", 1))
    assert torch.equal(second, _reference(comm, torch.float32, "sum", 2))
    tensor = _values(comm.rank, torch.float32, 4)
    dist.reduce(tensor, dst=comm.size - 1)
    if comm.rank == comm.size - 1:
        assert torch.equal(tensor, _reference(comm, torch.float32, "sum", 4))
    assert len(combines) == (2 if _reachable(comm) else 0)


def test_a_small_tensor_stays_on_mpi(comm, combines):
    tensor = torch.full((1000,), float(comm.rank))
    dist.all_reduce(tensor)
    assert tensor.tolist() == [float(sum(range(comm.size)))] * 1000
    assert combines == []


@pytest.mark.parametrize("phase", ["combine", "gather"])
def test_a_failed_read_on_the_last_rank_is_redone_through_mpi(comm, monkeypatch, phase):
    if not _reachable(comm):
        pytest.skip("needs cross-memory reads between every two ranks of one node")
    real = getattr(crossreduce.CrossProgram, phase)

    def fails_on_the_last_rank(self, *args):
        return real(self, *args) and comm.rank != comm.size - 1

    monkeypatch.setattr(crossreduce.CrossProgram, phase, fails_on_the_last_rank)
    for seed in range(2):
        tensor = _values(comm.rank, torch.float32, seed)
        dist.all_reduce(tensor)
        assert torch.equal(tensor, _reference(comm, torch.float32, "sum", seed)), (phase, seed)
