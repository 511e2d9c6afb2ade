"""Valid calls that reach the backend in unusual forms, against gloo's bytes: ``all_to_all_single``
where a rank has no rows (a mixture-of-experts rank that routes no tokens), the gathers of
0-row tensors, and tensors with the negative or conjugate bit (``torch._neg_view``, ``conj()``)
on one rank only, whose values travel as gloo sends them (torch's dispatcher hands gloo a
resolved copy). Where gloo leaves such an output unwritten, mpisync writes the result (what
gloo computes for the same values in plain tensors). Valid at any number of ranks."""

import pytest

from mpiutil import need_ranks

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torchutil import rank_values, tensor_bytes  # noqa: E402

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.transports import policy  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def groups():
    """The mpisync default group (its CPU tensors on mpisync), and a gloo group of the same ranks
    (the reference). A short timeout: a rank that raised alone makes the others' wait end (the job
    aborts) instead of hanging."""
    mpisync.torch.init_process_group(backend="cpu:mpisync,cuda:gloo", timeout=20)
    yield dist.group.WORLD, dist.new_group(backend="gloo")
    dist.destroy_process_group()


@pytest.fixture(params=["peer to peer", "one Ialltoallv"])
def list_path(request, monkeypatch):
    """Each path of ``all_to_all_single`` with split sizes (forced on every rank alike)."""
    if request.param == "one Ialltoallv":
        monkeypatch.setattr(policy, "PAIRWISE_MAX_RANKS", 0)
    return request.param


def _routed(rank: int, size: int, idle: int) -> tuple:
    """``(input, input splits, output splits)`` of a token dispatch where rank ``idle`` routes no
    tokens (its input has 0 rows, its splits are zeros) and every other rank sends ``p + 1`` rows
    of 3 to rank ``p``."""

    def sends(r: int, p: int) -> int:
        return 0 if r == idle else p + 1

    in_splits = [sends(rank, p) for p in range(size)]
    out_splits = [sends(r, rank) for r in range(size)]
    rows = rank_values(rank, sum(in_splits) * 3, torch.float32).reshape(-1, 3)
    return rows, in_splits, out_splits


def _received(rank: int, size: int, make) -> torch.Tensor:
    """What ``rank`` receives where ``make(r)`` is rank ``r``'s ``(input, input splits, ...)``:
    each rank's rows for it, in rank order."""
    return torch.cat([make(r)[0].split(make(r)[1])[rank] for r in range(size)])


def _both(groups, data, in_splits, out_splits, width: int) -> list:
    """The bytes of ``all_to_all_single`` on mpisync's group and on gloo's."""
    results = []
    for group in groups:
        out = torch.full((sum(out_splits), width), -1.0, dtype=data.dtype)
        dist.all_to_all_single(out, data, out_splits, in_splits, group=group)
        results.append(tensor_bytes(out))
    return results


@pytest.mark.parametrize("idle", ["first", "last"])
def test_all_to_all_single_where_a_rank_routes_no_tokens(comm, groups, list_path, idle):
    need_ranks(comm, 2)
    size, rank = comm.size, comm.rank
    quiet = 0 if idle == "first" else size - 1
    data, in_splits, out_splits = _routed(rank, size, quiet)
    ours, gloos = _both(groups, data, in_splits, out_splits, 3)
    assert ours == gloos
    assert ours == tensor_bytes(_received(rank, size, lambda r: _routed(r, size, quiet)))


def _to_all_but_0(rank: int, size: int) -> tuple:
    """Every rank sends one row of 4 to each rank but 0; rank 0 receives no rows."""
    in_splits = [0] + [1] * (size - 1)
    out_splits = [0] * size if rank == 0 else [1] * size
    data = rank_values(rank, (size - 1) * 4, torch.float64).reshape(-1, 4)
    return data, in_splits, out_splits


def test_all_to_all_single_where_a_rank_receives_no_rows(comm, groups, list_path):
    need_ranks(comm, 2)
    size, rank = comm.size, comm.rank
    ours, gloos = _both(groups, *_to_all_but_0(rank, size), 4)
    assert ours == gloos
    assert ours == tensor_bytes(_received(rank, size, lambda r: _to_all_but_0(r, size)))


def test_gathers_and_all_to_all_single_of_no_rows_anywhere(comm, groups):
    size = comm.size
    shapes = []
    for group in groups:
        out = torch.empty(0, 3)
        dist.all_to_all_single(out, torch.empty(0, 3), [0] * size, [0] * size, group=group)
        dist.all_to_all_single(out, torch.empty(0, 3), group=group)
        outputs = [torch.empty(0, 3) for _ in range(size)]
        dist.all_gather(outputs, torch.empty(0, 3), group=group)
        whole = torch.empty(0, 3)
        dist.all_gather_into_tensor(whole, torch.empty(0, 3), group=group)
        shapes.append([list(out.shape), [list(o.shape) for o in outputs], list(whole.shape)])
    assert shapes[0] == shapes[1] == [[0, 3], [[0, 3]] * size, [0, 3]]


# -- tensors with the negative or conjugate bit -------------------------------------------------
def _neg(values: torch.Tensor) -> torch.Tensor:
    """A tensor that reads as ``values``, through the negative bit (its memory holds -values)."""
    return torch._neg_view(-values)


def _conj(values: torch.Tensor) -> torch.Tensor:
    """A tensor that reads as ``values``, through the conjugate bit."""
    return values.conj_physical().conj()


def _values(rank: int, n: int, dtype=torch.float64) -> torch.Tensor:
    real = rank_values(rank, n, torch.float64, exact=True)
    if dtype.is_complex:
        return torch.complex(real, real.flip(0) + 1).to(dtype)
    return real.to(dtype)


# Each case: call(group, mark, rank, size) -> the tensors it leaves (outputs, and the inputs as
# they read afterwards). ``mark(t)`` makes ``t`` a marked view of its values on the marked rank,
# and returns it unchanged elsewhere. Calls torch's front end where it passes such tensors on
# (it refuses an unresolved conjugate itself, on the calling rank, where it views complex tensors
# as real), else the group's own method.
def _all_reduce(g, mark, rank, size):
    t = mark(_values(rank, 5))
    dist.all_reduce(t, group=g)
    return [t]


def _all_reduce_complex(g, mark, rank, size):
    t = mark(_values(rank, 5, torch.complex128))
    g.allreduce([t]).wait()
    return [t]


def _reduce_complex(g, mark, rank, size):
    t = mark(_values(rank, 5, torch.complex128))
    dist.reduce(t, dst=0, group=g)
    return [t] if rank == 0 else []


def _broadcast(g, mark, rank, size):
    t = mark(_values(rank, 5))
    dist.broadcast(t, src=0, group=g)
    return [t]


def _broadcast_complex(g, mark, rank, size):
    t = mark(_values(rank, 5, torch.complex64))
    opts = dist.BroadcastOptions()
    opts.rootRank = size - 1
    g.broadcast([t], opts).wait()
    return [t]


def _all_gather(g, mark, rank, size):
    outputs = [mark(torch.zeros(3, dtype=torch.float64)) for _ in range(size)]
    dist.all_gather(outputs, mark(_values(rank, 3)), group=g)
    return outputs


def _all_gather_into_tensor(g, mark, rank, size):
    out = mark(torch.zeros(3 * size, dtype=torch.float64))
    dist.all_gather_into_tensor(out, mark(_values(rank, 3)), group=g)
    return [out]


def _reduce_scatter_tensor(g, mark, rank, size):
    out = mark(torch.zeros(2, dtype=torch.float64))
    dist.reduce_scatter_tensor(out, mark(_values(rank, 2 * size)), group=g)
    return [out]


def _reduce_scatter_tensor_complex(g, mark, rank, size):
    out = mark(torch.zeros(2, dtype=torch.complex128))
    dist.reduce_scatter_tensor(out, mark(_values(rank, 2 * size, torch.complex128)), group=g)
    return [out]


def _reduce_scatter(g, mark, rank, size):
    out = mark(torch.zeros(2, dtype=torch.float64))
    pieces = [mark(p) for p in _values(rank, 2 * size).chunk(size)]
    dist.reduce_scatter(out, pieces, group=g)
    return [out]


def _all_to_all_single(g, mark, rank, size):
    out = mark(torch.zeros(2 * size, dtype=torch.float64))
    dist.all_to_all_single(out, mark(_values(rank, 2 * size)), group=g)
    return [out]


def _all_to_all(g, mark, rank, size):
    outputs = [mark(torch.zeros(2, dtype=torch.float64)) for _ in range(size)]
    inputs = [mark(p.clone()) for p in _values(rank, 2 * size).chunk(size)]
    dist.all_to_all(outputs, inputs, group=g)
    return outputs


def _gather(g, mark, rank, size):
    outputs = [mark(torch.zeros(2, dtype=torch.float64)) for _ in range(size)]
    dist.gather(mark(_values(rank, 2)), outputs if rank == 0 else None, 0, g)
    return outputs if rank == 0 else []


def _scatter(g, mark, rank, size):
    out = mark(torch.zeros(2, dtype=torch.float64))
    pieces = [mark(_values(r, 2)) for r in range(size)] if rank == 0 else None
    dist.scatter(out, pieces, src=0, group=g)
    return [out]


def _send_and_recv(g, mark, rank, size):
    """Each rank sends to the next and receives from the one before."""
    received = mark(torch.zeros(4, dtype=torch.float64))
    works = [
        dist.isend(mark(_values(rank, 4)), (rank + 1) % size, group=g),
        dist.irecv(received, (rank - 1) % size, group=g),
    ]
    for work in works:
        work.wait()
    return [received]


_CASES = {
    "all_reduce": (_all_reduce, "neg"),
    "all_reduce complex": (_all_reduce_complex, "conj"),
    "reduce complex": (_reduce_complex, "conj"),
    "broadcast": (_broadcast, "neg"),
    "broadcast complex": (_broadcast_complex, "conj"),
    "all_gather": (_all_gather, "neg"),
    "all_gather_into_tensor": (_all_gather_into_tensor, "neg"),
    "reduce_scatter_tensor": (_reduce_scatter_tensor, "neg"),
    "reduce_scatter_tensor complex": (_reduce_scatter_tensor_complex, "conj"),
    "reduce_scatter": (_reduce_scatter, "neg"),
    "all_to_all_single": (_all_to_all_single, "neg"),
    "all_to_all": (_all_to_all, "neg"),
    "gather": (_gather, "neg"),
    "scatter": (_scatter, "neg"),
    "send and recv": (_send_and_recv, "neg"),
}


# What gloo (the reference) must have for a case, where some torch's gloo has not.
_GLOO_NEEDS = {
    "all_reduce complex": "complex all_reduce",
    "reduce complex": "complex reduce",
    "broadcast complex": "complex broadcast",
    "reduce_scatter_tensor complex": "complex reduce_scatter_tensor",
    "reduce_scatter": "reduce_scatter",
    "all_to_all": "alltoall",
}


def _marker(bit: str, marked: bool):
    if not marked:
        return lambda t: t
    return _neg if bit == "neg" else _conj


@pytest.mark.parametrize("case", list(_CASES))
def test_views_with_the_negative_or_conjugate_bit_on_one_rank(comm, groups, case, need_gloo):
    """The last rank passes marked views (inputs and outputs): every rank ends with the bytes
    gloo gives the same values in plain tensors, and the marked outputs read as those values."""
    need_ranks(comm, 2)
    if case in _GLOO_NEEDS:
        need_gloo(_GLOO_NEEDS[case])
    call, bit = _CASES[case]
    size, rank = comm.size, comm.rank
    marked = rank == size - 1
    ours = call(groups[0], _marker(bit, marked), rank, size)
    assert all(t.is_neg() or t.is_conj() for t in ours) or not marked
    theirs = call(groups[1], _marker(bit, False), rank, size)
    assert [tensor_bytes(t.resolve_conj().resolve_neg()) for t in ours] == [
        tensor_bytes(t) for t in theirs
    ]


def _marked_inputs(g, mark, rank, size) -> list:
    """Operations whose inputs only are marked: what each leaves in its (plain) outputs."""
    outputs = [torch.zeros(3, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(outputs, mark(_values(rank, 3)), group=g)
    exchanged = torch.zeros(2 * size, dtype=torch.float64)
    dist.all_to_all_single(exchanged, mark(_values(rank, 2 * size)), group=g)
    reduced = torch.zeros(2, dtype=torch.float64)
    dist.reduce_scatter(reduced, [mark(p) for p in _values(rank, 2 * size).chunk(size)], group=g)
    received = torch.zeros(4, dtype=torch.float64)
    works = [
        dist.isend(mark(_values(rank, 4)), (rank + 1) % size, group=g),
        dist.irecv(received, (rank - 1) % size, group=g),
    ]
    for work in works:
        work.wait()
    return [tensor_bytes(t) for t in [*outputs, exchanged, reduced, received]]


def test_marked_inputs_travel_as_gloo_sends_them(comm, groups, need_gloo):
    """gloo given the very same marked tensors (it receives resolved copies) and mpisync: the
    same bytes on every rank."""
    need_ranks(comm, 2)
    need_gloo("reduce_scatter")
    size, rank = comm.size, comm.rank
    mark = _neg if rank == size - 1 else (lambda t: t)
    assert _marked_inputs(groups[0], mark, rank, size) == _marked_inputs(
        groups[1], mark, rank, size
    )
