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
from .process_sets import global_process_set

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """``torch.nn.BatchNorm*d`` with statistics over every rank of ``process_set``."""

    def __init__(
        self,
        num_features,
        eps=1e-5,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        process_set=global_process_set,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
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
