"""MPISYNC_TIMELINE pointing where one rank cannot write: a warning there, never a stalled job."""

import os

import pytest

import mpisync

from mpiutil import last_rank, same_bytes, values

pytestmark = pytest.mark.mpi


def test_unwritable_timeline_on_one_rank_still_syncs(comm, shared_folder):
    root = 0
    folder = str(shared_folder)
    # The last rank (a receiver when size > 1) gets a "folder" that is a file: it cannot write.
    blocker = os.path.join(folder, "a-file")
    with open(blocker, "w"):
        pass
    target = os.path.join(blocker if comm.rank == last_rank(comm) else folder, "tl-{rank}.json")
    params = {
        "w": values("w", comm.rank, (64,), "float32"),
        "b": values("b", comm.rank, (3,), "int16"),
    }
    old = os.environ.get("MPISYNC_TIMELINE")
    os.environ["MPISYNC_TIMELINE"] = target
    try:
        with mpisync.ParamSync(comm, root=root, timeout=60) as syncer:
            syncer.sync(params)
            syncer.sync(params)
    finally:
        if old is None:
            del os.environ["MPISYNC_TIMELINE"]
        else:
            os.environ["MPISYNC_TIMELINE"] = old
    assert same_bytes(params["w"], values("w", root, (64,), "float32"))
    assert same_bytes(params["b"], values("b", root, (3,), "int16"))
    written = os.path.exists(target.replace("{rank}", str(comm.rank)))
    assert written == (comm.rank != last_rank(comm))
