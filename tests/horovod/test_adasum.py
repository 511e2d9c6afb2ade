"""Adasum (``op=hvd.Adasum``) against a NumPy reference of Horovod's algorithm: the all-reduce
forms, grouped and fused tensors of several dtypes and sizes, zero tensors, the autograd forms,
the Adasum optimizer, and what Horovod refuses."""

import sys

import numpy as np
import pytest

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

from mpisync.horovod.adasum_optimizer import adasum_distributed_optimizer  # noqa: E402

pytestmark = pytest.mark.mpi

_SQRT_DBL_MIN = sys.float_info.min**0.5
# float32 and float64 combine in float64 as Horovod does: only the order of the float64 sums of
# the dot products may differ; float16 rounds each level to float16
_TOL = {np.float16: (4e-3, 1e-3), np.float32: (1e-6, 1e-7), np.float64: (1e-13, 1e-15)}
_SHAPES = [(7,), (33, 5), (1,), (0,), (4, 4, 3), ()]


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


needs_power_of_two = pytest.mark.skipif(
    not _power_of_two(int(__import__("mpi4py.MPI").MPI.COMM_WORLD.size)),
    reason="Horovod's Adasum runs on a power-of-two number of ranks only",
)


def _combine(a, b):
    """Horovod's pairwise Adasum of ``a`` and ``b`` (one tensor each), in its arithmetic."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, a_norm, b_norm = float(x @ y), float(x @ x), float(y @ y)
    a_coeff = 1.0 - dot / a_norm * 0.5 if a_norm >= _SQRT_DBL_MIN else 1.0
    b_coeff = 1.0 - dot / b_norm * 0.5 if b_norm >= _SQRT_DBL_MIN else 1.0
    if a.dtype == np.float16:
        head = np.float32(a_coeff) * a.astype(np.float32)
        fused = head.astype(np.float64) + float(np.float32(b_coeff)) * b.astype(np.float64)
        return fused.astype(np.float32).astype(np.float16)
    return (a_coeff * a.astype(np.float64) + b_coeff * b.astype(np.float64)).astype(a.dtype)


def reference(arrays):
    """The Adasum of one tensor over ranks (``arrays[r]``: rank r's): at level 1, 2, 4...
    each rank's value combined with that of ``rank ^ level``."""
    values, level = list(arrays), 1
    while level < len(values):
        for r in range(len(values)):
            if not r & level:
                values[r] = values[r ^ level] = _combine(values[r], values[r ^ level])
        level <<= 1
    return values[0]


def _inputs(rank: int, dtype, shapes=_SHAPES, scale: float = 1.0):
    """Rank ``rank``'s tensors: seeded by rank, so every rank can make every rank's."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(s, generator=g, dtype=torch.float64) * scale).to(dtype) for s in shapes]


def _assert_close(got, want):
    rtol, atol = _TOL[want.dtype.type]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol), (
        np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0)
    )


def _same_on_every_rank(comm, tensors):
    blobs = comm.allgather(b"".join(t.numpy().tobytes() for t in tensors))
    assert len(set(blobs)) == 1


@needs_power_of_two
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_allreduce_matches_horovods_algorithm(started, dtype):
    comm = started
    everyone = [_inputs(r, dtype) for r in range(comm.size)]
    mine = everyone[comm.rank]
    results = [hvd.allreduce(t, op=hvd.Adasum, name=f"t{i}") for i, t in enumerate(mine)]
    for i, result in enumerate(results):
        want = reference([inputs[i].numpy() for inputs in everyone])
        if comm.size == 1:
            assert torch.equal(result, mine[i])  # exact: nothing to combine
        _assert_close(result.numpy(), want)
    _same_on_every_rank(comm, results)
    assert all(torch.equal(a, b) for a, b in zip(mine, _inputs(comm.rank, dtype)))  # unmodified


@needs_power_of_two
def test_grouped_fused_mixed_dtypes_and_scale_factors(started):
    """One group of float32, float64 and float16 tensors (each dtype fused into one buffer),
    with Horovod's prescale and postscale; the in-place and async forms give the same."""
    comm = started
    dtypes = [torch.float32, torch.float64, torch.float16, torch.float32, torch.float16]
    everyone = []
    for r in range(comm.size):
        g = torch.Generator().manual_seed(7 + r)
        everyone.append([torch.randn(5 + 3 * i, generator=g).to(d) for i, d in enumerate(dtypes)])
    mine = everyone[comm.rank]
    out = hvd.grouped_allreduce(mine, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    for i, result in enumerate(out):
        inputs = [hvd.kernels.scaled(ts[i], 0.5).numpy() for ts in everyone]
        want = hvd.kernels.scaled(torch.from_numpy(reference(inputs)), 3.0).numpy()
        _assert_close(result.numpy(), want)
    copies = [t.clone() for t in mine]
    returned = hvd.grouped_allreduce_(
        copies, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0
    )
    assert all(a is b for a, b in zip(returned, copies))
    handle = hvd.grouped_allreduce_async(
        mine, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0
    )
    again = hvd.synchronize(handle)
    for a, b, c in zip(out, copies, again):
        assert torch.equal(a, b) and torch.equal(a, c)
    _same_on_every_rank(comm, out)


@needs_power_of_two
def test_async_and_in_place_single_tensor(started):
    comm = started
    everyone = [_inputs(r, torch.float32, [(1000,)])[0] for r in range(comm.size)]
    want = reference([t.numpy() for t in everyone])
    got = hvd.synchronize(hvd.allreduce_async(everyone[comm.rank], op=hvd.Adasum))
    _assert_close(got.numpy(), want)
    x = everyone[comm.rank].clone()
    assert hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Adasum)) is x
    assert torch.equal(x, got)
    y = everyone[comm.rank].clone()
    assert hvd.allreduce_(y, op=hvd.Adasum) is y and torch.equal(y, got)


@needs_power_of_two
def test_messages_in_chunks(started, monkeypatch):
    """Messages over Horovod's chunk size travel in pieces (the size lowered on every rank
    alike): the same bytes as in one message."""
    comm = started
    everyone = [_inputs(r, torch.float32, [(301,), (2,), (0,)]) for r in range(comm.size)]
    whole = hvd.grouped_allreduce(everyone[comm.rank], op=hvd.Adasum)
    monkeypatch.setattr(hvd.adasum, "_CHUNK_BYTES", 64)
    pieces = hvd.grouped_allreduce(everyone[comm.rank], op=hvd.Adasum)
    assert all(torch.equal(a, b) for a, b in zip(whole, pieces))
    for i, result in enumerate(pieces):
        _assert_close(result.numpy(), reference([ts[i].numpy() for ts in everyone]))


@needs_power_of_two
def test_zero_tensors(started):
    """A zero norm keeps its coefficient at 1 (Horovod's ``sqrt(DBL_MIN)`` rule): zeros on
    rank 0 only give the others' Adasum; zeros everywhere stay zeros."""
    comm = started
    everyone = [torch.zeros(9) if r == 0 else torch.arange(9.0) * (r + 1) for r in range(comm.size)]
    got = hvd.allreduce(everyone[comm.rank], op=hvd.Adasum)
    want = reference([t.numpy() for t in everyone])
    _assert_close(got.numpy(), want)
    if comm.size == 2:  # Adasum(0, b) is b itself, exactly
        assert torch.equal(got, everyone[1])
    zeros = hvd.allreduce(torch.zeros(3, 2, dtype=torch.float64), op=hvd.Adasum)
    assert torch.equal(zeros, torch.zeros(3, 2, dtype=torch.float64))


@needs_power_of_two
def test_identical_and_orthogonal_vectors(started):
    """Adasum's two defining cases: equal vectors give the vector (coefficients 1/2), orthogonal
    ones their sum (coefficients 1)."""
    comm = started
    same = hvd.allreduce(torch.tensor([3.0, -4.0, 12.0]), op=hvd.Adasum)
    assert same.tolist() == [3.0, -4.0, 12.0]
    basis = torch.zeros(comm.size, dtype=torch.float64)
    basis[comm.rank] = 2.0 + comm.rank
    orthogonal = hvd.allreduce(basis, op=hvd.Adasum)
    assert orthogonal.tolist() == [2.0 + r for r in range(comm.size)]


@needs_power_of_two
def test_autograd_forms(started):
    """The gradient is the Adasum of the gradients, as in Horovod (equal ones: itself)."""
    comm = started
    x = torch.arange(4.0, requires_grad=True)
    y = hvd.allreduce(x * (comm.rank + 1), op=hvd.Adasum)
    (y * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert x.grad.tolist() == [1.0 * (comm.rank + 1) * k for k in (1, 2, 3, 4)]
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(2, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Adasum, compression=hvd.Compression.none)
    (ya.sum() + 2 * yb.sum()).backward()
    assert a.grad.tolist() == [1.0] * 3 and b.grad.tolist() == [2.0] * 2
    wanted = reference([np.arange(4, dtype=np.float32) * (r + 1) for r in range(comm.size)])
    _assert_close(y.detach().numpy(), wanted)


def test_refusals(started):
    """As Horovod: integer tensors fail at synchronize on every rank ("Unsupported data type"),
    bfloat16 ones at the call (ValueError); a size not a power of two at the call; Adasum is
    not a reducescatter op."""
    comm = started
    if not _power_of_two(comm.size):
        with pytest.raises(NotImplementedError, match="non-power of 2 ranks"):
            hvd.allreduce(torch.ones(2), op=hvd.Adasum)
        with pytest.raises(NotImplementedError, match="non-power of 2 ranks"):
            hvd.grouped_allreduce_async([torch.ones(2)], op=hvd.Adasum)
        return
    for dtype in (torch.int32, torch.int64, torch.uint8):
        with pytest.raises(hvd.HorovodInternalError, match="Unsupported data type"):
            hvd.allreduce(torch.ones(2, dtype=dtype), op=hvd.Adasum)
    with pytest.raises(ValueError, match="BFloat16Tensor is not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.bfloat16), op=hvd.Adasum)
    assert hvd.allreduce(torch.ones(2), op=hvd.Adasum).tolist() == [1.0, 1.0]  # still usable
    with pytest.raises(hvd.HorovodArgumentError, match="supports only Average and Sum"):
        hvd.reducescatter(torch.ones(comm.size, 2), op=hvd.Adasum)


def test_refused_on_a_process_set(started):
    """Horovod refuses Adasum on any set but the global one, at the call, the optimizer too."""
    comm = started
    if comm.size == 1:
        pytest.skip("needs a set other than the global one (two ranks)")
    first = hvd.add_process_set([0])
    try:
        if comm.rank == 0:
            with pytest.raises(NotImplementedError, match="non-global process sets"):
                hvd.allreduce(torch.ones(1), op=hvd.Adasum, process_set=first)
        sgd = torch.optim.SGD(_Net().parameters(), lr=0.1)
        with pytest.raises(NotImplementedError, match="non-global process sets"):
            adasum_distributed_optimizer(sgd, None, hvd.Compression.none, 1, first)
    finally:
        hvd.remove_process_set(first)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(6, 5)
        self.b = torch.nn.Linear(5, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _batch(rank: int, step: int, k: int = 0):
    g = torch.Generator().manual_seed(100 * rank + 10 * step + k)
    return torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)


def _reference_training(size: int, steps: int, passes: int, fp16: bool):
    """Every rank's local step simulated here: each rank's optimizer (its own momentum) steps
    from the common parameters; the changes are combined by :func:`reference`."""
    nets = [_Net() for _ in range(size)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.1, momentum=0.9) for n in nets]
    for step in range(steps):
        start = [p.detach().clone() for p in nets[0].parameters()]
        deltas = []
        for r, (net, opt) in enumerate(zip(nets, opts)):
            opt.zero_grad()
            for k in range(passes):
                x, y = _batch(r, step, k)
                torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            delta = [(p.detach() - s) for p, s in zip(net.parameters(), start)]
            deltas.append([d.half() if fp16 else d for d in delta])
        for i, s in enumerate(start):
            combined = torch.from_numpy(reference([d[i].numpy() for d in deltas])).float()
            for net in nets:
                list(net.parameters())[i].data.copy_(s + combined)
    return [p.detach() for p in nets[0].parameters()]


def _train(opt, net, rank: int, steps: int, passes: int):
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = _batch(rank, step, k)
            torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def _check_training(comm, params, passes, fp16):
    want = _reference_training(comm.size, 3, passes, fp16)
    for got, ref in zip(params, want):
        if comm.size == 1 and not fp16:
            assert torch.equal(got, ref)
        tol = 1e-3 if fp16 else 1e-6
        assert torch.allclose(got, ref, rtol=tol, atol=tol), (got - ref).abs().max()
    _same_on_every_rank(comm, params)
    start = list(_Net().parameters())
    assert any(not torch.equal(p, s) for p, s in zip(params, start))  # it did train


@needs_power_of_two
@pytest.mark.parametrize(("passes", "fp16"), [(1, False), (2, False), (1, True)])
def test_optimizer(started, passes, fp16):
    comm = started
    net = _Net()
    compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
    opt = adasum_distributed_optimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        named_parameters=net.named_parameters(),
        compression=compression,
        backward_passes_per_step=passes,
        process_set=hvd.global_process_set,
    )
    assert isinstance(opt, torch.optim.SGD)
    _check_training(comm, _train(opt, net, comm.rank, 3, passes), passes, fp16)
    with (
        pytest.raises(AssertionError, match="not supported when using Adasum"),
        opt.skip_synchronize(),
    ):
        pass


def test_optimizer_refusals(started):
    comm = started
    net = _Net()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        adasum_distributed_optimizer(sgd, None, hvd.Compression.none, 0, None)
    if _power_of_two(comm.size):
        return
    adasum_distributed_optimizer(sgd, None, hvd.Compression.none, 1, None)
    x, y = _batch(comm.rank, 0)
    with pytest.raises(NotImplementedError, match="non-power of 2 ranks"):
        torch.nn.functional.mse_loss(net(x), y).backward()


@needs_power_of_two
def test_distributed_optimizer_dispatches_adasum(started):
    comm = started
    net = _Net()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        named_parameters=net.named_parameters(),
        op=hvd.Adasum,
    )
    _check_training(comm, _train(opt, net, comm.rank, 3, 1), 1, False)
