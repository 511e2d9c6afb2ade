"""All-gathers of large host arrays between the ranks of one node, by cross-memory attach.

The first collective publishes every rank's input (its address and size); each rank then reads
every peer's input straight into its own output (``process_vm_readv``), peer ``rank + 1`` first so
that the ranks read from different peers at once, and copies its own input into its own block
unless it is already there. The second collective says every rank is done reading, so no input
is handed back while a peer still reads it. A rank writes only its own output and reads only its
peers' inputs, which nobody writes during the call; each byte crosses between processes once, with
no MPI data movement, straight into outputs that need not lie in one buffer (the backend's list
form; MPI's all-gather writes one buffer, which the outputs were then copied from).

The probe and the switch are :mod:`.crossreduce`'s (one per communicator, for both): sizes that
differ raise :class:`~.crossreduce.CrossReduceError` on every rank before any byte is copied; a
copy that fails raises it on every rank at the second collective (the outputs hold partial
blocks), and turns the path off for the communicator.
"""

from __future__ import annotations

import typing as _typing

import numpy as _np

from .cma import iovecs, iovecs_at, transfer
from .crossreduce import opened_published
from .kept import Step

__all__ = ["gather_steps"]


def gather_steps(
    comm, send, blocks: list, last: bool = True
) -> _typing.Generator[Step, None, bool]:
    """The steps gathering every rank's ``send`` (a C-contiguous array, as many bytes on every
    rank) into this rank's ``blocks`` (one C-contiguous array per rank, of ``send``'s bytes;
    ``blocks[comm.rank]`` may be ``send`` itself) by cross-memory, after the probe of ``comm``'s
    pairs on its first call; the second step's ``last`` is ``last``. Returns False, having posted
    at most the probe, where the path is not open (the same answer on every rank). Raises
    :class:`~.crossreduce.CrossReduceError` on every rank when the sizes differ (nothing copied)
    or a copy failed anywhere (the path is then off)."""
    opening = yield from opened_published(comm, [send], "inputs", "all-gather")
    if opening is None:
        return False
    cross, addresses = opening
    rank, size, nbytes = comm.rank, comm.size, send.nbytes
    ok = True
    for step in range(1, size):
        peer = (rank + step) % size
        remote = iovecs_at([(int(addresses[peer, 0]), nbytes)])
        if nbytes and transfer(0, cross.pids[peer], iovecs([blocks[peer]]), remote) != nbytes:
            ok = False
            break
    own = blocks[rank]
    if ok and own.ctypes.data != send.ctypes.data:
        own.reshape(-1).view(_np.uint8)[...] = send.reshape(-1).view(_np.uint8)
    yield from cross.settled(comm, ok, last, "all-gather", "the outputs hold partial blocks")
    return True
