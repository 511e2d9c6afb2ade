"""Only the optional C extension lives here; everything else is in setup.cfg and pyproject.toml.

``mpisync._speedups`` (the per-tensor loops of a repeated sync) is optional:
without a C compiler (or numpy's headers) the install goes on and mpisync runs the same program
with the Python form of each loop (mpisync/_runtime/pyloops.py).
Nothing from an earlier build is reused: a ``build/`` folder left by another
install (another version, another compiler) is emptied of mpisync's files
first, and the extension is always compiled afresh or left out.
"""

import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py


class FreshBuildPy(build_py):
    """Start from an empty ``build/lib*/mpisync``: no stale module or extension rides along."""

    def run(self):
        shutil.rmtree(os.path.join(self.build_lib, "mpisync"), ignore_errors=True)
        super().run()


class FreshBuildExt(build_ext):
    """Compile every time (no object reused); a failed optional build leaves no old extension
    behind."""

    def initialize_options(self):
        super().initialize_options()
        self.force = True

    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        if os.path.exists(target):
            os.remove(target)
        super().build_extension(ext)


def _bench_loop() -> list:
    """The bench's OSU loop, where an MPI wheel put mpi.h and libmpi in this environment."""
    include, lib = os.path.join(sys.prefix, "include"), os.path.join(sys.prefix, "lib")
    if not os.path.exists(os.path.join(include, "mpi.h")):
        return []
    return [
        Extension(
            "mpisync.tools.bench._osuloop",
            ["mpisync/tools/bench/_osuloop.c"],
            include_dirs=[include],
            library_dirs=[lib],
            runtime_library_dirs=[lib],
            libraries=["mpi"],
            optional=True,
        )
    ]


def _extensions() -> list:
    """The C loops, built against numpy's headers; none where numpy is not importable here."""
    try:
        import numpy
    except ImportError:
        return []
    return [
        Extension(
            "mpisync._speedups",
            ["mpisync/_speedups.c"],
            include_dirs=[numpy.get_include()],
            optional=True,
        )
    ] + _bench_loop()


setup(
    ext_modules=_extensions(),
    cmdclass={"build_py": FreshBuildPy, "build_ext": FreshBuildExt},
)
