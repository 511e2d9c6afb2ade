"""What one all-reduce call reduces: the agreed manifest adapted into reduce groups
(:mod:`mpisync.allreduce.groups`), and the local work around the collectives (device replicas
staged through host buffers, several local replicas combined before and copied back after).

A dict of bare host arrays is adapted from the whole-set scan
(:func:`mpisync.allreduce.bulk.bulk_groups`: one buffer list, no object per tensor); anything else
from the per-parameter manifest (:func:`mpisync.allreduce.groups.param_groups`: replicas,
devices, half precision, tied weights). One plan is built from the groups either way, so ranks
whose sets took different adapters still match buffer for buffer.
"""

from __future__ import annotations

from ..params.adapters import ArrayView
from ..params.bulk import BulkManifest
from ..params.fanout import fan_out
from ..params.manifest import Manifest, Param
from .bulk import bulk_groups
from .groups import param_groups
from .plan import ReducePlan, build_steps, local_reduce, ordered, plan_groups

__all__ = ["ReduceSet", "Staging"]


class Staging:
    """Device replicas copied to host buffers before the reduction and back after it."""

    def __init__(self, params: list):
        self.params = params
        self.host = []  # per param: host ArrayViews over the pinned buffers, master first
        self.buffers = []  # per param: the pinned numpy buffers themselves
        for p in params:
            buffers = [p.master.backend.pinned(r.nbytes) for r in p.replicas]
            views = [
                ArrayView(memoryview(b).cast("B"), r.shape, r.dtype, True)
                for b, r in zip(buffers, p.replicas)
            ]
            self.host.append(Param(p.name, views))
            self.buffers.append(buffers)
        # every device a replica is on, once: a synchronize waits for all of its streams' work
        self.devices = {(r.backend, r.device) for p in params for r in p.replicas}

    def _sync_all(self) -> None:
        for backend, device in self.devices:
            backend.synchronize(device)

    def load(self) -> list:
        """Copy every device replica to its host buffer; return the host parameters."""
        self._sync_all()  # the producers of the device bytes are done
        for p, buffers in zip(self.params, self.buffers):
            for r, buffer in zip(p.replicas, buffers):
                r.backend.to_host(buffer, r.data, r.backend.stream(r.device))
        self._sync_all()
        return self.host

    def store(self) -> None:
        """Copy every reduced master back into every device replica, and wait for the copies."""
        for p, buffers in zip(self.params, self.buffers):
            for r in p.replicas:
                r.backend.to_device(r.data, buffers[0], r.backend.stream(r.device))
        self._sync_all()


class ReduceSet:
    """The masters ``manifest`` reduces with ``op`` over ``size`` ranks, and the local steps
    around their collectives (:meth:`before`, :meth:`after`)."""

    def __init__(self, manifest: BulkManifest | Manifest, op: str, size: int):
        self.manifest, self.op, self.size = manifest, op, size
        self.staging: Staging | None = None
        self.replicated: list = []  # parameters with several local replicas
        self.groups: list  # the reduce groups, one per dtype
        # The one place the two manifest forms differ: each has its adapter into the groups. The
        # scan's arrays are one host replica each, with their buffer list; nothing to stage.
        if isinstance(manifest, BulkManifest):
            self.groups = bulk_groups(manifest, op)
            return
        if manifest.device_params:
            self.staging = Staging(list(manifest.device_params))
        tied = {alias for alias, _ in manifest.settings.get("tied", ())}
        params = [p for p in manifest.host_params if p.name not in tied]
        params += self.staging.host if self.staging is not None else []
        self.replicated = [p for p in params if len(p.replicas) > 1]
        self.groups = param_groups(params, op)

    def plan(self, fusion_bytes: int) -> ReducePlan:
        """Which bytes go in which all-reduce (the same on every rank that agreed)."""
        return plan_groups(self.groups, fusion_bytes)

    def steps(self, plan: ReducePlan, arena) -> list:
        """The steps of ``plan``, fused buckets in ``arena``; across ranks, floats under
        ``min``/``max`` reduce as integers of their total order (:func:`ordered`)."""
        steps = build_steps(self.groups, self.op, self.size, plan, arena)
        return [ordered(step, self.op) for step in steps] if self.size > 1 else steps

    def before(self) -> bool:
        """Stage the device replicas and combine every name's local replicas into its master;
        True when device replicas were staged."""
        if self.staging is not None:
            self.staging.load()
        local_reduce(self.replicated, self.op)
        return self.staging is not None

    def after(self) -> None:
        """Copy every reduced master into the name's other replicas, device ones included."""
        fan_out(self.replicated)
        if self.staging is not None:
            self.staging.store()
