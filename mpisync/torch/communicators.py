"""Each process group's private communicator, made within the group's timeout.

- The default group (every rank of the base communicator) and any group of all
  its ranks: ``Idup``, waited for against the deadline; a rank that never comes
  is a timeout (reported by :func:`mpisync._runtime.timeouts.timed_out`: the job
  aborts, or with ``MPISYNC_TIMEOUT_ABORT=0`` it raises), never a hang.
- A group of some ranks: torch calls the backend on the members only, and MPI's
  ``Create_group`` (collective over the members) blocks. So the members first
  meet in a handshake of point-to-point messages on the parent communicator
  (the lowest member collects a token from each, then answers each), waited for
  against the deadline; only once all of them arrived do they call
  ``Create_group``. A member that did not arrive makes every other one raise
  (nothing collective is pending then). Should ``Create_group`` still not return
  within the timeout (a member that timed out just as the others completed the
  handshake), the job is aborted with the diagnostic instead of left hanging.

The parent communicator is a duplicate of the base one that the default
mpisync group makes beside its own (so the handshakes' messages never meet the
user's); without an mpisync default group (torch's default group on another
backend) it is ``MPI.COMM_WORLD``, whose ranks are torch's.
"""

from __future__ import annotations

import hashlib as _hashlib
import json as _json
import struct as _struct
import sys as _sys
import threading as _threading
import time as _time
import zlib as _zlib

import numpy as _np

from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired, wait_request
from .._runtime.timeouts import abort_job, timed_out
from ..config import wire_settings
from ..errors import InvalidParamError, SyncTimeoutError
from ..params.agreement import agree_settings, allgather_bytes, max_and_min
from .errors import MismatchError

__all__ = ["GroupTimeoutError", "agree_on_settings", "duplicates", "members_communicator"]

# Tags of the handshake (the group's name picks one) stay in this range, within MPI's minimum
# TAG_UB (32767).
_TAG_BASE, _TAG_SPAN = 20000, 12000


class GroupTimeoutError(SyncTimeoutError, RuntimeError):
    """A process group was not created within its timeout: a member did not arrive.

    Raised by ``init_process_group`` (torch's ``env://`` rendezvous through MPI)
    and ``torch.distributed.new_group`` on every member that came, naming the
    ranks that did not; nothing collective is left pending.
    """


def _wait_all(requests: list, deadline: float | None, comm=None) -> None:
    for request in requests:
        wait_request(request, deadline, comm)


def duplicates(comm, count: int, timeout: float | None, what: str) -> list:
    """``count`` duplicates of ``comm`` (``Idup``, one after the other), within ``timeout``
    seconds."""
    deadline = None if timeout is None else _time.monotonic() + timeout
    made: list = []
    # One Idup in flight at a time: Open MPI 5's nonblocking context-id agreement fails now and
    # then (MPI_ERR_INTERN from MPI_Test) with several on one communicator in flight at once.
    for _ in range(count):
        new, request = comm.Idup()
        made.append(new)
        try:
            wait_request(request, deadline, comm)
        except Expired:
            keep_alive(new, request, *made)
            timed_out(comm, f"creation of {what}", [what], timeout, call="init_process_group")
    return made


def agree_on_settings(comm, timeout: float | None, what: str, problem: str | None = None) -> None:
    """Every rank of ``comm`` has the same wire settings (:func:`mpisync.config.wire_settings`,
    ``MPISYNC_TORCH_CHECK`` among them), or every rank raises the same
    :class:`~mpisync.torch.errors.MismatchError` naming each setting and the ranks of each
    value; within ``timeout`` seconds. ``problem``: why this rank refuses to create the group
    (an invalid ``MPISYNC_*`` value, say); where any rank has one, every rank raises the same
    :class:`~mpisync.InvalidParamError` naming each rank's (the same all-reduce carries it)."""
    deadline = None if timeout is None else _time.monotonic() + timeout

    def call(request) -> None:
        wait_request(request, deadline, comm)

    try:
        settings = wire_settings(torch=True)
        encoded = _json.dumps(settings, sort_keys=True).encode()
        digest = _struct.unpack("=2q", _hashlib.blake2b(encoded, digest_size=16).digest())
        high, low = max_and_min(comm, [int(problem is not None), *digest], call)
        if high[0]:
            raise _refused(comm, problem, what, call)
        if high[1:] != low[1:]:
            agree_settings(comm, settings, call, MismatchError)  # names each difference
    except Expired:
        timed_out(comm, f"settings agreement of {what}", [what], timeout, call="init_process_group")


def _refused(comm, problem: str | None, what: str, call) -> InvalidParamError:
    """The error every rank raises when some rank refused to create the group: each rank's
    problem, gathered (the message is made of what every rank received, so it is the same on
    every rank)."""
    gathered = allgather_bytes(comm, _json.dumps(problem).encode(), call)
    problems = [(rank, _json.loads(raw)) for rank, raw in enumerate(gathered)]
    lines = "; ".join(f"rank {rank}: {text}" for rank, text in problems if text is not None)
    return InvalidParamError(
        f"mpisync: creating {what} was refused on every rank, nothing else was started: {lines}"
    )


def members_communicator(parent, members: list, name: str, timeout: float | None):
    """A communicator of the ranks ``members`` of ``parent`` (this rank among them), made by the
    members only, within ``timeout`` seconds (see the module's docstring)."""
    if list(members) == list(range(parent.size)):
        return duplicates(parent, 1, timeout, f"process group {name}")[0]
    tag = _TAG_BASE + _zlib.crc32(name.encode()) % _TAG_SPAN
    deadline = None if timeout is None else _time.monotonic() + timeout
    _handshake(parent, members, tag, name, deadline)
    group = parent.group.Incl(members)
    try:
        with _Bound(parent, name, timeout):
            return parent.Create_group(group, tag)
    finally:
        group.Free()


def _handshake(parent, members: list, tag: int, name: str, deadline: float | None) -> None:
    leader, me = members[0], parent.rank
    token = _np.array([tag], dtype=_np.int64)
    if me == leader:
        others = [m for m in members if m != me]
        tokens = [_np.zeros(1, dtype=_np.int64) for _ in others]
        arrivals = [parent.Irecv(t, m, tag) for t, m in zip(tokens, others)]
        missing = _wait_arrivals(arrivals, others, deadline)
        if missing:
            _give_up(arrivals, [], name, members, f"ranks {missing} did not arrive")
        answers = [parent.Isend(token, m, tag) for m in others]
        _wait_all(answers, None)  # small messages: sent eagerly
        return
    reply = _np.zeros(1, dtype=_np.int64)
    sent = parent.Isend(token, leader, tag)
    answer = parent.Irecv(reply, leader, tag)
    try:
        _wait_all([answer], deadline)
    except Expired:
        _give_up(
            [answer], [sent], name, members, f"rank {leader} (its first member) did not answer"
        )
    wait_request(sent, None)


def _wait_arrivals(arrivals: list, others: list, deadline: float | None) -> list:
    try:
        _wait_all(arrivals, deadline)
    except Expired:
        return [m for m, r in zip(others, arrivals) if not r.Test()]
    return []


def _give_up(receives: list, sends: list, name: str, members: list, why: str):
    for request in receives:
        request.Cancel()
    keep_alive(*receives, *sends)
    raise GroupTimeoutError(
        f"mpisync: creating process group {name} of ranks {members} timed out: {why} within "
        "its timeout; nothing collective was started, so every member raises",
        phase="process group creation",
        pending=[name],
    )


class _Bound:
    """Abort the job if the block has not ended ``timeout`` seconds after it began (a blocking
    MPI call that may not return)."""

    def __init__(self, comm, name: str, timeout: float | None):
        self._comm, self._name, self._timeout = comm, name, timeout
        self._done = _threading.Event()

    def __enter__(self) -> None:
        if self._timeout is not None:
            _threading.Thread(target=self._watch, name="mpisync-create-group", daemon=True).start()

    def __exit__(self, *exc) -> None:
        self._done.set()

    def _watch(self) -> None:
        assert self._timeout is not None
        if self._done.wait(self._timeout):
            return
        message = (
            f"mpisync: rank {self._comm.rank}: creating process group {self._name} timed out in "
            f"MPI's Create_group after {self._timeout:g} s (a member left after the handshake); "
            "MPI cannot cancel it, so this rank aborts the job\n"
        )
        _sys.stderr.write(message)
        _sys.stderr.flush()
        _time.sleep(1.0)
        abort_job(self._comm)
