"""Fixtures of the transport tests."""

import pytest


@pytest.fixture
def dup(comm):
    """A fresh duplicate of the world (the cross-memory probe's result is kept per
    communicator)."""
    c = comm.Dup()
    yield c
    c.Free()
