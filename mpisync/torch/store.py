"""The store torch gets from ``mpisync.torch.init_process_group`` with the ``"mpisync"`` backend
alone: in-process, since mpisync's groups rendezvous through MPI and never use it.

Another backend's group made later on the default store (``new_group(backend="gloo")``)
rendezvouses through it: each rank sets its own key, then waits for its peers' keys, which
only the peers' processes could set. A plain ``HashStore`` waits out that wait with no error
(past a minute, whatever the group's timeout). :class:`LocalStore` raises at once instead,
on every rank (each one waits for a key of a peer) and with the same message, naming the two
starts that work.
"""

from __future__ import annotations

import datetime as _datetime

import torch.distributed as dist

from ..errors import InvalidParamError

__all__ = ["LocalStore"]

# torch holds the store through the C++ object only: a Python subclass must stay referenced
# here, or its methods are gone when torch calls them ("Not implemented").
_KEPT: list = []


class LocalStore(dist.Store):
    """A ``HashStore`` whose ``get`` and ``wait`` of a key that no one set raise
    :class:`~mpisync.errors.InvalidParamError` (only another process could set it) instead of
    waiting."""

    def __init__(self) -> None:
        super().__init__()
        self._keys = dist.HashStore()
        _KEPT.append(self)

    def _present(self, keys: list) -> None:
        missing = [k for k in keys if not self._keys.check([k])]
        if missing:
            raise InvalidParamError(
                "mpisync: torch waits for a store key that only another process could set: "
                "mpisync.torch.init_process_group() with the 'mpisync' backend alone "
                "gives torch an in-process store, on which another backend's group (gloo, nccl) "
                "cannot rendezvous. Start with a mixed backend string such as "
                "backend='cpu:mpisync,cuda:gloo', or with torch.distributed.init_process_group("
                "'mpisync') (env:// through MPI); both serve a TCP store"
            )

    def set(self, key: str, value) -> None:
        """Set ``key`` to ``value``."""
        self._keys.set(key, value)

    def get(self, key: str) -> bytes:
        """The value of ``key``; raises where no one set it (see the module)."""
        self._present([key])
        return self._keys.get(key)

    def add(self, key: str, value: int) -> int:
        """Add ``value`` to the counter ``key``; its new value."""
        return self._keys.add(key, value)

    def compare_set(self, key: str, expected, desired) -> bytes:
        """Set ``key`` to ``desired`` where it holds ``expected``; its value afterwards."""
        return self._keys.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; whether it was there."""
        return self._keys.delete_key(key)

    def num_keys(self) -> int:
        """How many keys the store holds."""
        return self._keys.num_keys()

    def check(self, keys: list) -> bool:
        """Whether every key of ``keys`` is set."""
        return self._keys.check(keys)

    def wait(self, keys: list, timeout: _datetime.timedelta | None = None) -> None:
        """Return once every key of ``keys`` is set: at once, or raise (see the module)."""
        self._present(keys)

    def clone(self) -> LocalStore:
        """This store (one process holds it: every handle sees the same keys)."""
        return self
