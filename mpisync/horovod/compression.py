"""Horovod's ``Compression``: what a tensor travels as (``none``: as it is; ``fp16``: floating
tensors as float16, restored to their dtype after)."""

from __future__ import annotations

from typing import Any

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"]


class Compressor:
    """``compress(tensor) -> (tensor, ctx)`` before the reduction, ``decompress(tensor, ctx)``
    after."""

    @staticmethod
    def compress(tensor) -> tuple[Any, Any]:
        """The tensor to send, and what :meth:`decompress` needs."""
        raise NotImplementedError("a Compressor subclass defines compress(tensor)")

    @staticmethod
    def decompress(tensor, ctx):
        """The reduced tensor back in its own form."""
        raise NotImplementedError("a Compressor subclass defines decompress(tensor, ctx)")


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (reduced in float32 by mpisync, rounded once)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            import torch

            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in ``horovod.torch``."""

    none = NoneCompressor
    fp16 = FP16Compressor
