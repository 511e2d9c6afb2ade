"""``GradOverlap``: a plain torch model's gradients all-reduced during backward, in fused buckets
(:mod:`mpisync.allreduce.buckets`, the machinery of ``mpisync.horovod.DistributedOptimizer``'s
overlap), finished by one call before ``optimizer.step()``."""

from __future__ import annotations

import typing as _typing
from collections.abc import Iterable

from mpi4py import MPI

from .. import config as _config
from ..errors import InvalidParamError
from .buckets import Buckets, bucket_caps, densified

__all__ = ["GradOverlap"]


class GradOverlap:
    """The gradients of ``module`` averaged (``op="sum"``: summed) over the ranks of ``comm``,
    their all-reduces started during backward.

    Each parameter's post-accumulate-grad hook copies its gradient into a fused bucket of at
    most ``fusion_bytes`` (in reverse registration order, as backward produces them); a full
    bucket starts its nonblocking all-reduce at once, and each hook lets MPI progress the ones
    in flight. :meth:`finish` (collective) reduces what no hook gave, waits for every bucket
    and writes the results into ``p.grad``: call it after the last backward pass of a step,
    before ``optimizer.step()``. The first :meth:`finish` lays out the buckets and checks that
    the ranks agree; hooks start buckets from the second step on. A gradient that is ``None``
    on some ranks counts as zeros there, and stays ``None`` where every rank has none; a sparse
    gradient is reduced dense and given back sparse. The arithmetic is :class:`GradSync`'s
    (half precision summed in ``float32``, ``avg`` the sum divided by the ranks' count).
    Gradients changed between backward and :meth:`finish` (clipped, say) are not seen: clip
    after it.

    Args:
        module: A ``torch.nn.Module``, or ``(name, parameter)`` pairs (``named_parameters()``).
        comm: The intracommunicator whose ranks take part (default ``MPI.COMM_WORLD``).
        op: ``"avg"`` (default) or ``"sum"``.
        fusion_bytes: The most bytes of gradients per bucket (a larger gradient has its own;
            else ``MPISYNC_FUSION_BYTES``; where neither is set, DDP's buckets: the first at
            most 1 MiB, the others 25 MiB). Smaller buckets start sooner.
        backward_passes_per_step: Backward passes accumulated into ``.grad`` per step; the
            hooks start buckets on the last one.
        timeout: Seconds each wait may take (``MPISYNC_TIMEOUT``).

    Raises:
        InvalidParamError: ``op`` is not ``"avg"`` or ``"sum"``, ``fusion_bytes`` < 0,
            ``timeout`` < 0, ``backward_passes_per_step`` < 1, or an ``MPISYNC_*`` setting is
            invalid.

    Example::

        with mpisync.GradOverlap(model, MPI.COMM_WORLD, fusion_bytes=4 << 20) as overlap:
            for batch in data:
                optimizer.zero_grad()
                loss(model(batch)).backward()  # buckets start here
                overlap.finish()  # every p.grad now holds the average over the ranks
                optimizer.step()
    """

    def __init__(
        self,
        module: _typing.Any,
        comm: MPI.Intracomm | None = None,
        *,
        op: str = "avg",
        fusion_bytes: int | None = None,
        backward_passes_per_step: int = 1,
        timeout: float | None = None,
    ) -> None:
        if op not in ("avg", "sum"):
            raise InvalidParamError(f"mpisync: GradOverlap's op is 'avg' or 'sum', got {op!r}")
        settings = _config.resolve(fusion_bytes=fusion_bytes, timeout=timeout)
        passes = backward_passes_per_step
        if not isinstance(passes, int) or passes < 1:
            raise InvalidParamError(f"mpisync: backward_passes_per_step must be >= 1, got {passes}")
        named = module.named_parameters() if hasattr(module, "named_parameters") else module
        self.params = [p for _, p in _unique(named) if p.requires_grad]
        self._buckets = Buckets(
            MPI.COMM_WORLD if comm is None else comm,
            len(self.params),
            self._pack,
            self._unpack,
            op=op,
            caps=bucket_caps(settings.fusion_bytes),
            timeout=settings.timeout.value,
            passes=passes,
        )
        self._buckets.attach(self.params)

    @property
    def started_early(self) -> int:
        """Buckets started so far from a hook while another gradient of the step was still to
        come: what overlapped."""
        return self._buckets.early

    def _pack(self, index: int):
        grad = self.params[index].grad
        if grad is None:
            return self.params[index].detach().new_zeros(self.params[index].shape), False
        return (densified(grad) if grad.is_sparse else grad), True

    def _unpack(self, index: int, reduced) -> None:
        p = self.params[index]
        if p.grad is None:  # ``reduced`` is the bucket's memory, on the host
            p.grad = reduced.to(p.device, copy=True)
        elif p.grad.is_sparse:
            p.grad = reduced.to(p.device).to_sparse(p.grad.sparse_dim())
        else:
            p.grad.copy_(reduced)

    def finish(self) -> None:
        """Reduce the gradients not yet started, wait for every bucket, and write the results
        into ``p.grad``. Collective over ``comm``: call it once per step, before the step.

        Raises:
            AssertionError: Backward ran more than ``backward_passes_per_step`` times since
                the last :meth:`finish` (Horovod's error).
            mpisync.ManifestMismatchError: On every rank, at the first call, when the ranks'
                gradients differ in number, shapes, dtypes or ``None`` ones.
            mpisync.SyncTimeoutError: A bucket did not complete within ``timeout`` (with
                ``MPISYNC_TIMEOUT_ABORT=0``; by default the job is aborted).
        """
        self._buckets.finish()

    wait = finish

    def close(self) -> None:
        """Remove the hooks and free the communicator; not collective."""
        self._buckets.close()

    def __enter__(self) -> GradOverlap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unique(named: Iterable) -> list:
    """``(name, parameter)`` pairs, each parameter once (tied weights are one gradient)."""
    seen: set = set()
    kept = []
    for name, p in named:
        if id(p) not in seen:
            seen.add(id(p))
            kept.append((name, p))
    return kept
