"""Ways to broadcast a parameter set, side by side: baselines, mpisync, and torch gloo.

Each factory takes ``(comm, params, root)`` (``params``: name -> numpy array)
and returns ``(run, close)``; ``run()`` does one whole broadcast.
"""

from __future__ import annotations

import numpy as _np
from mpi4py import MPI

import mpisync

__all__ = ["STRATEGIES", "evict_caches", "flat_buffer", "paramsync", "torch_gloo_available"]


def _noop():
    pass


def per_tensor_bcast(comm, params, root):
    """One blocking ``Bcast`` per tensor, in sorted order: the hand-written loop."""
    arrays = [params[n] for n in sorted(params)]

    def run():
        for a in arrays:
            comm.Bcast(a, root)

    return run, _noop


def ibcast_unbounded(comm, params, root):
    """Every ``Ibcast`` posted at once, then ``Waitall``: no bound on requests in flight."""
    arrays = [params[n] for n in sorted(params)]

    def run():
        MPI.Request.Waitall([comm.Ibcast(a, root) for a in arrays])

    return run, _noop


def ibcast_ring(capacity):
    """Per-tensor ``Ibcast`` through a :class:`mpisync.RequestRing` of ``capacity``, no fusion."""

    def factory(comm, params, root):
        arrays = [params[n] for n in sorted(params)]

        def run():
            ring = mpisync.RequestRing(capacity)
            for a in arrays:
                ring.push(comm.Ibcast(a, root))
            ring.drain()

        return run, _noop

    return factory


def sync_params_cold(comm, params, root):
    """``mpisync.sync_params`` with default settings: validation and plans from scratch each
    call."""

    def run():
        mpisync.sync_params(params, comm, root=root)

    return run, _noop


def paramsync_first(comm, params, root):
    """The first sync of a new ``ParamSync`` with default settings (what a job that syncs a handful
    of
    times gets): communicator duplication, validation, transport set-up and plan from scratch each
    run."""

    def run():
        with mpisync.ParamSync(comm, root=root) as syncer:
            # a function attribute the bench reads: the attr-defined ignore
            run.channel = syncer.sync(params).channel  # type: ignore[attr-defined]

    return run, _noop


# larger than the last-level cache (twice a 32 MiB one), so a sync's cache lines are evicted
_EVICTION_BYTES = 64 << 20
_eviction = None


def evict_caches() -> None:
    """Write a byte in every cache line of 64 MiB: what other work between two syncs leaves
    behind."""
    global _eviction
    if _eviction is None:
        _eviction = _np.zeros(_EVICTION_BYTES, dtype=_np.uint8)
    _eviction[::64] += 1


def paramsync(channel: str | None = None, **settings):
    """Repeated ``ParamSync.sync`` (validation, plan and buffers reused), with ``settings``.

    ``channel=None``: the syncer's own choice (see :mod:`mpisync.transports.selection`);
    else host bytes take ``channel`` ("mpi", "cross-memory", "shared memory")
    where every rank can. One untimed sync sets the syncer up.
    """

    def factory(comm, params, root):
        syncer = mpisync.ParamSync(comm, root=root, **settings)
        if channel is not None:
            syncer._prefer(channel)
        syncer.sync(params)

        def run():
            # which channel the syncer settled on (a function attribute: the attr-defined ignore)
            run.channel = syncer.sync(params).channel  # type: ignore[attr-defined]

        return run, syncer.close

    return factory


def paramsync_one_buffer(comm, params, root):
    """Repeated ``ParamSync.sync`` of the same tensors relocated as views into one contiguous
    buffer.

    Not a way to sync your model: a measurement of how much the memory layout
    (one allocation versus one per tensor) alone costs the broadcast.
    """
    arena = _np.ones(sum(a.nbytes for a in params.values()), dtype=_np.uint8)
    relocated, offset = {}, 0
    for name, a in params.items():
        view = arena[offset : offset + a.nbytes].view(a.dtype).reshape(a.shape)
        view[...] = a
        relocated[name] = view
        offset += a.nbytes
    return paramsync()(comm, relocated, root)


def flat_buffer(comm, params, root):
    """One ``Bcast`` of a single contiguous buffer of the same bytes: the ideal."""
    flat = _np.ones(sum(int(a.nbytes) for a in params.values()), dtype=_np.uint8)

    def run():
        comm.Bcast(flat, root)

    return run, _noop


def torch_gloo_available(comm) -> bool:
    """Whether torch.distributed with gloo can run here (decided the same way on every rank)."""
    try:
        import torch.distributed as dist

        ok = dist.is_available() and dist.is_gloo_available()
    except Exception:
        ok = False
    flag = _np.array([int(ok)], dtype=_np.int64)
    comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
    return bool(flag[0]) and comm.size > 1 and comm == MPI.COMM_WORLD


def _init_gloo(comm):
    import datetime
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return dist
    # Rank 0 picks the rendezvous address; it travels as fixed-size bytes, never pickled.
    meta = _np.zeros(258, dtype=_np.uint8)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        name = MPI.Get_processor_name().encode()[:256] if comm.size > 1 else b"127.0.0.1"
        meta[:2] = _np.frombuffer(port.to_bytes(2, "little"), _np.uint8)
        meta[2 : 2 + len(name)] = _np.frombuffer(name, _np.uint8)
    comm.Bcast(meta, 0)
    port = int.from_bytes(meta[:2].tobytes(), "little")
    host = meta[2:].tobytes().rstrip(b"\0").decode()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=comm.rank,
        world_size=comm.size,
        timeout=datetime.timedelta(seconds=120),
    )
    return dist


def torch_gloo_ddp(comm, params, root):
    """torch.distributed on gloo, DDP's start-up path: ``_broadcast_coalesced`` with 250 MB
    buckets."""
    import torch

    dist = _init_gloo(comm)
    tensors = [torch.from_numpy(params[n]) for n in sorted(params)]
    group = dist.distributed_c10d._get_default_group()

    def run():
        dist._broadcast_coalesced(group, tensors, 250 * 1024 * 1024, root)

    return run, _noop


#: The strategies that take torch tensors as they are (the torch workloads run only these).
TORCH_STRATEGIES = (
    "per-tensor Bcast",
    "sync_params cold",
    "ParamSync first sync",
    "ParamSync",
    "flat Bcast (ideal)",
)

STRATEGIES = {
    "per-tensor Bcast": per_tensor_bcast,
    "Ibcast unbounded": ibcast_unbounded,
    "Ibcast ring": None,  # filled with the default capacity at run time
    "sync_params cold": sync_params_cold,
    "ParamSync first sync": paramsync_first,
    "ParamSync": paramsync(),
    "ParamSync, MPI only": paramsync("mpi"),
    "ParamSync, one buffer": paramsync_one_buffer,
    "ParamSync, shared memory": paramsync("shared memory"),
    "flat Bcast (ideal)": flat_buffer,
    "torch gloo DDP": torch_gloo_ddp,
}
