"""torch CUDA tensors: ``copy_(non_blocking=True)`` on mpisync's streams, pinned tensors for staging."""

from __future__ import annotations

from .base import Backend

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    """Device operations for CUDA ``torch.Tensor``; host buffers are pinned torch tensors seen as numpy."""

    name = "torch"

    def __init__(self):
        import torch

        self._torch = torch
        self._pinned_keepalive: list = []

    def flat_bytes(self, array):
        return array.detach().reshape(-1).view(self._torch.uint8)

    def device_of(self, array) -> int:
        return int(array.device.index)

    def synchronize(self, device: int) -> None:
        self._torch.cuda.synchronize(device)

    def pinned(self, nbytes: int):
        tensor = self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)
        self._pinned_keepalive.append(tensor)
        return tensor.numpy()

    def empty(self, nbytes: int, device: int):
        return self._torch.empty(nbytes, dtype=self._torch.uint8, device=f"cuda:{device}")

    def stream(self, device: int):
        return self._torch.cuda.Stream(device=device)

    def _pinned_tensor(self, view):
        """The slice of a pinned tensor behind numpy ``view``: copies from it stay asynchronous."""
        address = view.ctypes.data
        for tensor in self._pinned_keepalive:
            start = tensor.data_ptr()
            if start <= address < start + tensor.numel():
                return tensor[address - start:address - start + view.nbytes]
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

    def pack(self, dst, sources, stream) -> None:
        if sources and all(s.device == dst.device for s in sources):
            with self._torch.cuda.stream(stream):
                self._torch.cat(sources, out=dst)  # one kernel for the bucket
        else:
            super().pack(dst, sources, stream)

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
