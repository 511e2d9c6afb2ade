"""Helpers of the unit tests (no MPI): the C loops module or a skip, and the arena's copy paths."""

import pytest

# Arena settings of each copy path: the C loop, one vectored system call per group, a Python loop.
ARENA_PATHS = {
    "compiled": {},
    "vectored": {"compiled": False},
    "loop": {"compiled": False, "vectored": False},
}


def speedups_or_skip():
    """The C loops module; the test is skipped where it is not built (or MPISYNC_SPEEDUPS=0)."""
    from mpisync._runtime.speedups import speedups

    if speedups is None:
        pytest.skip("mpisync._speedups is not built here (or MPISYNC_SPEEDUPS=0)")
    return speedups


#: The two forms of the loops (mpisync._runtime.speedups): tests run each function both ways.
LOOP_FORMS = ("C", "Python")


def loops_of(form):
    """The loops of ``form`` (``"C"``: skips where the C loops are not built, or are off)."""
    from mpisync._runtime.speedups import choose

    return choose(speedups_or_skip() if form == "C" else None)


def arena_path(path):
    """The arena settings of ``path`` (skips the compiled path where the C loops are not built)."""
    if path == "compiled":
        speedups_or_skip()
    return ARENA_PATHS[path]


#: "Another user" of the tests of files mpisync writes (they run as root): nobody.
NOBODY = 65534


def folder_of_another_user(parent, mode: int = 0o777):
    """A folder ``parent/shared`` that another user (:data:`NOBODY`) owns, with ``mode``; skips
    the test where this process cannot give a folder away (not root)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    shared = parent / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    os.chmod(shared, mode)
    return shared
