"""Horovod's ``DistributedOptimizer(op=hvd.Adasum)`` (its ``_DistributedAdasumOptimizer``): each
rank steps the wrapped optimizer on its own gradients, and the step's change of each parameter
(the delta) is reduced with Adasum, then added to the parameter as it was before the step.

As in Horovod, a parameter's delta is computed and its Adasum started from a hook as soon as its
gradient is accumulated on the ``backward_passes_per_step``-th backward pass (the wrapped
optimizer steps that parameter alone), named by ``named_parameters``; ``step()`` starts those
that did not run yet, waits for every one, and writes ``start + delta`` into the parameters.
``Compression.fp16`` reduces the deltas as float16.
"""

from __future__ import annotations

import contextlib as _contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .compression import Compression, Compressor
from .context import require
from .naming import named_parameters_of
from .ops import Adasum, allreduce_async_, synchronize
from .process_sets import global_process_set, resolve

if TYPE_CHECKING:
    import torch

    from .process_sets import ProcessSet

__all__ = ["adasum_distributed_optimizer"]


class _DistributedAdasumOptimizer:
    """The methods the wrapper's class takes over from the wrapped optimizer's class."""

    _adasum: _State
    _mpisync_base: Any  # the wrapped optimizer's class
    _handles: dict
    _allreduce_delay: dict
    backward_passes_per_step: int

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Set how many backward passes make one step (Horovod's method)."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def synchronize(self) -> None:
        """Nothing: Horovod's Adasum optimizer reduces in ``step()``."""

    @_contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Refused, as in Horovod."""
        raise AssertionError(
            "Skipping synchronization is not supported when using Adasum optimizer."
        )
        yield  # pragma: no cover - makes this a generator

    def step(self, closure=None):
        """Finish every parameter's Adasum of its delta and set it to ``start + delta``.

        Args:
            closure: Called first, as torch's optimizers do; its value is returned.

        Returns:
            What ``closure`` returned, or ``None``.
        """
        loss = closure() if closure is not None else None
        for p in self._adasum.requires_update:
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._adasum.start(self, p)
        for p, (handle, ctx) in self._handles.items():
            delta = self._adasum.compression.decompress(synchronize(handle), ctx)
            start = self._adasum.starting[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """The wrapped optimizer's ``zero_grad``, refused between ``backward()`` and
        ``step()`` as in Horovod."""
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        return self._mpisync_base.zero_grad(self, *args, **kwargs)


class _State:
    """What the hooks and ``step()`` share: names, starting values, compression."""

    def __init__(self, named: list, compression: type[Compressor]):
        import torch

        self.names = {p: name for name, p in named}
        self.compression = compression
        self.starting = {p: torch.zeros_like(p, requires_grad=False) for _, p in named}
        self.requires_update: list = []

    def start(self, optimizer, p) -> tuple:
        """Step ``optimizer`` on ``p`` alone from a zero start (the delta), and start the
        Adasum of the delta; ``(handle, ctx)`` of the compression."""
        start = self.starting[p]
        stashed = [group["params"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p)
            optimizer._mpisync_base.step(optimizer)
            p.data.sub_(start)
        finally:
            for params, group in zip(stashed, optimizer.param_groups):
                group["params"] = params
        compressed, ctx = self.compression.compress(p)
        return allreduce_async_(compressed.data, name=self.names[p], op=Adasum), ctx


def _hook(optimizer, p):
    def hook(*_: Any) -> None:
        pending = optimizer._handles.get(p)
        if pending is not None and pending[0] is not None and optimizer._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally."
            )
        optimizer._allreduce_delay[p] -= 1
        handle_ctx: tuple = (None, None)
        if optimizer._allreduce_delay[p] == 0:
            handle_ctx = optimizer._adasum.start(optimizer, p)
        optimizer._handles[p] = handle_ctx

    return hook


def adasum_distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    process_set: ProcessSet | None = global_process_set,
) -> torch.optim.Optimizer:
    """Horovod's Adasum optimizer: what ``hvd.DistributedOptimizer(..., op=hvd.Adasum)``
    returns on more than one rank.

    The result is an instance of a subclass of the optimizer's class sharing its state and
    parameter groups. Each parameter that requires a gradient gets a zero ``.grad`` and a hook
    that, on the ``backward_passes_per_step``-th backward pass, steps the optimizer on that
    parameter alone and starts the Adasum of the change (named as in ``named_parameters``);
    ``step()`` completes them and sets each parameter to its value before the step plus the
    reduced change.

    Args:
        optimizer: The ``torch.optim.Optimizer`` to wrap.
        named_parameters: ``model.named_parameters()``: the names the ranks match the
            reductions by (every parameter of the optimizer, each name once). Default: the
            parameters' order.
        compression: ``Compression.none`` or ``Compression.fp16`` (the changes travel and are
            combined as float16).
        backward_passes_per_step: Backward passes per ``step()``.
        process_set: Only the global set, as in Horovod.

    Returns:
        The wrapped optimizer, to use in place of ``optimizer``.

    Raises:
        ValueError: :func:`init` has not been called; ``backward_passes_per_step`` < 1;
            ``named_parameters`` repeats a name or misses a parameter.
        NotImplementedError: A process set other than the global one, or a number of ranks
            that is not a power of two (at the first reduction), as Horovod.
    """
    require()
    if resolve(process_set) != global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    named = named_parameters_of(optimizer, named_parameters)
    base = type(optimizer)
    methods = {k: v for k, v in vars(_DistributedAdasumOptimizer).items() if not k.startswith("__")}
    cls = type(base.__name__, (base,), {**methods, "_mpisync_base": base, "__doc__": base.__doc__})
    wrapped: Any = object.__new__(cls)  # not __init__: the optimizer's own state is taken below
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._parameter_names = {p: name for name, p in named}  # Horovod's attribute
    wrapped.backward_passes_per_step = backward_passes_per_step
    wrapped._allreduce_delay = {p: backward_passes_per_step for _, p in named}
    wrapped._handles = {}
    wrapped._adasum = _State(named, compression)
    for group in wrapped.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                wrapped._adasum.requires_update.append(p)
                p.register_post_accumulate_grad_hook(_hook(wrapped, p))
    return wrapped
