"""Mixed backend strings: ``"cpu:mpisync,cuda:nccl"``, as torch's documentation writes them.

torch walks a group's ``device:backend`` pairs in order and stops at the first backend whose
creator returns a whole ``ProcessGroup`` (a backend written in Python cannot be anything else:
torch's ``Backend`` binding has no constructor a Python class can call). So the mpisync group
creates the other pairs' backends itself, the way torch creates them (gloo, nccl, or another
registered backend), registers them on itself, and hands each operation whose tensors are on such
a device to that device's backend (:func:`routed`).

The pairs are read from torch's own group creation (``_new_process_group_helper``'s
``backend_config``), the one place they are known when the creator runs.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as _np
import torch
import torch.distributed as dist
from mpi4py import MPI

from .._runtime.ring import wait_request
from .errors import ArgumentError
from .work import hold, release

__all__ = ["other_backends", "routed", "untraced"]

_HELPER = "_new_process_group_helper"
_TORCH_MODULE = "torch.distributed.distributed_c10d"
_NAME = "mpisync"


def _creation_frame():
    """torch's group-creation frame that called the backend's creator, or None."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == _HELPER and frame.f_globals.get("__name__") == _TORCH_MODULE:
            return frame
        frame = frame.f_back
    return None


def other_backends(options, comm, deadline: float | None) -> dict[str, Any]:
    """The backends of the other ``device:backend`` pairs of the group being created (device type
    -> torch ``Backend``), created as torch creates them; empty for a plain ``"mpisync"``. A pair
    that some rank of ``comm`` cannot create (gloo or nccl not built into this torch, another
    backend not registered) is the same :class:`~mpisync.torch.errors.ArgumentError` on every
    rank, before any is created (an all-reduce on ``comm``, waited for until ``deadline``)."""
    frame = _creation_frame()
    config = frame.f_locals.get("backend_config") if frame is not None else None
    if config is None:
        return {}
    pairs = {device: str(name).lower() for device, name in config.get_device_backend_map().items()}
    wanted = {device: name for device, name in pairs.items() if name != _NAME}
    if not wanted:
        return {}
    made = frame.f_locals.get("pg")  # the pairs torch created before reaching mpisync's
    _agree_available(wanted, comm, deadline)
    store = options.store.underlying_store  # the group's store, under the "<device>/" prefixes
    return {
        device: _existing(made, device) or _create(name, device, store, options)
        for device, name in wanted.items()
    }


def _agree_available(wanted: dict, comm, deadline: float | None) -> None:
    from torch.distributed.distributed_c10d import Backend

    built = {Backend.GLOO: dist.is_gloo_available(), Backend.NCCL: dist.is_nccl_available()}
    missing = [
        f"{device}:{name}"
        for device, name in wanted.items()
        if not built.get(name, name.upper() in Backend._plugins)
    ]
    flags = _np.zeros(comm.size, _np.int64)
    flags[comm.rank] = bool(missing)
    wait_request(comm.Iallreduce(MPI.IN_PLACE, flags, MPI.MAX), deadline, comm)
    if flags.any():
        ranks = ", ".join(str(r) for r in _np.flatnonzero(flags))
        raise ArgumentError(
            f"mpisync: rank(s) {ranks} cannot create the backend string's other pairs"
            + (f" ({', '.join(missing)} here)" if missing else "")
            + ": mpisync creates gloo, nccl (where this torch has them) and registered backends "
            "beside its group; nothing was created"
        )


def _existing(group, device: str):
    if group is None:
        return None
    try:
        return group._get_backend(torch.device(device))
    except RuntimeError:
        return None


def _create(name: str, device: str, store, options):
    from torch.distributed.distributed_c10d import Backend, _DistributedBackendOptions

    prefixed = dist.PrefixStore(f"{device}/", store)
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    ranks, group = list(options.global_ranks_in_group or []), options.group_id
    if name == Backend.GLOO:
        backend = dist.ProcessGroupGloo(prefixed, rank, size, timeout=timeout)
        _describe(backend.options, ranks, group)
        _number(backend)
        return backend
    if name == Backend.NCCL:
        from torch.distributed import ProcessGroupNCCL

        nccl_options = ProcessGroupNCCL.Options()
        nccl_options.is_high_priority_stream = False
        nccl_options._timeout = timeout
        _describe(nccl_options, ranks, group)
        nccl = ProcessGroupNCCL(prefixed, rank, size, nccl_options)
        _number(nccl)
        return nccl
    plugin = Backend._plugins[name.upper()]  # _agree_available saw it registered
    if not plugin.extended_api:
        return plugin.creator_fn(prefixed, rank, size, timeout)
    given = _DistributedBackendOptions()
    given.store, given.group_rank, given.group_size = prefixed, rank, size
    given.timeout, given.group_id, given.global_ranks_in_group = timeout, group, ranks
    return plugin.creator_fn(given, None)


def _describe(options, ranks: list, group: str) -> None:
    """The group's ranks and name on a torch backend's options, as torch's own creation sets
    them, where this torch's options have those fields (2.4's and 2.5's gloo options have
    neither)."""
    for field, value in (("global_ranks_in_group", ranks), ("group_name", group)):
        if hasattr(options, field):
            setattr(options, field, value)


def _number(backend) -> None:
    """Set the backend's sequence number for the group, as torch's creation does, where this
    torch's backend has that method."""
    number = getattr(backend, "_set_sequence_number_for_group", None)
    if number is not None:
        number()


# -- routing: the group's method -> (the same operation on torch's Backend, or the single form
# each pair goes through, as one work, where torch's Backend binding has no coalesced form)
_ROUTES: dict[str, tuple[str | None, str | None]] = {
    **{
        name: (name, None)
        for name in (
            "allreduce",
            "allreduce_coalesced",
            "reduce",
            "broadcast",
            "allgather",
            "allgather_coalesced",
            "gather",
            "scatter",
            "reduce_scatter",
            "alltoall",
            "send",
            "recv",
            "recv_anysource",
            "_allgather_base",
            "_reduce_scatter_base",
            "alltoall_base",
        )
    },
    "all_gather_single": ("_allgather_base", None),
    "reduce_scatter_single": ("_reduce_scatter_base", None),
    "all_to_all_single": ("alltoall_base", None),
    "all_gather_single_coalesced": (None, "_allgather_base"),
    "allgather_into_tensor_coalesced": (None, "_allgather_base"),
    "reduce_scatter_single_coalesced": (None, "_reduce_scatter_base"),
    "reduce_scatter_tensor_coalesced": (None, "_reduce_scatter_base"),
}


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _pairwise(backend, single: str, outputs, inputs, opts=None):
    extra = () if opts is None else (opts,)
    works = [getattr(backend, single)(out, inp, *extra) for out, inp in zip(outputs, inputs)]
    return _Joined(works)


class _Joined(dist._Work):
    """One torch work that completes when every one of ``works`` has (torch's gloo works carry
    no future to collect); held for torch's C++ as :class:`~mpisync.torch.work.Work` is."""

    def __init__(self, works: list):
        super().__init__()
        self._works = works
        hold(self)

    def wait(self, timeout=None) -> bool:
        for work in self._works:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        release(self)
        return True

    def _finished(self) -> bool:
        return self.is_completed()

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def exception(self):
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)

    def result(self) -> list:
        return [tensor for work in self._works for tensor in work.result()]


def _forward(method, target: str | None, pairwise: str | None):
    @functools.wraps(method)
    def forward(self, *args, **kwargs):
        others = self._others
        if others:
            tensor = _first_tensor(args[:2])
            backend = others.get(tensor.device.type) if tensor is not None else None
            if backend is not None:
                if pairwise is not None:
                    return _pairwise(backend, pairwise, *args, **kwargs)
                return getattr(backend, target)(*args, **kwargs)  # type: ignore[arg-type]
        return method(self, *args, **kwargs)

    return forward


def _coalescing(method):
    # torch's Backend coalesces without a device argument (and refuses where it cannot, as it
    # does in a group of its own)
    @functools.wraps(method)
    def forward(self, device):
        backend = self._others.get(torch.device(device).type) if self._others else None
        if backend is None:
            return method(self, device)
        return getattr(backend, method.__name__)()

    return forward


def routed(cls):
    """Class decorator: each collective of ``cls`` goes to the backend of its tensors' device
    when ``self._others`` holds one (a mixed backend string), else runs as written; and none is
    traced by ``torch.compile`` (:func:`untraced`)."""
    for name, (target, single) in _ROUTES.items():
        setattr(cls, name, untraced(_forward(getattr(cls, name), target, single)))
    for name in ("_start_coalescing", "_end_coalescing"):
        setattr(cls, name, untraced(_coalescing(getattr(cls, name))))
    return cls


def untraced(method):
    """``method``, never traced by ``torch.compile``: torch's C++ (DDP's reducer rebuilding its
    buckets inside a compiled forward) calls the group's Python methods while Dynamo evaluates
    frames, and Dynamo cannot follow a ``ProcessGroup`` subclass's own attributes. The
    collective runs eagerly, as a C++ backend's does. Where torch has no ``torch.compiler``
    (before 2.1), ``method`` as it is."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(method) if disable is not None else method
