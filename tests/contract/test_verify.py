"""``verify=True`` after a real sync: one byte changed on one rank, between the sync's last write
and its verification, is caught and named on every rank (1-4 ranks)."""

import numpy as np
import pytest

import mpisync
import mpisync.sync as sync_module

from mpiutil import everyone, last_rank, raises_everywhere, same_bytes, values

pytestmark = pytest.mark.mpi

SHAPES = {
    "a.bool": ((7,), "bool"),
    "b.int8": ((3, 5), "int8"),
    "c.float16": ((4, 4), "float16"),
    "d.big": ((300_001,), "float32"),  # past XXH3's 1 KiB blocks; an odd tail
    "e.empty": ((0, 4), "float32"),
    "f.scalar": ((), "float64"),
    "g.complex": ((6,), "complex64"),
    "h.uint64": ((9,), "uint64"),
}
TARGETS = ["a.bool", "b.int8", "c.float16", "d.big", "f.scalar", "h.uint64"]


def _params(form, rank):
    arrays = {name: values(name, rank, shape, dtype) for name, (shape, dtype) in SHAPES.items()}
    if form == "replica lists":
        return {name: [array, np.zeros_like(array)] for name, array in arrays.items()}
    if form == "torch":
        import torch

        return {name: torch.from_numpy(array) for name, array in arrays.items()}
    return arrays


def _flip_byte(params, name, position):
    """Flip the lowest bit of one byte of ``name``'s last replica (its master when it has one)."""
    value = params[name]
    value = value[-1] if isinstance(value, list) else value
    flat = np.asarray(value).reshape(-1).view(np.uint8)
    flat[position % flat.size] ^= 1


def _corrupting(monkeypatch, params, rank, name, position):
    """Make the sync's verification step first flip one byte of ``name`` on ``rank``."""
    real = sync_module._verify

    def corrupt_then_verify(comm, manifest, *args, **kwargs):
        if comm is None or comm.rank == rank:
            _flip_byte(params, name, position)
        return real(comm, manifest, *args, **kwargs)

    monkeypatch.setattr(sync_module, "_verify", corrupt_then_verify)


def _form_or_skip(comm, form):
    if form == "torch":
        try:
            import torch  # noqa: F401

            here = True
        except ImportError:
            here = False
        if not everyone(comm, here):
            pytest.skip("torch is not installed")
    if comm.size == 1 and form != "replica lists":
        pytest.skip("one rank with one replica per name has nothing to compare")


@pytest.mark.parametrize("form", ["bare arrays", "replica lists", "torch"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("position", [0, -1], ids=["first byte", "last byte"])
def test_a_byte_changed_after_the_sync_is_named_on_every_rank(
    comm, monkeypatch, form, target, position
):
    _form_or_skip(comm, form)
    bad = last_rank(comm)
    params = _params(form, comm.rank)
    with mpisync.ParamSync(comm) as syncer:
        assert syncer.sync(params, verify=True).verified  # prepares, and all agree
        _corrupting(monkeypatch, params, bad, target, position)
        message = raises_everywhere(
            comm, mpisync.VerificationError, lambda: syncer.sync(params, verify=True)
        )
    # that parameter on that rank, and nothing else
    assert message == (
        f"mpisync: verification failed, bytes differ from root rank 0's: rank {bad}: {target!r}"
    )
    for name, (shape, dtype) in SHAPES.items():
        replicas = params[name] if isinstance(params[name], list) else [params[name]]
        expected = values(name, 0, shape, dtype)
        if comm.rank == bad and name == target:
            _flip_byte(params, name, position)  # undo: every other byte is root's
        assert all(same_bytes(replica, expected) for replica in replicas), name


def test_a_changed_byte_on_the_root_names_every_other_rank(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("needs a peer to differ from")
    params = _params("bare arrays", comm.rank)
    with mpisync.ParamSync(comm) as syncer:
        syncer.sync(params)
        _corrupting(monkeypatch, params, 0, "d.big", 12345)
        message = raises_everywhere(
            comm,
            mpisync.VerificationError,
            lambda: syncer.sync(params, verify=True),
        )
    named = "; ".join(f"rank {r}: 'd.big'" for r in range(1, comm.size))
    assert message == f"mpisync: verification failed, bytes differ from root rank 0's: {named}"


def test_verified_repeated_syncs_agree_and_use_one_all_reduce(comm):
    params = _params("bare arrays", comm.rank)
    with mpisync.ParamSync(comm) as syncer:
        first = syncer.sync(params)
        plain = syncer.sync(params)
        verified = syncer.sync(params, verify=True)
    assert not first.verified and not plain.verified and verified.verified
    # one more collective when a peer is there to compare with: the digests' all-reduce
    assert verified.collectives - plain.collectives == (1 if comm.size > 1 else 0)
    for name, (shape, dtype) in SHAPES.items():
        assert same_bytes(params[name], values(name, 0, shape, dtype)), name
