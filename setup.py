"""Only the optional C extension lives here; everything else is in setup.cfg and pyproject.toml.

``mpisync._speedups`` (the per-tensor loops of a repeated sync) is optional:
without a C compiler the install goes on and mpisync uses its Python paths.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpisync._speedups", ["mpisync/_speedups.c"], optional=True)])
