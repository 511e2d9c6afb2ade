"""What one sync did, as returned by ``sync_params`` and ``ParamSync.sync``."""

from __future__ import annotations

import dataclasses as _dc

__all__ = ["SyncReport"]


@_dc.dataclass
class SyncReport:
    """One rank's account of one sync or all-reduce, as returned by :func:`~mpisync.sync_params`,
    :meth:`~mpisync.ParamSync.sync`, :func:`~mpisync.allreduce` and
    :meth:`~mpisync.GradSync.allreduce`.

    Attributes:
        tensors: Parameters (names) synced.
        replicas: Replicas written or read, all names together.
        bytes: Bytes of one copy of all parameters.
        collectives: MPI collective calls this rank issued (validation and verification
            included).
        seconds: Wall time of the call on this rank.
        transport: ``"host"``, ``"staged"``, ``"cuda-aware"`` or ``"local"`` (no peers: only the
            local fan-out ran).
        rank: This rank in the communicator.
        size: The communicator's size.
        root: The rank whose bytes were broadcast (0 for an all-reduce).
        fused_buckets: Buffers that carried several small tensors at once.
        verified: Whether ``verify=True`` checked every rank's bytes.
        channel: How host bytes moved between ranks: ``"mpi"`` (collectives) or
            ``"cross-memory"`` (every rank on one node: tensors copied process to process).
        transfers: Steps of the plan: fused buckets and direct transfers.
    """

    tensors: int
    replicas: int
    bytes: int
    collectives: int
    seconds: float
    transport: str
    rank: int = 0
    size: int = 1
    root: int = 0
    fused_buckets: int = 0
    verified: bool = False
    channel: str = "mpi"
    # steps of the broadcast plan: fused buckets and direct transfers (host and device)
    transfers: int = 0

    @classmethod
    def of(cls, manifest, *, rank: int, size: int, root: int = 0, transport: str = "host"):
        """A report of ``manifest``'s tensors, replicas and bytes, before anything ran.

        :meta private:
        """
        return cls(
            tensors=manifest.tensors,
            replicas=manifest.nreplicas,
            bytes=manifest.nbytes,
            collectives=0,
            seconds=0.0,
            transport=transport,
            rank=rank,
            size=size,
            root=root,
        )

    @property
    def gbps(self) -> float:
        """Bytes of one copy of the parameters per second, in GB/s (10**9 bytes)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for logs.

        Returns:
            The report in words (tensors, replicas, MB, root, milliseconds, GB/s, collectives,
            fused buckets, transport).
        """

        def n(count: int, word: str) -> str:
            return f"{count} {word}{'' if count == 1 else 's'}"

        return (
            f"rank {self.rank}/{self.size}: synced {n(self.tensors, 'tensor')} "
            f"({n(self.replicas, 'replica')}, "
            f"{self.bytes / 1e6:.3f} MB) from root {self.root} in {self.seconds * 1e3:.2f} ms "
            f"({self.gbps:.2f} GB/s) with {n(self.collectives, 'collective')}, "
            f"{n(self.fused_buckets, 'fused bucket')}, "
            f"transport={self.transport}"
            + (f", over {self.channel}" if self.channel != "mpi" else "")
            + (", verified" if self.verified else "")
        )
