"""torch CUDA tensors: ``copy_(non_blocking=True)`` on mpisync's streams, pinned tensors for
staging."""

from __future__ import annotations

import numpy as _np

from .base import Backend

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    """Device operations for CUDA ``torch.Tensor``; host buffers are pinned torch tensors seen as
    numpy."""

    name = "torch"

    def __init__(self):
        import torch

        super().__init__()
        self._torch = torch

    def flat_bytes(self, array):
        return array.detach().reshape(-1).view(self._torch.uint8)

    def device_of(self, array) -> int:
        return int(array.device.index)

    def synchronize(self, device: int) -> None:
        self._torch.cuda.synchronize(device)

    def pinned(self, nbytes: int):
        # The numpy array's base is the pinned tensor: whoever holds the array holds the memory,
        # and the memory goes back to torch's pinned allocator when the last view of it goes.
        return self._pin(nbytes).numpy()

    def _pin(self, nbytes: int):
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)

    def empty(self, nbytes: int, device: int):
        return self._torch.empty(nbytes, dtype=self._torch.uint8, device=f"cuda:{device}")

    def stream(self, device: int):
        return self._torch.cuda.Stream(device=device)

    def _pinned_tensor(self, view):
        """The bytes of the tensor behind numpy ``view`` (a slice of what :meth:`pinned` returned),
        found through the view's ``base`` (no search): copies from pinned memory stay
        asynchronous."""
        owner = view
        while isinstance(owner, _np.ndarray):
            owner = owner.base
        if (
            isinstance(owner, self._torch.Tensor)
            and owner.dtype == self._torch.uint8
            and owner.dim() == 1
        ):
            offset = view.ctypes.data - owner.data_ptr()
            if 0 <= offset and offset + view.nbytes <= owner.numel():
                return owner[offset : offset + view.nbytes]
        return self._torch.from_numpy(view)  # not one of ours: torch copies it synchronously

    def to_host(self, dst, src, stream) -> None:
        with self._torch.cuda.stream(stream):
            self._pinned_tensor(dst).copy_(src, non_blocking=True)

    def to_device(self, dst, src, stream) -> None:
        with self._torch.cuda.stream(stream):
            dst.copy_(self._pinned_tensor(src), non_blocking=True)

    def copy(self, dst, src, stream) -> None:
        with self._torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def pack_kernel(self, dst, sources, stream) -> bool:
        if not all(s.device == dst.device for s in sources):
            return False
        with self._torch.cuda.stream(stream):
            self._torch.cat(sources, out=dst)  # one (precompiled) kernel for the bucket
        return True

    def unpack(self, destinations, src, stream) -> None:
        if destinations and all(d.device == src.device for d in destinations):
            parts = list(self._torch.split(src, [int(d.numel()) for d in destinations]))
            with self._torch.cuda.stream(stream):
                self._torch._foreach_copy_(destinations, parts)
        else:
            super().unpack(destinations, src, stream)

    def record(self, stream):
        event = self._torch.cuda.Event()
        event.record(stream)
        return event

    def done(self, event) -> bool:
        return bool(event.query())
