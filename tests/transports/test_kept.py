"""What a transport keeps on a communicator (:func:`mpisync.transports.kept.kept_on`): made once
per communicator and owner, never shared with a duplicate or another owner."""

import pytest

from mpisync.transports.kept import kept_on

pytestmark = pytest.mark.mpi


def test_made_once_per_communicator_and_owner(dup):
    made = []

    def make():
        made.append(object())
        return made[-1]

    first = kept_on(dup, "test-owner", make)
    assert kept_on(dup, "test-owner", make) is first
    other = kept_on(dup, "test-other-owner", make)
    assert other is not first
    again = dup.Dup()
    try:
        assert kept_on(again, "test-owner", make) is not first  # a duplicate starts afresh
    finally:
        again.Free()
    assert len(made) == 3
