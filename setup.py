"""Only the optional C extension lives here; everything else is in setup.cfg and pyproject.toml.

``mpisync._speedups`` (the per-tensor loops of a repeated sync) is optional:
without a C compiler the install goes on and mpisync uses its Python paths.
Nothing from an earlier build is reused: a ``build/`` folder left by another
install (another version, another compiler) is emptied of mpisync's files
first, and the extension is always compiled afresh or left out.
"""

import os
import shutil

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


setup(
    ext_modules=[Extension("mpisync._speedups", ["mpisync/_speedups.c"], optional=True)],
    cmdclass={"build_py": FreshBuildPy, "build_ext": FreshBuildExt},
)
