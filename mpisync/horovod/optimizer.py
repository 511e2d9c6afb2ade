"""Horovod's ``DistributedOptimizer``: the wrapped optimizer's own class, whose gradients are
averaged (or summed) over the ranks of ``process_set`` before its ``step()`` (a rank outside the
set steps with its own gradients). Sparse ones go as Horovod's: an allgather of indices and
values, or reduced dense and given back sparse with ``sparse_as_dense=True``.

By default the reduction overlaps backward: the dense gradients are laid into fused buckets of
``fusion_bytes`` (:mod:`mpisync.allreduce.buckets`), each bucket's all-reduce starting from
torch's post-accumulate-grad hooks as soon as its gradients are ready on the last of
``backward_passes_per_step`` passes; ``step()`` (or ``synchronize()``) reduces what no hook gave
and waits for the rest. The first step lays the buckets out and reduces them all at ``step()``.
With ``overlap=False`` every dense gradient goes through one :class:`~mpisync.GradSync` call at
``step()``. Both give the same bytes on one or two ranks; with more, the order of the additions
is the transport's.

The object returned is an instance of a subclass of the optimizer's class that shares the
optimizer's state and parameter groups, so learning-rate schedulers, ``state_dict()`` and
``broadcast_optimizer_state`` treat it as the optimizer itself. A parameter whose gradient is
``None`` on some ranks counts as zeros there; ``None`` on every rank stays ``None`` (the
optimizer skips it, as without Horovod). ``backward_passes_per_step`` backward passes before a
step accumulate in ``.grad`` as torch does.
"""

from __future__ import annotations

import contextlib as _contextlib
import warnings as _warnings
import zlib as _zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .. import config as _config
from ..allreduce.buckets import Buckets, bucket_caps, densified
from .compression import Compression, Compressor
from .context import default_comm, require
from .naming import named_parameters_of
from .ops import Adasum, Average, Sum, in_engine, reduce_op
from .process_sets import resolve

if TYPE_CHECKING:
    import torch

    from .process_sets import ProcessSet

__all__ = ["DistributedOptimizer"]

_FLAGS = "mpisync.horovod.has_grad"  # rides in the same all-reduce: who has which gradient


class _Reduction:
    """The reduction state of one distributed optimizer: its buckets (overlap), else its own
    :class:`~mpisync.GradSync`."""

    def __init__(self, process_set, named, compression, op, predivide, sparse_as_dense, overlap):
        import torch

        # a rank outside the process set steps with its own gradients, as in Horovod
        self.process_set = process_set
        self.comm = default_comm(process_set) if process_set.included() else None
        self.horovod_op = op
        self.named = named  # [(name, parameter)], in the optimizer's order
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        # A predivided average is a sum scaled before and after, as Horovod does it.
        self.predivide = predivide
        self.op = "sum" if op == Sum or predivide != 1.0 else "avg"
        self.scale_after = predivide / process_set.size() if predivide != 1.0 else 1.0
        self.reducer = None  # made at the first reduction
        # set and read through numpy (a torch element access costs microseconds per gradient)
        self.flags = torch.zeros(len(named), dtype=torch.float32)
        self.flag_values = self.flags.numpy()
        self.synchronized = False
        self.skip = False
        self.contexts: list = [None] * len(named)  # each gradient's compression context
        self.buckets: Buckets | None = None
        if overlap is not None and self.comm is not None:
            caps, passes = overlap
            self.buckets = Buckets(
                self.comm,
                len(named),
                self._pack,
                self._unpack,
                op=self.op,
                caps=caps,
                timeout=_config.resolve().timeout.value,
                passes=passes,
            )
            self.buckets.attach([p for _, p in named])

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()
            self.reducer = None
        if self.buckets is not None:
            self.buckets.close()
            self.buckets = None

    def _pack(self, index: int):
        """Gradient ``index`` as it travels (compressed, predivided) and whether this rank has
        one; ``None`` for a sparse gradient (Horovod's allgather takes it)."""
        name, p = self.named[index]
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            return None
        has = p.grad is not None
        sent, self.contexts[index] = self.compression.compress(self._gradient(name, p))
        if self.predivide != 1.0:
            sent = sent / self.predivide
        return sent, has

    def _unpack(self, index: int, reduced) -> None:
        """Give parameter ``index`` its reduced gradient (``reduced`` is the bucket's memory)."""
        result = self.compression.decompress(reduced, self.contexts[index])
        if self.scale_after != 1.0:
            result = result * self.scale_after
        self._store(self.named[index][1], result, reduced)

    @staticmethod
    def _store(p, result, borrowed=None) -> None:
        """Write ``result`` into ``p.grad`` (a copy where it is ``borrowed`` memory)."""
        if p.grad is None:
            p.grad = result.to(p.device, copy=result is borrowed)
        elif p.grad.is_sparse:
            p.grad = result.to(p.device).to_sparse(p.grad.sparse_dim())
        elif result is not p.grad:
            p.grad.copy_(result)

    def _gradient(self, name, p):
        """``p.grad`` as a dense contiguous tensor, or zeros where it is ``None``."""
        import torch

        grad = p.grad
        if grad is None:
            return torch.zeros_like(p, memory_format=torch.contiguous_format)
        if grad.is_sparse:  # sparse_as_dense: reduced dense, given back sparse
            grad = densified(grad)
        if not grad.is_contiguous():
            grad = p.grad = grad.contiguous()
        return grad

    def _sparse(self) -> list:
        """Submit the sparse gradients (Horovod's allgather of indices and values); their
        ``[(parameter, handle)]``."""
        from .ops import sparse_allreduce_async

        return [
            (p, sparse_allreduce_async(p.grad, f"sparse.{name}", self.horovod_op, self.process_set))
            for name, p in self.named
            if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense
        ]

    def _match(self) -> tuple:
        """The operation's name and what the ranks must agree on (Horovod names a gradient by
        its parameter: here the first)."""
        name = self.named[0][0] if self.named else "none"
        names = _zlib.crc32("\0".join(n for n, _ in self.named).encode())
        return name, [self.horovod_op, self.predivide, len(self.named), names]

    def reduce(self) -> None:
        """Reduce every gradient over the ranks: the dense ones in buckets (overlap) or in one
        call."""
        if self.comm is None:
            self.synchronized = True
            return
        if self.buckets is None:
            self._reduce_at_once()
        else:
            if self.buckets.too_many:  # Horovod's AssertionError, not inside an operation
                self.buckets.finish()
            sparse = self._sparse()
            name, match = self._match()
            in_engine(self.process_set, "gradients", name, match, self.buckets.finish)
            for p, handle in sparse:
                p.grad = handle()
        self.synchronized = True

    def _reduce_at_once(self) -> None:
        """The dense gradients through one :class:`~mpisync.GradSync` call, at ``step()``."""
        from ..allreduce import GradSync

        if self.reducer is None:
            self.reducer = GradSync(self.comm, op=self.op)
        sparse = self._sparse()
        sparse_ids = {id(p) for p, _ in sparse}
        sending, kept = {}, []
        for i, (name, p) in enumerate(self.named):
            if id(p) in sparse_ids:
                self.flag_values[i] = 0.0
                continue
            self.flag_values[i] = 0.0 if p.grad is None else 1.0
            grad = self._gradient(name, p)
            sent, ctx = self.compression.compress(grad)
            if self.predivide != 1.0:
                sent = sent / self.predivide
            sending[name] = sent
            kept.append((i, p, sent, ctx))
        sending[_FLAGS] = self.flags
        reducer = self.reducer
        name, match = self._match()
        in_engine(self.process_set, "gradients", name, match, lambda: reducer.allreduce(sending))
        for p, handle in sparse:
            p.grad = handle()
        for i, p, sent, ctx in kept:
            if not self.flag_values[i] > 0:  # no rank has a gradient: the optimizer skips it
                continue
            result = self.compression.decompress(sent, ctx)
            if self.scale_after != 1.0:
                result = result * self.scale_after
            self._store(p, result)


class _DistributedOptimizer:
    """The methods added to the wrapped optimizer's class (Horovod's, with mpisync's
    reduction)."""

    _mpisync: _Reduction
    _mpisync_base: Any  # the optimizer's own class

    def synchronize(self) -> None:
        """Reduce the gradients now (e.g. to clip them), then step inside
        ``skip_synchronize()``.

        Raises:
            mpisync.InvalidParamError: On every rank, when a rank's gradients cannot be
                reduced (a dtype the op cannot reduce, for one).
            mpisync.ManifestMismatchError: On every rank, when the ranks' gradients differ
                in names, shapes or dtypes.
            mpisync.SyncTimeoutError: A rank of the set did not reduce within
                ``MPISYNC_TIMEOUT`` (with ``MPISYNC_TIMEOUT_ABORT=0``).
        """
        self._mpisync.reduce()

    @_contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """A context in which ``step()`` uses the gradients as they are (already reduced by
        ``synchronize()``), as in Horovod.

        Yields:
            ``None``; on leaving the block, ``step()`` reduces again.
        """
        self._mpisync.skip = True
        try:
            yield
        finally:
            self._mpisync.skip = False

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Reduce the gradients over the ranks (unless already done), then take the wrapped
        optimizer's step.

        After ``synchronize()`` and outside ``skip_synchronize()``, the gradients are not
        reduced again and Horovod's UserWarning is given.

        Args:
            closure: Passed to the wrapped optimizer's ``step``.

        Returns:
            What the wrapped optimizer's ``step`` returns (the closure's loss, or ``None``).

        Raises:
            mpisync.InvalidParamError: On every rank, when a rank's gradients cannot be
                reduced.
            mpisync.ManifestMismatchError: The ranks' gradients differ in names, shapes or
                dtypes (on every rank).
            mpisync.SyncTimeoutError: The reduction did not complete within
                ``MPISYNC_TIMEOUT``.
        """
        state = self._mpisync
        if not state.skip:
            if state.synchronized:
                _warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize() (Horovod's warning): the gradients were "
                    "already reduced and are not reduced again",
                    UserWarning,
                    stacklevel=2,
                )
            else:
                state.reduce()
        state.synchronized = False
        return self._mpisync_base.step(self, closure)


def DistributedOptimizer(  # noqa: N802  (Horovod's name: a function returning the wrapper)
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    groups: int | list[list[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet | None = None,
    overlap: bool = True,
    fusion_bytes: int | None = None,
) -> torch.optim.Optimizer:
    """Wrap a torch optimizer so that ``step()`` first averages (``op=Sum``: sums) every
    gradient over the ranks of ``process_set``.

    The result is an instance of a subclass of the optimizer's class sharing its state and
    parameter groups, so schedulers, ``state_dict()`` and :func:`broadcast_optimizer_state`
    treat it as the optimizer. As in Horovod, ``synchronize()`` reduces early (to clip the
    gradients), and ``step()`` inside ``skip_synchronize()`` then does not reduce again.
    As in Horovod, the dense gradients are reduced in fused buckets whose all-reduces start
    from backward hooks once their gradients are ready (the first step reduces them all at
    ``step()``); ``step()`` (or ``synchronize()``) waits for them. Gradients changed after
    backward (clipped, say) must go through ``synchronize()`` first, as in Horovod. A gradient
    that is ``None`` on some ranks counts as zeros there, and stays ``None`` where every rank
    has none. Sparse gradients
    travel as Horovod's (an allgather of indices and values). A rank outside
    ``process_set`` steps with its own gradients. Horovod's deprecated ``num_groups`` is not
    a parameter.

    Args:
        optimizer: The ``torch.optim.Optimizer`` to wrap.
        named_parameters: ``model.named_parameters()``: names for the gradients (every
            parameter of the optimizer must be there, each name once). Default: the
            parameters' order.
        compression: ``Compression.none`` or ``Compression.fp16`` (gradients travel as
            float16).
        backward_passes_per_step: Backward passes per ``step()``; gradients accumulate in
            ``.grad`` as torch does and are reduced once per step.
        op: ``Average`` (default), ``Sum``, or ``Adasum`` (Horovod's Adasum optimizer: each
            rank steps on its own gradients and the parameters' changes are combined).
        gradient_predivide_factor: With ``Average``: gradients are divided by it before the
            sum and multiplied by ``factor / size`` after, as Horovod's.
        groups: Horovod's explicit grouping; accepted and not needed (mpisync fuses small
            gradients by itself).
        sparse_as_dense: Reduce sparse gradients as dense tensors and give them back sparse.
        process_set: The ranks whose gradients are averaged (default: every rank).
        overlap: ``False``: no hooks; every dense gradient goes through one
            :class:`mpisync.GradSync` call at ``step()``.
        fusion_bytes: The most bytes of gradients per bucket (a larger gradient has its own);
            else ``MPISYNC_FUSION_BYTES``; where neither is set, DDP's buckets (the first at
            most 1 MiB, the others 25 MiB). Unlike
            ``HOROVOD_FUSION_THRESHOLD`` (a cap on what each cycle fuses), a bucket starts once
            full, so smaller buckets start sooner.

    Returns:
        The wrapped optimizer, to use in place of ``optimizer``.

    Raises:
        ValueError: :func:`init` has not been called; ``op`` is not ``Average``, ``Sum`` or
            ``Adasum``;
            ``backward_passes_per_step`` < 1; ``gradient_predivide_factor`` <= 0, or not 1
            with ``Sum``; ``named_parameters`` repeats a name or misses a parameter;
            ``fusion_bytes`` < 0 (:class:`mpisync.InvalidParamError`).
        NotImplementedError: ``op=Adasum`` with a process set other than the global one.
    """
    context = require()
    reduce_op(None, op)  # unknown ops are refused here, before any step
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor applies to op=hvd.Average only")
    if op == Adasum:  # Horovod's own optimizer for it: each rank steps, the changes are combined
        from .adasum_optimizer import adasum_distributed_optimizer

        return adasum_distributed_optimizer(
            optimizer, named_parameters, compression, backward_passes_per_step, process_set
        )
    if op not in (Average, Sum):
        raise ValueError(
            "DistributedOptimizer reduces gradients with hvd.Average, hvd.Sum or hvd.Adasum"
        )
    named = named_parameters_of(optimizer, named_parameters)
    caps = bucket_caps(_config.resolve(fusion_bytes=fusion_bytes).fusion_bytes)
    base = type(optimizer)
    methods = {k: v for k, v in vars(_DistributedOptimizer).items() if not k.startswith("__")}
    cls = type(base.__name__, (base,), {**methods, "_mpisync_base": base, "__doc__": base.__doc__})
    wrapped: Any = object.__new__(cls)  # not __init__: the optimizer's own state is taken below
    wrapped.__dict__.update(optimizer.__dict__)  # the same state and parameter groups
    wrapped._parameter_names = {p: name for name, p in named}  # Horovod's attribute
    wrapped._mpisync = _Reduction(
        resolve(process_set),
        named,
        compression,
        op,
        float(gradient_predivide_factor),
        sparse_as_dense,
        (caps, backward_passes_per_step) if overlap else None,
    )
    context.optimizers.add(wrapped)
    return wrapped
