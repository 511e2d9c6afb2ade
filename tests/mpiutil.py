"""Helpers for collective tests: deterministic per-rank data, and assertions every rank checks."""

import numpy as np
import pytest
from mpi4py import MPI


def values(name: str, rank: int, shape, dtype) -> np.ndarray:
    """Deterministic bytes for parameter ``name`` as rank ``rank`` holds it before a sync.

    Any rank can recompute what the root held, so results are checked byte for byte.
    """
    dtype = np.dtype(dtype)
    seed = (sum(map(ord, name)) * 1000003 + rank * 7919) % (2**32)
    raw = np.random.default_rng(seed).integers(
        0, 256, size=int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype=np.uint8
    )
    out = raw.view(dtype).reshape(shape)
    if dtype == np.bool_:
        out = (raw % 2).astype(np.bool_).reshape(shape)
    return out.copy()


def same_bytes(a, b) -> bool:
    """Whether two arrays (numpy or torch) hold identical bytes."""
    return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def everyone(comm, flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (a fact all ranks then share)."""
    return bool(comm.allreduce(int(flag), op=MPI.MIN))


def need_ranks(comm, n: int):
    """Skip unless ``comm`` has at least ``n`` ranks (a fact every rank shares)."""
    if comm.size < n:
        pytest.skip(f"needs {n} ranks, running with {comm.size}")


def raises_everywhere(comm, exc_type, fn, *must_contain):
    """Assert ``fn()`` raises ``exc_type`` on this rank, with the same message on every rank."""
    with pytest.raises(exc_type) as info:
        fn()
    message = str(info.value)
    for part in must_contain:
        assert part in message, f"{part!r} not in {message!r}"
    messages = comm.allgather(message)  # test-side check only; mpisync itself never pickles
    assert len(set(messages)) == 1, f"messages differ between ranks: {messages}"
    return message


def last_rank(comm) -> int:
    """The highest rank: a receiver whenever root is 0 and size > 1."""
    return comm.size - 1


def wait(request) -> None:
    """Wait for one MPI request (the call ``mpisync.transports.crossreduce.drive`` takes)."""
    request.Wait()


def taken(monkeypatch, module, name: str) -> list:
    """Wrap ``module.<name>``, a steps generator that returns whether its path ran, so that each
    call appends that answer to the returned list (the real function still does the work)."""
    answers: list = []
    original = getattr(module, name)

    def recording(*args, **kwargs):
        done = yield from original(*args, **kwargs)
        answers.append(done)
        return done

    monkeypatch.setattr(module, name, recording)
    return answers
