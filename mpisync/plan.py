"""The broadcast plan: which bytes travel in which collective.

Every rank derives the same plan from the agreed manifest, so the collectives
match one to one. Tensors smaller than ``fusion_bytes`` are packed into shared
buckets of at most ``fusion_bytes``; larger ones travel straight from their
own memory, split into chunks of at most ``chunk_bytes`` so no count exceeds
what a C ``int`` holds.
"""

from __future__ import annotations

import dataclasses as _dc

__all__ = ["Transfer", "build_plan", "DEFAULT_CHUNK_BYTES"]

#: Largest single collective: 1 GiB keeps every MPI count far below 2**31.
DEFAULT_CHUNK_BYTES = 1 << 30


@_dc.dataclass(frozen=True)
class Transfer:
    """One collective. ``pieces`` are ``(param index, param offset, buffer offset, nbytes)``.

    A direct transfer has one piece and no buffer (``fused`` is False): the
    bytes travel from and to the parameter's own memory. ``completes`` lists
    the parameters whose last bytes arrive with this transfer.
    """

    fused: bool
    nbytes: int
    pieces: tuple
    completes: tuple


def build_plan(sizes: list, fusion_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list:
    """Transfers for parameters of ``sizes`` bytes, in parameter order.

    Zero-size parameters need no transfer; they are completed by the next one
    (or by none, when nothing follows: callers fan out every parameter at the end).
    """
    plan: list = []
    bucket: list = []
    bucket_bytes = 0
    waiting: list = []  # zero-size params to complete with the next transfer

    def flush_bucket():
        nonlocal bucket, bucket_bytes, waiting
        if bucket:
            done = tuple(waiting) + tuple(p[0] for p in bucket)
            plan.append(Transfer(True, bucket_bytes, tuple(bucket), done))
            bucket, bucket_bytes, waiting = [], 0, []

    for index, nbytes in enumerate(sizes):
        if nbytes == 0:
            waiting.append(index)
        elif nbytes < fusion_bytes:
            if bucket_bytes + nbytes > fusion_bytes:
                flush_bucket()
            bucket.append((index, 0, bucket_bytes, nbytes))
            bucket_bytes += nbytes
        else:
            flush_bucket()
            for start in range(0, nbytes, chunk_bytes):
                n = min(chunk_bytes, nbytes - start)
                last = start + n == nbytes
                done = (tuple(waiting) + (index,)) if last else ()
                plan.append(Transfer(False, n, ((index, start, 0, n),), done))
                if last:
                    waiting = []
    flush_bucket()
    return plan
