"""What a transport keeps on a communicator, and the shape of the collective steps its operations
yield."""

from __future__ import annotations

import typing as _typing

from mpi4py import MPI

__all__ = ["Step", "kept_on"]

#: ``(requests, last)``: what a step posts, and whether it is the operation's last collective.
Step = tuple[list, bool]

_T = _typing.TypeVar("_T")
_KEYVALS: dict[str, int] = {}


def kept_on(comm, owner: str, make: _typing.Callable[[], _T]) -> _T:
    """``owner``'s state on ``comm``: an MPI attribute (dropped with the communicator, never
    copied to a duplicate), made by ``make()`` on the first call for that pair."""
    keyval = _KEYVALS.get(owner)
    if keyval is None:
        keyval = _KEYVALS[owner] = MPI.Comm.Create_keyval()
    held = comm.Get_attr(keyval)
    if held is None:
        held = make()
        comm.Set_attr(keyval, held)
    return held
