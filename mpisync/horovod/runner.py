"""A Horovod PyTorch script, unchanged: ``import horovod.torch as hvd`` is :mod:`mpisync.horovod`.

    mpiexec -n 4 python -m mpisync.horovod train.py --epochs 3        # horovodrun -np 4 train.py
    srun --mpi=pmi2 python -m mpisync.horovod train.py
    mpiexec -n 4 python -m mpisync.horovod -m package.train ARGS       # a module, as python -m

Inside that process only, ``horovod`` is a stand-in package whose ``torch`` is
:mod:`mpisync.horovod`; nothing is installed, and a real Horovod elsewhere on the machine is not
touched (another process imports its own). ``horovod.tensorflow``, ``horovod.keras``,
``horovod.spark`` and the rest of Horovod's packages raise an ``ImportError`` naming what to use.
"""

from __future__ import annotations

import importlib.abc as _abc
import os as _os
import runpy as _runpy
import sys as _sys
import types as _types

__all__ = ["HOROVOD_API", "alias_horovod", "main"]

#: The Horovod release whose PyTorch API mpisync.horovod follows: the stand-in's ``__version__``.
HOROVOD_API = "0.28.1"

_USAGE = (
    "usage: python -m mpisync.horovod SCRIPT [ARGS...]\n"
    "       python -m mpisync.horovod -m MODULE [ARGS...]\n"
    "runs a Horovod PyTorch script with `import horovod.torch` resolved to mpisync.horovod "
    "(launch it as any MPI program: mpiexec -n N python -m mpisync.horovod SCRIPT, or srun)"
)
# Horovod's other packages: what the stand-in says when a script imports one.
_OTHERS = {
    "tensorflow": "TensorFlow: mpisync.horovod is Horovod's PyTorch API only",
    "keras": "Keras: mpisync.horovod is Horovod's PyTorch API only",
    "mxnet": "MXNet: mpisync.horovod is Horovod's PyTorch API only",
    "spark": "horovod.spark: launch with mpiexec or srun instead",
    "ray": "horovod.ray: launch with mpiexec or srun instead",
    "runner": "horovodrun and horovod.run: launch with mpiexec -n N python -m mpisync.horovod",
}


class _Refusal(_abc.MetaPathFinder):
    """Refuses, with a message, every ``horovod.*`` module the stand-in does not have."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("horovod.") or fullname in _sys.modules:
            return None
        part = fullname.split(".")[1]
        what = _OTHERS.get(part, f"{fullname}: only horovod.torch is provided")
        raise ImportError(f"mpisync.horovod does not provide {what}", name=fullname)


def alias_horovod() -> None:
    """Make ``import horovod`` and ``import horovod.torch`` (as ``hvd``) give
    :mod:`mpisync.horovod` in this process, whether or not Horovod is installed."""
    import mpisync.horovod as hvd

    package = _types.ModuleType("horovod", "mpisync.horovod standing in for Horovod's package")
    package.__path__ = []  # a package: submodules come from sys.modules, or are refused
    package.__version__ = HOROVOD_API  # type: ignore[attr-defined]
    package.torch = hvd  # type: ignore[attr-defined]
    _sys.modules["horovod"] = package
    _sys.modules["horovod.torch"] = hvd
    if not any(isinstance(finder, _Refusal) for finder in _sys.meta_path):
        _sys.meta_path.insert(0, _Refusal())


def main(argv: list | None = None) -> int:
    """Run the script (or ``-m`` module) named in ``argv`` as ``__main__``, with the rest of
    ``argv`` as its ``sys.argv[1:]``; its ``SystemExit`` ends the process as it would alone."""
    args = list(_sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
        print(_USAGE, file=_sys.stderr if not args or args[0] == "-m" else _sys.stdout)
        return 2 if not args or args[0] == "-m" else 0
    alias_horovod()
    if args[0] == "-m":
        _sys.argv = [args[1], *args[2:]]
        _runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        _sys.argv = list(args)
        _sys.path.insert(0, _script_dir(args[0]))
        _runpy.run_path(args[0], run_name="__main__")
    return 0


def _script_dir(script: str) -> str:
    return _os.path.dirname(_os.path.abspath(script))
