"""Property-based: random manifests, roots, splits and one perturbed rank.

Every rank ends with root's bytes, or every rank raises the documented error
with replicas untouched; never a hang, never a partial write. Hypothesis runs
derandomized (every rank draws the same examples) and without shrinking (a
shrink on one rank alone would desynchronise the collectives).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import mpisync

from mpiutil import same_bytes, values

pytestmark = pytest.mark.mpi

DTYPES = ["float32", "float16", "int8", "uint16", "bool", "complex64", "float64"]
PERTURBATIONS = ["none", "shape", "dtype", "missing", "extra", "read-only", "non-contiguous"]

manifests = st.lists(
    st.tuples(
        st.text("abcxyz._", min_size=1, max_size=6),
        st.lists(st.integers(0, 4), min_size=0, max_size=3),
        st.sampled_from(DTYPES),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=7,
    unique_by=lambda row: row[0],
)


def _build(rows, rank):
    return {
        name: [
            values(name, rank, tuple(shape), dtype) if i == 0 else np.zeros(tuple(shape), dtype)
            for i in range(count)
        ]
        for name, shape, dtype, count in rows
    }


def _perturb(params, rows, kind):
    name, shape, dtype, count = rows[0]
    if kind == "shape":
        params[name] = [np.zeros(tuple(shape) + (2,), dtype) for _ in range(count)]
    elif kind == "dtype":
        other = "float64" if dtype != "float64" else "int32"
        params[name] = [np.zeros(tuple(shape), other) for _ in range(count)]
    elif kind == "missing":
        del params[name]
    elif kind == "extra":
        params["zz.extra"] = [np.zeros(3, np.float32)]
    elif kind == "read-only":
        params[name][0].flags.writeable = False
    elif kind == "non-contiguous":
        strided = np.zeros(tuple(shape) + (2,), dtype)[..., 0]  # same shape and values, strided
        strided[...] = params[name][0]
        params[name][0] = strided


def _expected_error(kind, size, perturbed_is_root, rows):
    if kind == "non-contiguous":  # numpy calls any array of at most one element contiguous
        return mpisync.InvalidParamError if np.prod(rows[0][1], dtype=np.int64) > 1 else None
    if kind == "read-only":
        return None if perturbed_is_root else mpisync.InvalidParamError
    if kind in ("shape", "dtype", "missing", "extra") and size > 1:
        return mpisync.ManifestMismatchError
    return None


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(
    rows=manifests,
    root_pick=st.integers(0, 7),
    split=st.integers(1, 2),
    kind=st.sampled_from(PERTURBATIONS),
    victim_pick=st.integers(0, 7),
    fusion=st.sampled_from([0, 16, 1 << 20]),
    capacity=st.integers(1, 4),
)
def test_root_bytes_everywhere_or_the_same_error_everywhere(
    comm, rows, root_pick, split, kind, victim_pick, fusion, capacity
):
    color = comm.rank % split if comm.size >= split else 0
    sub = comm.Split(color, key=comm.rank)
    try:
        root, victim = root_pick % sub.size, victim_pick % sub.size
        world_of = sub.group.Translate_ranks(list(range(sub.size)), comm.group)
        params = _build(rows, comm.rank)
        if sub.rank == victim:
            _perturb(params, rows, kind)
        before = {n: [np.array(r, copy=True) for r in reps] for n, reps in params.items()}
        expected = _expected_error(kind, sub.size, victim == root, rows)
        outcome = np.zeros(1, np.int64)  # every rank must agree on the outcome
        try:
            mpisync.sync_params(
                params, sub, root=root, fusion_bytes=fusion, max_concurrent=capacity
            )
        except mpisync.SyncError as exc:
            assert expected is not None and type(exc) is expected, (kind, exc)
            outcome[0] = 1
            for name, reps in params.items():
                for now, then in zip(reps, before[name]):
                    assert same_bytes(now, then), f"{name} was written despite {type(exc).__name__}"
        else:
            assert expected is None, (kind, expected)
            root_world = world_of[root]
            for name, shape, dtype, _count in rows:
                if (
                    sub.rank == victim
                    and kind in ("shape", "dtype", "missing")
                    and name == rows[0][0]
                ):
                    # size-1 communicator: the perturbed parameter is this rank's own business
                    continue
                for replica in params[name]:
                    assert same_bytes(replica, values(name, root_world, tuple(shape), dtype)), name
        event(f"{kind}: {expected.__name__ if expected else 'synced'}")
        outcomes = np.empty(sub.size, np.int64)
        sub.Allgather(outcome, outcomes)
        assert (outcomes == outcomes[0]).all(), outcomes
    finally:
        sub.Free()
