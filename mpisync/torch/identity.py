"""What torch reads of a process group about itself: its backend's name, rank, size, name and
description, and the backend serving each device."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["Identity", "backend_type"]


class Identity:
    """torch's identity accessors of :class:`~mpisync.torch.ProcessGroupMPISync`, over its
    ``_rank``, ``_size``, ``_name``, ``_desc`` and ``_others`` (the backends of a mixed backend
    string, by device type). torch calls them, users do not: they are private to the manual
    (``:meta private:``)."""

    _rank: int
    _size: int
    _name: str
    _desc: str
    _others: dict

    def getBackendName(self) -> str:  # noqa: N802 (torch's names)
        """The backend's name, ``"mpisync"``.

        :meta private: (torch calls it)
        """
        return "mpisync"

    def getRank(self) -> int:  # noqa: N802
        """:meta private: this process's rank in the group (torch calls it)."""
        return self._rank

    def getSize(self) -> int:  # noqa: N802
        """:meta private: the number of ranks in the group (torch calls it)."""
        return self._size

    def setGroupName(self, name: str) -> None:  # noqa: N802
        """:meta private: torch calls it when it registers the group."""
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        """:meta private: the name torch gave the group (``group_name``) (torch calls it)."""
        return self._name

    # torch's group creation names a group through ``_set_group_name``/``_set_group_desc``, and
    # reads ``group_name``/``group_desc``. Where C++ forwards those to the accessors above (2.13)
    # the overrides below change nothing; where it reads the name from the group's C++ backends
    # instead (2.4, 2.5: "ProcessGroup name not set"; a Python group has none), they keep the
    # name here. ``_set_*`` still runs torch's own, which names a mixed string's backends.
    def _set_group_name(self, name) -> None:
        """:meta private: torch calls it when it registers the group."""
        _also_in_torch(self, "_set_group_name", name)
        self.setGroupName(str(name))

    def _set_group_desc(self, desc) -> None:
        """:meta private: torch calls it when it registers the group."""
        _also_in_torch(self, "_set_group_desc", desc)
        self.setGroupDesc(str(desc))

    @property
    def group_name(self) -> str:
        """:meta private: the name torch gave the group (torch reads it)."""
        return self._name

    @property
    def group_desc(self) -> str:
        """:meta private: the description torch gave the group (torch reads it)."""
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        """:meta private: torch calls it when it registers the group."""
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        """:meta private: the description torch gave the group (``group_desc``) (torch calls it)."""
        return self._desc

    # torch asks a group for its backend per device (dcp.async_save wants a CPU one; object
    # collectives pick their device): this group is its own backend for every device it serves,
    # except those a mixed backend string gave to another backend.
    @property
    def _device_types(self) -> list:
        """The devices whose tensors this group's collectives take: CPU, CUDA where torch sees a
        GPU (the device path), and the devices of a mixed backend string's other backends."""
        kinds = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        kinds += [kind for kind in self._others if kind not in kinds]
        return [torch.device(kind) for kind in kinds]

    # torch types it as returning a Backend; the callers use what a group has too
    def _get_backend(self, device):
        """The backend serving ``device``'s tensors: another backend where a mixed backend
        string named one for that device, else this group itself."""
        kind = device.type if isinstance(device, torch.device) else torch.device(device).type
        if kind in self._others:
            return self._others[kind]
        if kind not in ("cpu", "cuda"):
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    @property
    def supports_splitting(self) -> bool:
        """``split_group`` of this backend: no (``new_group`` makes subgroups)."""
        return False

    def __repr__(self) -> str:
        return f"ProcessGroupMPISync(rank={self._rank}, size={self._size}, name={self._name!r})"


def _also_in_torch(group, name: str, value) -> None:
    """torch's own ``ProcessGroup`` method ``name`` on ``group``, where this torch has it."""
    method = getattr(dist.ProcessGroup, name, None)
    if method is not None:
        method(group, value)


def backend_type(backend) -> dist.ProcessGroup.BackendType:
    """torch's type of a backend made for a mixed backend string."""
    kinds = {"gloo": "GLOO", "nccl": "NCCL"}
    return getattr(dist.ProcessGroup.BackendType, kinds.get(backend.name(), "CUSTOM"))
