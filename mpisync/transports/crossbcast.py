"""Broadcasts of large host arrays between the ranks of one node, by cross-memory attach.

The first collective publishes every rank's array (its address and size). Root then writes the
first part of every receiver's array (``process_vm_writev``) while each receiver reads the rest
from root's (``process_vm_readv``), so root's core and the receivers' share the copies: root's
part is :data:`~.cma.ROOT_SHARE` of an even split, as in the parameter broadcast's cross-memory
copies (docs/performance.md). The second collective says every copy is done, so root's array is not
handed back while a receiver still reads it, nor a receiver's while root still writes into it.
Nobody writes root's array; root and a receiver write disjoint parts of the receiver's. Each
byte crosses between processes once, with no MPI data movement. The copies are the parameter
broadcast's (:func:`~.cma.split_batches`), for one array.

The probe and the switch are :mod:`.crossreduce`'s (one per communicator): sizes that differ
raise :class:`~.crossreduce.CrossReduceError` on every rank before any byte is copied; a copy
that fails raises it on every rank at the second collective (the receivers' arrays hold partial
bytes), and turns the path off for the communicator.
"""

from __future__ import annotations

import typing as _typing

import numpy as _np

from .cma import ROOT_SHARE, Copies, split_batches
from .crossreduce import opened_published
from .kept import Step

__all__ = ["bcast_steps", "root_part"]


def root_part(nbytes: int, size: int) -> int:
    """The bytes at the start of each receiver's array that root writes (the receiver reads the
    rest), the same on every rank."""
    return int(nbytes * ROOT_SHARE / size)


def bcast_steps(comm, array, root: int, last: bool = True) -> _typing.Generator[Step, None, bool]:
    """The steps copying root's ``array`` (C-contiguous, as many bytes on every rank) into every
    rank's ``array`` by cross-memory, after the probe of ``comm``'s pairs on its first call; the
    second step's ``last`` is ``last``. Returns False, having posted at most the probe, where the
    path is not open (the same answer on every rank). Raises
    :class:`~.crossreduce.CrossReduceError` on every rank when the sizes differ (nothing copied)
    or a copy failed anywhere (the path is then off)."""
    flat = array.reshape(-1)
    opening = yield from opened_published(comm, [flat], "arrays", "broadcast")
    if opening is None:
        return False
    cross, addresses = opening
    rank, size, nbytes = comm.rank, comm.size, array.nbytes
    mine = _np.array([[flat.ctypes.data, nbytes]], dtype=_np.int64)
    table = _np.stack([addresses, _np.full_like(addresses, nbytes)], axis=-1)
    batches = split_batches(rank, root, cross.pids, mine, table, root_part(nbytes, size))
    ok = Copies.run_batches(batches)
    yield from cross.settled(
        comm, ok, last, "broadcast", "the receivers' arrays hold partial bytes"
    )
    return True
