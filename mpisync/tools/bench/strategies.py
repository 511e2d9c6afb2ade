"""Ways to broadcast a parameter set, side by side: baselines and mpisync.

Each factory takes ``(comm, params, root)`` (``params``: name -> numpy array)
and returns ``(run, close)``; ``run()`` does one whole broadcast.
"""

from __future__ import annotations

from mpi4py import MPI

import mpisync

from .buffers import written

__all__ = ["STRATEGIES", "evict_caches", "flat_buffer", "paramsync"]


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
    of times gets): communicator duplication, validation, transport set-up and plan from scratch
    each run, on the set every row shares."""

    def run():
        with mpisync.ParamSync(comm, root=root) as syncer:
            # a function attribute the bench reads: the attr-defined ignore
            run.channel = syncer.sync(params).channel  # type: ignore[attr-defined]

    return run, _noop


def paramsync_first_new_memory(comm, params, root):
    """The first sync of a new ``ParamSync`` on copies of the set that no other row syncs: every
    run finds the memory as a job's first sync finds a model it has just built. The row above
    syncs the set every row shares, which earlier rows have synced already."""
    copies = {name: a.clone() if hasattr(a, "clone") else a.copy() for name, a in params.items()}
    first, _ = paramsync_first(comm, copies, root)

    def run():
        first()
        run.channel = first.channel  # type: ignore[attr-defined]

    run.params = copies  # type: ignore[attr-defined]  # the set it syncs (for tests)
    return run, copies.clear


# larger than the last-level cache (twice a 32 MiB one), so a sync's cache lines are evicted
_EVICTION_BYTES = 64 << 20
_eviction = None


def evict_caches() -> None:
    """Write a byte in every cache line of 64 MiB: what other work between two syncs leaves
    behind."""
    global _eviction
    if _eviction is None:
        _eviction = written(_EVICTION_BYTES)
    _eviction[::64] += 1


def paramsync(channel: str | None = None, **settings):
    """Repeated ``ParamSync.sync`` (validation, plan and buffers reused), with ``settings``.

    ``channel=None``: the syncer's own choice (see :mod:`mpisync.transports.selection`);
    else host bytes take ``channel`` ("mpi", "cross-memory")
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
    arena = written(sum(a.nbytes for a in params.values()), value=1)
    relocated, offset = {}, 0
    for name, a in params.items():
        view = arena[offset : offset + a.nbytes].view(a.dtype).reshape(a.shape)
        view[...] = a
        relocated[name] = view
        offset += a.nbytes
    return paramsync()(comm, relocated, root)


def flat_buffer(comm, params, root):
    """One ``Bcast`` of a single contiguous buffer of the same bytes (written on every rank): the
    reference of the ``x flat`` column, not a bound (the limit row is one)."""
    flat = written(sum(int(a.nbytes) for a in params.values()), value=1)

    def run():
        comm.Bcast(flat, root)

    return run, _noop


#: The strategies that take torch tensors as they are (the torch workloads run only these).
TORCH_STRATEGIES = (
    "per-tensor Bcast",
    "sync_params cold",
    "ParamSync first sync",
    "ParamSync first sync, new memory",
    "ParamSync",
    "flat Bcast",
)

STRATEGIES = {
    "per-tensor Bcast": per_tensor_bcast,
    "Ibcast unbounded": ibcast_unbounded,
    "Ibcast ring": None,  # filled with the default capacity at run time
    "sync_params cold": sync_params_cold,
    "ParamSync first sync": paramsync_first,
    "ParamSync first sync, new memory": paramsync_first_new_memory,
    "ParamSync": paramsync(),
    "ParamSync, MPI only": paramsync("mpi"),
    "ParamSync, one buffer": paramsync_one_buffer,
    "flat Bcast": flat_buffer,
}
