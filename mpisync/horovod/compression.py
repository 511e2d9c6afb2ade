"""Horovod's ``Compression``: what a tensor travels as (``none``: as it is; ``fp16``: floating
tensors as float16, restored to their dtype after)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]


class Compressor:
    """What a tensor travels as: ``compress(tensor) -> (tensor, ctx)`` before the operation,
    ``decompress(tensor, ctx)`` after. A user's subclass may be passed as ``compression``."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Make the tensor to send.

        Args:
            tensor: The tensor as the caller gave it.

        Returns:
            The tensor to send, and what :meth:`decompress` needs to restore it.

        Raises:
            NotImplementedError: Always, in this base class.
        """
        raise NotImplementedError("a Compressor subclass defines compress(tensor)")

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Restore a received tensor.

        Args:
            tensor: The result of the operation, in the form :meth:`compress` sent.
            ctx: What :meth:`compress` returned beside the tensor.

        Returns:
            The result in the caller's form.

        Raises:
            NotImplementedError: Always, in this base class.
        """
        raise NotImplementedError("a Compressor subclass defines decompress(tensor, ctx)")


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (reduced in float32 by mpisync, rounded once)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            import torch

            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """The compressions of ``horovod.torch``, passed as ``compression=`` to
    :func:`allreduce`, :func:`reducescatter` and ``DistributedOptimizer``.

    ``Compression.none`` sends tensors as they are; ``Compression.fp16`` sends floating-point
    tensors as float16 and casts the result back to their dtype (other dtypes travel as they
    are). mpisync reduces float16 in float32 and rounds the result once.
    """

    #: No compression: the tensor travels as it is.
    none = NoneCompressor
    #: Floating-point tensors travel as float16, restored to their dtype after.
    fp16 = FP16Compressor
