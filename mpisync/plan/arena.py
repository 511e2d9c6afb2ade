"""The fusion arena: byte slots that small tensors are packed into before a broadcast.

Packing thousands of small tensors one slice assignment at a time puts Python's
per-operation overhead on every tensor. Where the OS offers it, the arena is a
memory file (``memfd``) mapped into memory, and a whole bucket is packed with one
``pwritev`` and unpacked with one ``preadv``: the kernel walks the list of
tensor buffers, and Python touches the list once per bucket, not once per
tensor. The mapping is what MPI sends from and receives into; both views see
the same pages. Elsewhere the same copies run as a Python loop. Both give way
to the C loops of :mod:`mpisync._runtime.speedups` where they are built (one memcpy per
tensor, no system call; the figures: docs/design.md, docs/performance.md; ``mpisync bench
--workloads many-small`` times both ways, ``MPISYNC_SPEEDUPS=0`` leaving the C loops out).
"""

from __future__ import annotations

import mmap as _mmap
import os as _os
import weakref as _weakref

import numpy as _np

from .._runtime.speedups import compiled_lists, loops

__all__ = ["Arena", "check_copier", "copy_list", "part_copies", "vectored_io_available"]

try:
    _IOV_MAX = max(16, min(_os.sysconf("SC_IOV_MAX"), 1024))
except (AttributeError, ValueError, OSError):
    _IOV_MAX = 16


def vectored_io_available() -> bool:
    """Whether this platform has what the vectored arena needs (memfd, preadv, pwritev)."""
    return all(hasattr(_os, f) for f in ("memfd_create", "preadv", "pwritev"))


def copy_list(offset: int, views) -> tuple:
    """Byte ``views`` laid end to end in the arena from ``offset``, as ``(offset, views, nbytes,
    held)`` groups small enough for one ``preadv``/``pwritev`` each; ``held`` is the group as a
    C ``BufferList`` where :mod:`mpisync._runtime.speedups` has the C loops, else ``None``."""
    groups, position = [], offset
    views = [v for v in views if v.nbytes]
    for start in range(0, len(views), _IOV_MAX):
        group = tuple(views[start : start + _IOV_MAX])
        nbytes = sum(v.nbytes for v in group)
        groups.append(
            (
                position,
                group,
                nbytes,
                loops.BufferList(group) if compiled_lists else None,
            )
        )
        position += nbytes
    return tuple(groups)


def part_copies(offset: int, held, first: int, last: int) -> tuple:
    """Copy groups for buffers ``first:last`` of ``held`` (a ``BufferList``) laid end to end in the
    arena from ``offset``: the C list's part as one group, or the Python list's buffers as
    :func:`copy_list` groups (the kernel's or Python's copies)."""
    part = held.part(first, last)
    if getattr(part, "compiled", False):
        return ((offset, (), part.nbytes, part),)
    return copy_list(offset, part.views)


def check_copier(held, arena, what: str) -> None:
    """``ValueError`` unless ``arena`` copies the parts of ``held`` (a ``BufferList`` or None):
    a C list's parts carry no buffers of their own, so only an arena with the C loops copies
    them."""
    if held is not None and getattr(held, "compiled", False) and not arena.compiled:
        raise ValueError(f"{what}: C buffer lists need an arena that copies with their loops")


class Arena:
    """``nbytes`` of fusion buffer; ``view`` is the byte memoryview MPI sends from and receives
    into.

    ``vectored=False`` forces the portable Python copy loop and
    ``compiled=False`` leaves the C loops out (tests use them to check every
    path gives the same bytes).
    """

    _fd: int | None  # the memory file, when the arena is one

    def __init__(self, nbytes: int, *, vectored: bool | None = None, compiled: bool | None = None):
        self.nbytes = nbytes
        self._fd, self._base = None, 0
        self._compiled = compiled is not False
        mapping = None
        if nbytes and (vectored_io_available() if vectored is None else vectored):
            try:
                fd = _os.memfd_create("mpisync-fusion", getattr(_os, "MFD_CLOEXEC", 0))
            except OSError:  # sandboxes may forbid memfd: fall back to the loop
                fd = None
            if fd is not None:
                try:
                    _os.ftruncate(fd, nbytes)
                    # out of memory fails here, not as SIGBUS later
                    if hasattr(_os, "posix_fallocate"):
                        _os.posix_fallocate(fd, 0, nbytes)
                    mapping = _mmap.mmap(fd, nbytes)
                except OSError:
                    _os.close(fd)
                else:
                    self._adopt(fd)
        memory = mapping if mapping is not None else _np.empty(nbytes, dtype=_np.uint8)
        # ignore[arg-type]: numpy's stubs declare ndarray's buffer protocol for Python >= 3.12 only
        self.view = memoryview(memory).cast("B")  # type: ignore[arg-type]

    @classmethod
    def over(cls, fd: int, mapping, offset: int, nbytes: int) -> Arena:
        """An arena on ``nbytes`` of an open file mapped as ``mapping``, from byte ``offset``.

        The arena takes ``fd`` over and closes it when it is garbage.
        """
        arena = cls.__new__(cls)
        arena.nbytes, arena._fd, arena._base, arena._compiled = nbytes, None, offset, True
        arena._adopt(fd)
        arena.view = memoryview(mapping).cast("B")[offset : offset + nbytes]
        return arena

    def _adopt(self, fd: int) -> None:
        self._fd = fd
        _weakref.finalize(self, _os.close, fd)

    @property
    def compiled(self) -> bool:
        """Whether copy groups that carry a C ``BufferList`` are copied by it (see
        :func:`copy_list`)."""
        return self._compiled

    @property
    def mapped(self) -> bool:
        """Whether the arena is a memory mapping (a memory file) rather than plain process
        memory."""
        return self._fd is not None

    @property
    def vectored(self) -> bool:
        """Whether packing and unpacking use one system call per group of buffers."""
        return self._fd is not None

    def __len__(self) -> int:
        return self.nbytes

    def gather(self, copies: tuple) -> None:
        """Copy the buffers of ``copies`` (from :func:`copy_list`) into the arena."""
        fd, base, compiled = self._fd, self._base, self._compiled
        for offset, group, nbytes, held in copies:
            if compiled and held is not None:
                held.gather(self.view, offset)
            elif fd is None or _os.pwritev(fd, group, base + offset) != nbytes:
                self._loop_gather(offset, group)

    def scatter(self, copies: tuple) -> None:
        """Fill the buffers of ``copies`` (from :func:`copy_list`) from the arena."""
        fd, base, compiled = self._fd, self._base, self._compiled
        for offset, group, nbytes, held in copies:
            if compiled and held is not None:
                held.scatter(self.view, offset)
            elif fd is None or _os.preadv(fd, group, base + offset) != nbytes:
                self._loop_scatter(offset, group)

    def _loop_gather(self, offset: int, group: tuple) -> None:
        view = self.view
        for buffer in group:
            end = offset + buffer.nbytes
            view[offset:end] = buffer
            offset = end

    def _loop_scatter(self, offset: int, group: tuple) -> None:
        view = self.view
        for buffer in group:
            end = offset + buffer.nbytes
            buffer[:] = view[offset:end]
            offset = end
