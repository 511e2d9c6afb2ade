"""Horovod's ``SyncBatchNorm``: batch normalization whose batch statistics are those of the
whole batch over the ranks of a process set, on any device torch runs (CPU too).

In training the mean and the variance come from two differentiable all-reduces (the sum and
the count, then the sum of squared deviations from that mean), so the gradients of every
rank's loss reach every rank's inputs, as with torch's ``SyncBatchNorm``. In evaluation, or
without running statistics to follow, it is ``torch.nn.functional.batch_norm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from .autograd import allreduce
from .ops import Sum
from .process_sets import ProcessSet, global_process_set

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """``torch.nn.BatchNorm*d`` whose training statistics are those of the whole batch over
    every rank of ``process_set`` (Horovod's ``SyncBatchNorm``).

    In training, the mean and variance per channel come from two differentiable
    all-reduces (sum and count, then the squared deviations), so gradients reach every
    rank's inputs; ranks may hold batches of different sizes. It runs on any device torch
    runs, CPU included. In evaluation with running statistics it is plain batch norm. Input
    of any dimension >= 2 is accepted (channels in dimension 1), as in Horovod.

    Args:
        num_features: The number of channels ``C`` of an input ``(N, C, ...)``.
        eps: Added to the variance for numerical stability.
        momentum: The running statistics' update factor (``None`` is 0.1 here, not
            torch's cumulative average).
        affine: Whether the module has a learnable per-channel weight and bias.
        track_running_stats: Whether it keeps running mean and variance (used in
            evaluation).
        process_set: The ranks whose batches form the statistics (default: every rank).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_set: ProcessSet = global_process_set,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input`` with the statistics of every rank's batch (in training).

        Every rank of the set calls it in the same order: each call is two all-reduces.

        Args:
            input: A tensor ``(N, C, ...)`` with ``C == num_features``.

        Returns:
            The normalized tensor (scaled and shifted when ``affine``).

        Raises:
            ValueError: ``input`` has fewer than 2 dimensions.
            HorovodInternalError: The ranks' channel counts or dtypes differ (on every
                rank).
            mpisync.SyncTimeoutError: A rank did not take part within ``MPISYNC_TIMEOUT``.
        """
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias,
                False, 0.0, self.eps,
            )  # fmt: skip
        if self.training and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        dims = [d for d in range(input.dim()) if d != 1]
        count = torch.tensor([input.numel() / input.shape[1]], dtype=input.dtype)
        totals = allreduce(
            torch.cat([input.sum(dims), count.to(input.device)]),
            op=Sum,
            process_set=self.process_set,
        )
        n = totals[-1]
        mean = totals[:-1] / n
        shape = [1, -1] + [1] * (input.dim() - 2)
        centered = input - mean.reshape(shape)
        squares = allreduce(centered.pow(2).sum(dims), op=Sum, process_set=self.process_set)
        var = squares / n
        if self.training and self.running_mean is not None and self.running_var is not None:
            momentum = self.momentum if self.momentum is not None else 0.1
            with torch.no_grad():
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                unbiased = var.detach() * n / max(float(n) - 1, 1.0)
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased)
        out = centered / torch.sqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out
