"""Registration of the ``"mpisync"`` backend with torch.distributed, ``init_process_group``, and
torch's ``env://`` rendezvous under an MPI launcher."""

from __future__ import annotations

import datetime as _datetime
import os as _os
import socket as _socket
import time as _time
import urllib.parse as _urlparse
from typing import Any

import numpy as _np
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.constants import default_pg_timeout as _default_pg_timeout

from .. import config as _config
from .._runtime.launch import check_launch
from .._runtime.ring import Expired, wait_request
from .._runtime.timeouts import timed_out
from ..errors import InvalidParamError
from .communicators import GroupTimeoutError, duplicates, members_communicator
from .compat import require
from .errors import ArgumentError, MismatchError
from .mixed import other_backends
from .process_group import ProcessGroupMPISync
from .store import LocalStore
from .work import seconds

__all__ = ["BACKEND_NAME", "init_process_group"]

# The name the backend is registered under with torch.distributed.
BACKEND_NAME = "mpisync"

# The communicator the next default group is made over (init_process_group sets it; torch's own
# rendezvous leaves it None: MPI.COMM_WORLD), and the timeout init_process_group was given.
_base_comm = None
_timeout_override: float | None = None
# The default mpisync group's duplicate of the base communicator, on which its subgroups are
# made (None while there is no mpisync default group: then MPI.COMM_WORLD).
_parent = None


def _group_timeout(options) -> float | None:
    """The group's timeout: ``init_process_group``'s, else torch's ``timeout`` unless it is torch's
    default (then ``MPISYNC_TIMEOUT``, else mpisync's default applies)."""
    if _timeout_override is not None:
        return _timeout_override
    given = getattr(options, "timeout", None)
    if given is None or given == _default_pg_timeout:
        return None
    return seconds(given)


def _creation_starts(comm) -> None:
    """Every creation of an mpisync process group starts here, before anything collective: a
    world of one process while the launcher's environment says more is refused (the launch
    check, :func:`mpisync._runtime.launch.check_launch`)."""
    check_launch(comm)


def _create(options, _backend_options) -> ProcessGroupMPISync:
    """torch's creator (extended API): the default group over the base communicator, or a group
    of ``options.global_ranks_in_group`` (``new_group``), each on its own communicator made within
    the group's timeout, checked against the rank and size torch expects."""
    global _parent
    base = _base_comm if _base_comm is not None else MPI.COMM_WORLD
    _creation_starts(base)
    timeout = _group_timeout(options)
    # A refusal found here is agreed by the group's creation (every rank raises it), never raised
    # on this rank alone while the others wait for it.
    limit, refusal = _creation_limit(timeout)
    members = list(options.global_ranks_in_group or [])
    if not members:  # the default group: every rank of the base communicator
        refusal = refusal or _place_problem(base.rank, base.size, options)
        comm, p2p, parent = duplicates(base, 3, limit, "the default process group")
        others = _others_or_free(options, comm, limit, (comm, p2p, parent))
        made = _made(
            comm,
            others,
            (parent,),
            timeout=timeout,
            adopt=True,
            p2p=p2p,
            on_shutdown=lambda broken: _retire(parent, broken),
            _refusal=refusal,
        )
        _parent = parent
        return made
    parent = _parent if _parent is not None else MPI.COMM_WORLD
    comm = members_communicator(parent, members, f"'{options.group_id}'", limit)
    refusal = refusal or _place_problem(comm.rank, comm.size, options)
    others = _others_or_free(options, comm, limit, (comm,))
    return _made(comm, others, (), timeout=timeout, adopt=True, _refusal=refusal)


def _made(comm, others: dict, extra: tuple, **kwargs) -> ProcessGroupMPISync:
    """The group over ``comm``; where its creation is refused (on every rank), the other
    backends made for it are shut down and the ``extra`` communicators freed."""
    try:
        return ProcessGroupMPISync(comm, others=others, **kwargs)
    except (InvalidParamError, MismatchError):
        for backend in others.values():
            backend.shutdown()
        for communicator in extra:
            communicator.Free()
        raise


def _creation_limit(timeout: float | None) -> tuple:
    """``(seconds, refusal)``: the group's creation timeout, and why this rank's settings cannot
    be read (None if they can; the built-in timeout then bounds the creation)."""
    try:
        return _config.resolve(timeout=timeout).timeout.value, None
    except InvalidParamError as exc:
        return _config.BUILTIN_DEFAULTS["timeout"], str(exc)


def _others_or_free(options, comm, limit: float | None, made: tuple) -> dict:
    """The other backends of a mixed backend string (:func:`mixed.other_backends`, agreed within
    ``limit`` seconds); the communicators ``made`` for the group are freed when they cannot be
    created."""
    deadline = None if limit is None else _time.monotonic() + limit
    try:
        return other_backends(options, comm, deadline)
    except Expired:
        what = "the backend string's other pairs"
        timed_out(comm, f"agreement on {what}", [what], limit, call="init_process_group")
        raise
    except ArgumentError:
        for communicator in made:
            communicator.Free()
        raise


def _place_problem(rank: int, size: int, options) -> str | None:
    if (rank, size) != (options.group_rank, options.group_size):
        return (
            f"mpisync backend: torch expects rank {options.group_rank} of {options.group_size}, "
            f"but this process is rank {rank} of {size} in MPI; launch with mpiexec/srun and let "
            "mpisync.torch.init_process_group() take rank and size from MPI"
        )
    return None


def _retire(parent, broken: bool) -> None:
    """The default group is gone: so is the communicator its subgroups were made on."""
    global _parent
    if _parent is parent:
        _parent = None
    if not broken:
        parent.Free()


def _register() -> None:
    require()
    if not _registered(dist.Backend):
        dist.Backend.register_backend(
            BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"]
        )
    _without_flight_recorder()


def _registered(backend) -> bool:
    """Whether ``"mpisync"`` is registered with torch: in its table of plugins, or, where torch
    has none of that name, among the names it knows."""
    plugins = getattr(backend, "_plugins", None)
    if isinstance(plugins, dict):
        return BACKEND_NAME.upper() in plugins
    return BACKEND_NAME in getattr(backend, "backend_list", ())


def _without_flight_recorder() -> None:
    """torch 2.15 attaches its flight recorder's hook to every new group unless each of the
    group's backends records by itself (the names in ``_FR_SELF_RECORDING_BACKENDS``); the hook
    needs a C++ backend registered on the group, which a group written in Python has not, and the
    group's creation fails. mpisync's groups keep their own record (``MPISYNC_TIMELINE``), so the
    name goes in that set. Earlier releases have no such set and attach no hook."""
    from torch.distributed import distributed_c10d as _c10d

    recording = getattr(_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(recording, set):
        recording.add(BACKEND_NAME)


def init_process_group(comm: MPI.Intracomm | None = None, **kwargs: Any) -> None:
    """Initialise torch's default process group on the ``"mpisync"`` backend over ``comm``.

    Collective over ``comm``. Rank and size come from MPI; the store is an
    in-process one (nothing else rendezvouses), so no ``MASTER_ADDR``, ``RANK``
    or ``WORLD_SIZE`` is needed; a gloo or NCCL group made on it later raises
    ``InvalidParamError`` on every rank (start with a mixed string for those).
    ``torch.distributed.init_process_group("mpisync")`` with torch's own
    rendezvous works too.

    Args:
        comm: The intracommunicator whose ranks form the group (default ``MPI.COMM_WORLD``);
            torch's ranks are its ranks.
        **kwargs: Passed to ``torch.distributed.init_process_group``. ``timeout`` (a
            ``timedelta`` or seconds) bounds the group's creation and every operation on it
            (default ``MPISYNC_TIMEOUT``, else 300 s). ``backend`` may be a mixed string such
            as ``"cpu:mpisync,cuda:nccl"``: the other backends then rendezvous through a TCP
            store that rank 0 serves (its address sent through MPI). ``rank`` and
            ``world_size`` are refused.

    Raises:
        InvalidParamError: ``backend`` names no mpisync part; ``rank`` or ``world_size`` is
            given; torch expects another rank or size than MPI's; or this process is alone in
            its MPI world while its launcher started more (the message names the fix).
        ArgumentError: A mixed backend string names a pair mpisync cannot create.
        MismatchError: The ranks' mpisync settings (``MPISYNC_*`` that change what travels)
            differ; raised on every rank.
        GroupTimeoutError: A rank did not join within the timeout (torch's ``env://``
            rendezvous through MPI).
        SyncTimeoutError: The group's communicators were not created within the timeout; by
            default the job is aborted after the diagnostic (``MPISYNC_TIMEOUT_ABORT=0`` raises
            instead).

    Example::

        import mpisync.torch
        mpisync.torch.init_process_group(timeout=60)
        model = torch.nn.parallel.DistributedDataParallel(model)
    """
    global _base_comm, _timeout_override
    comm = MPI.COMM_WORLD if comm is None else comm
    backend = str(kwargs.pop("backend", None) or BACKEND_NAME)
    if BACKEND_NAME not in backend.lower():
        raise InvalidParamError(
            f"mpisync.torch.init_process_group makes an mpisync group; backend={backend!r} names "
            "no mpisync part (use 'mpisync', or a mixed string such as 'cpu:mpisync,cuda:nccl')"
        )
    if "rank" in kwargs or "world_size" in kwargs:
        raise InvalidParamError(
            "mpisync.torch.init_process_group takes rank and size from MPI; "
            "pass neither rank nor world_size"
        )
    _base_comm, _timeout_override = comm, seconds(kwargs.get("timeout"))
    if _timeout_override is not None:  # torch takes a timedelta only; seconds are accepted here
        kwargs["timeout"] = _datetime.timedelta(seconds=_timeout_override)
    if "store" not in kwargs and "init_method" not in kwargs:
        alone = backend.lower() == BACKEND_NAME
        waited = kwargs.get("timeout", _default_pg_timeout)
        kwargs["store"] = LocalStore() if alone else _mpi_rendezvous(waited, comm)[0]
    try:
        dist.init_process_group(backend, rank=comm.rank, world_size=comm.size, **kwargs)
    finally:
        _timeout_override = None


# -- torch's env:// rendezvous under an MPI launcher --------------------------------------------
def _given(url: str, name: str) -> bool:
    query = _urlparse.parse_qs(_urlparse.urlparse(url).query)
    return name.lower() in query or name in _os.environ


def _env_with_mpi(original):
    """torch's ``env://`` handler, except that when neither ``RANK`` nor ``WORLD_SIZE`` is given
    (``mpiexec`` and ``srun`` set neither) rank and size come from ``MPI.COMM_WORLD`` and rank 0
    serves the store (its port sent to the others through MPI)."""

    def handler(url, timeout=_default_pg_timeout, **kwargs):
        if _given(url, "RANK") or _given(url, "WORLD_SIZE"):
            yield from original(url, timeout=timeout, **kwargs)
            return
        yield _mpi_rendezvous(timeout, MPI.COMM_WORLD)

    handler.mpisync = True  # type: ignore[attr-defined]
    return handler


def _mpi_rendezvous(timeout: _datetime.timedelta, comm) -> tuple:
    if comm.size == 1:
        return dist.HashStore(), 0, 1
    host = _os.environ.get("MASTER_ADDR") or _socket.gethostname()
    message = _np.zeros(264, dtype=_np.uint8)  # port (int64), then rank 0's host name
    store = None
    if comm.rank == 0:
        port = int(_os.environ.get("MASTER_PORT", "0"))
        store = dist.TCPStore(host, port, comm.size, True, timeout=timeout, wait_for_workers=False)
        name = host.encode()[:256]
        message[:8] = _np.frombuffer(_np.int64(store.port).tobytes(), _np.uint8)
        message[8 : 8 + len(name)] = _np.frombuffer(name, _np.uint8)
    request = comm.Ibcast(message, 0)
    try:
        wait_request(request, _time.monotonic() + timeout.total_seconds())
    except Expired:
        raise GroupTimeoutError(
            f"mpisync: rank {comm.rank}: torch's env:// rendezvous through MPI timed out: not "
            f"every rank of MPI.COMM_WORLD called init_process_group within {timeout}",
            phase="rendezvous",
        ) from None
    if store is None:
        port = int(message[:8].view(_np.int64)[0])
        host = bytes(message[8:]).rstrip(b"\0").decode()
        store = dist.TCPStore(host, port, comm.size, False, timeout=timeout)
    return store, comm.rank, comm.size


def _extend_env_rendezvous() -> None:
    import importlib

    # torch's table of rendezvous schemes; without it (or its env:// handler), env:// needs
    # RANK and WORLD_SIZE as on any backend
    handlers = getattr(
        importlib.import_module("torch.distributed.rendezvous"), "_rendezvous_handlers", None
    )
    if not isinstance(handlers, dict):
        return
    env = handlers.get("env")
    if env is not None and not getattr(env, "mpisync", False):
        handlers["env"] = _env_with_mpi(env)


_register()
_extend_env_rendezvous()
