"""The reference plan the tests hold mpisync's one plan to: :func:`build_plan`, a per-piece
model of which bytes travel in which collective, written for clarity rather than speed.

:func:`mpisync.plan.transfers.bulk_plan` must post the collectives this one does
(tests/plan/test_transfers.py) and the host columns' spans and aliases must reproduce its runs
(tests/params/test_columns.py).
"""

import dataclasses as _dc

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
    # a span transfer: the run's parameters in address order; pieces[0][0] is run[0]
    run: tuple = ()


def build_plan(
    sizes: list, fusion_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, runs: tuple = ()
) -> list:
    """Transfers for parameters of ``sizes`` bytes, in parameter order.

    ``runs`` are tuples of parameter indices adjacent in memory (address
    order); a run of at least ``fusion_bytes`` travels as spans from its
    first member's address, ordered by its smallest index. Zero-size
    parameters need no transfer; they are completed by the next one (or by
    none, when nothing follows: callers fan out every parameter at the end).
    """
    plan: list = []
    bucket: list = []
    bucket_bytes = 0
    waiting: list = []  # zero-size params to complete with the next transfer
    run_at: dict = {}  # smallest index -> run
    in_runs: set = set()
    for run in runs:
        if sum(sizes[i] for i in run) >= fusion_bytes:
            run_at[min(run)] = run
            in_runs.update(run)

    def flush_bucket():
        nonlocal bucket, bucket_bytes, waiting
        if bucket:
            done = tuple(waiting) + tuple(p[0] for p in bucket)
            plan.append(Transfer(True, bucket_bytes, tuple(bucket), done))
            bucket, bucket_bytes, waiting = [], 0, []

    def direct(index, nbytes, members):
        nonlocal waiting
        flush_bucket()
        for start in range(0, nbytes, chunk_bytes):
            n = min(chunk_bytes, nbytes - start)
            last = start + n == nbytes
            done = (tuple(waiting) + members) if last else ()
            plan.append(
                Transfer(
                    False, n, ((index, start, 0, n),), done, members if len(members) > 1 else ()
                )
            )
            if last:
                waiting = []

    for index, nbytes in enumerate(sizes):
        if index in in_runs:
            run = run_at.get(index)
            if run is not None:
                direct(run[0], sum(sizes[i] for i in run), run)
        elif nbytes == 0:
            waiting.append(index)
        elif nbytes < fusion_bytes:
            if bucket_bytes + nbytes > fusion_bytes:
                flush_bucket()
            bucket.append((index, 0, bucket_bytes, nbytes))
            bucket_bytes += nbytes
        else:
            direct(index, nbytes, (index,))
    flush_bucket()
    return plan
