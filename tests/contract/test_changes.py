"""Nothing slips through: names that differ only in where a NUL falls, arrays changed between two
syncs
of one ParamSync, and the buffers of a syncer whose sync timed out. Bytes and errors on every
rank."""

import numpy as np
import pytest

import mpisync

from mpiutil import everyone, last_rank, need_ranks, raises_everywhere, same_bytes, values

pytestmark = pytest.mark.mpi

FORMS = ["bare arrays", "replica lists"]


def _form(params, form):
    return params if form == "bare arrays" else {n: [a, a.copy()] for n, a in params.items()}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("verify", [False, True])
def test_names_that_differ_only_in_where_a_nul_falls_do_not_match(comm, form, verify):
    need_ranks(comm, 2)
    names = ("a\0b", "c") if comm.rank == 0 else ("a", "b\0c")
    params = _form({n: values(n, comm.rank, (3,), "float32") for n in names}, form)
    before = {
        n: np.array(v if form == "bare arrays" else v[0], copy=True) for n, v in params.items()
    }
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.sync_params(params, comm, root=0, verify=verify),
        "parameter 'a",
    )
    for n, v in params.items():
        assert same_bytes(v if form == "bare arrays" else v[0], before[n]), n


def test_names_with_lone_surrogates_sync(comm):
    params = {
        "\ud800x": values("s", comm.rank, (4,), "int32"),
        "y": values("y", comm.rank, (2,), "int32"),
    }
    mpisync.sync_params(params, comm, root=0, verify=True)
    assert same_bytes(params["\ud800x"], values("s", 0, (4,), "int32"))


def _three(rank, step=0):
    return {f"p{i}": values(f"p{i}.{step}", rank, (64,), "float32") for i in range(3)}


def _torch_or_numpy(library, rank, step=0):
    arrays = _three(rank, step)
    if library == "torch":
        torch = pytest.importorskip("torch")
        return {n: torch.from_numpy(a) for n, a in arrays.items()}
    return arrays


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_an_array_made_read_only_on_a_receiver_between_syncs_is_refused(comm, library):
    need_ranks(comm, 2)
    bad = last_rank(comm)
    params = _torch_or_numpy(library, comm.rank)
    with mpisync.ParamSync(comm, timeout=60) as syncer:
        syncer.sync(params)
        if library == "numpy":
            for n in params:
                params[n][...] = values(f"{n}.1", comm.rank, (64,), "float32")
            if comm.rank == bad:
                params["p1"].flags.writeable = False
            before = {n: np.array(a, copy=True) for n, a in params.items()}
            raises_everywhere(
                comm,
                mpisync.InvalidParamError,
                lambda: syncer.sync(params),
                f"rank {bad}: parameter 'p1'",
                "read-only",
            )
            for n, a in params.items():  # nothing written, on any rank
                assert same_bytes(a, before[n]), n
            params["p1"].flags.writeable = True
        for n in params:
            params[n][...] = (
                values(f"{n}.2", comm.rank, (64,), "float32")
                if library == "numpy"
                else __import__("torch").from_numpy(values(f"{n}.2", comm.rank, (64,), "float32"))
            )
        syncer.sync(params)  # the same syncer, prepared again
        for n, a in params.items():
            assert same_bytes(np.asarray(a), values(f"{n}.2", 0, (64,), "float32")), n


def test_a_torch_parameter_re_pointed_at_its_transpose_on_one_rank_is_refused(comm):
    torch = pytest.importorskip("torch")
    need_ranks(comm, 2)
    bad = last_rank(comm)
    params = {n: torch.from_numpy(values(n, comm.rank, (8, 8), "float32")) for n in ("w", "v")}
    with mpisync.ParamSync(comm, timeout=60) as syncer:
        syncer.sync(params)
        for n in params:
            params[n].copy_(torch.from_numpy(values(f"{n}.1", comm.rank, (8, 8), "float32")))
        if comm.rank == bad:
            # the same object, the same storage, other strides
            params["w"].data = params["w"].data.t()
        before = {n: params[n].contiguous().numpy().copy() for n in params}
        raises_everywhere(
            comm,
            mpisync.InvalidParamError,
            lambda: syncer.sync(params),
            f"rank {bad}: parameter 'w'",
        )
        for n in params:
            assert same_bytes(params[n].contiguous().numpy(), before[n]), n


@pytest.mark.parametrize("who", ["one rank", "every rank"])
def test_a_numpy_array_resized_in_place_is_never_written_at_its_old_address(comm, who):
    need_ranks(comm, 2)
    params = {f"q{i}": values(f"q{i}", comm.rank, (1000,), "float64") for i in range(4)}
    with mpisync.ParamSync(comm, timeout=60) as syncer:
        syncer.sync(params)
        resized = who == "every rank" or comm.rank == last_rank(comm)
        if resized:
            params["q2"].resize((50_000,), refcheck=False)  # reallocated: the old memory is freed
        for n, a in params.items():
            a[...] = values(f"{n}.1", comm.rank, a.shape, "float64")
        if who == "one rank":
            before = {n: a.copy() for n, a in params.items()}
            raises_everywhere(
                comm, mpisync.ManifestMismatchError, lambda: syncer.sync(params), "'q2'"
            )
            for n, a in params.items():
                assert same_bytes(a, before[n]), n
        else:
            syncer.sync(params, verify=True)
            for n, a in params.items():
                assert same_bytes(a, values(f"{n}.1", 0, a.shape, "float64")), n


def test_a_numpy_array_reshaped_in_place_on_every_rank_is_prepared_again(comm):
    params = {f"r{i}": values(f"r{i}", comm.rank, (6, 4), "int16") for i in range(3)}
    with mpisync.ParamSync(comm, timeout=60) as syncer:
        syncer.sync(params)
        params["r1"].shape = (4, 6)  # the same memory, another shape: what a peer compares
        for n, a in params.items():
            a[...] = values(f"{n}.1", comm.rank, a.shape, "int16")
        report = syncer.sync(params, verify=True)
        assert report.tensors == 3
        for n, a in params.items():
            assert a.shape == ((4, 6) if n == "r1" else (6, 4))
            assert same_bytes(a, values(f"{n}.1", 0, a.shape, "int16")), n


def test_a_timed_out_sync_never_hands_its_buffers_on(comm, monkeypatch):
    # Receivers time out waiting for root's bucket (root is held back); their fusion arena may still
    # be
    # written by that broadcast, so the next sync_params must not get it.
    need_ranks(comm, 2)
    import time

    from mpisync.transports import spares
    from mpisync.transports.mpi import MpiTransport

    monkeypatch.setenv("MPISYNC_TIMEOUT_ABORT", "0")
    monkeypatch.setitem(spares._SPARES, spares.ARENA, [])
    # one bucket
    params = {f"s{i}": values(f"s{i}", comm.rank, (16,), "float32") for i in range(10)}
    comm.Barrier()  # together into the sync: only root's late broadcast may outlast the others' 1 s
    if comm.rank == 0:
        real = MpiTransport.run

        def late(self, program, ctx):
            time.sleep(4)
            real(self, program, ctx)

        monkeypatch.setattr(MpiTransport, "run", late)
        mpisync.sync_params(params, comm, root=0, timeout=60)
    else:
        with pytest.raises(mpisync.SyncTimeoutError) as info:
            mpisync.sync_params(params, comm, root=0, timeout=1)
        assert info.value.phase == "broadcast" and "s0" in info.value.pending
        assert spares._SPARES[spares.ARENA] == []  # the timed-out syncer's arena went to no one
    time.sleep(0.5)
    comm.Barrier()
    monkeypatch.undo()
    fresh = {f"s{i}": values(f"s{i}.1", comm.rank, (16,), "float32") for i in range(10)}
    mpisync.sync_params(fresh, comm, root=0, timeout=60)
    assert everyone(
        comm, all(same_bytes(a, values(f"{n}.1", 0, (16,), "float32")) for n, a in fresh.items())
    )
