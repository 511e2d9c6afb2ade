"""The mpisync command as a user meets it: installed (not editable) into a folder, run from outside
the repo.

One install per test session: ``pip install --no-deps --no-build-isolation
--no-index --target`` of a copy of the sources, with no C compiler (``CC=false``)
and a stale ``build/`` folder planted in the copy, so that the install also
shows that nothing from an earlier build is reused.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE", "mpisync")
STALE = "stale_module.py"
# The shortest broadcast workload run of ``mpisync bench``: one timed iteration of many-small.
ONE_SMALL_ITERATION = ("--workloads", "many-small", "--iterations", "1", "--warmup", "0")
# A development environment may hold an editable install of mpisync, whose import hook would fill in
# what the installed copy lacks (``mpisync._speedups``): a user's environment has none, so it goes.
_SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable___mpisync")]
"""


class Installed:
    """Where the install is, and how to run its ``mpisync`` command (from a folder outside the
    repo)."""

    def __init__(self, root: Path):
        self.root = root
        self.site = root / "site"
        self.home = root / "home"
        self.script = self.site / "bin" / "mpisync"
        # packages on PYTHONPATH first that fail to import: "not installed"
        self.hidden = root / "hidden"

    def env(self, base: dict, *, without: tuple = ()) -> dict:
        """``base`` running the installed copy; ``without`` names packages made unimportable."""
        env = dict(base)
        paths = [str(self.root / "shim"), str(self.site)]
        if without:
            hidden = self.hidden / "-".join(sorted(without))  # these only, not another test's
            for name in without:
                (hidden / name).mkdir(parents=True, exist_ok=True)
                (hidden / name / "__init__.py").write_text(
                    f"raise ImportError('{name} hidden by a test')\n"
                )
            paths.insert(0, str(hidden))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PATH"] = os.pathsep.join(
            [str(self.site / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")]
        )
        return env

    def run(
        self,
        args,
        base_env: dict,
        *,
        ranks: int = 0,
        without: tuple = (),
        timeout: float = 120,
        cwd=None,
    ):
        """``mpisync ARGS`` (under ``mpiexec -n RANKS`` if given), from ``home``."""
        cmd = (["mpiexec", "-n", str(ranks)] if ranks else []) + [str(self.script), *map(str, args)]
        env = self.env(base_env, without=without)
        if ranks:  # the launcher's own bound sits inside this call's, not at the fixture's default
            env["MPIEXEC_TIMEOUT"] = str(max(10, int(timeout) - 20))
        return subprocess.run(
            cmd, env=env, cwd=cwd or self.home, capture_output=True, text=True, timeout=timeout
        )


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=ignore)
        else:
            shutil.copy2(source, dest / name)


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """The package installed from a copy of this checkout, as ``pip install .`` does from a
    clone."""
    root = tmp_path_factory.mktemp("installed")
    src = root / "src"
    src.mkdir()
    _copy_sources(src)
    stale = (
        src / "build" / f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}" / "mpisync"
    )
    stale.mkdir(parents=True)
    (stale / STALE).write_text("raise RuntimeError('a stale build was reused')\n")
    (stale / ("_speedups" + sysconfig.get_config_var("EXT_SUFFIX"))).write_bytes(b"stale object")
    # no compiler: the extension is left out
    env = dict(os.environ, CC="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # Offline with the environment's setuptools; where it has none, pip fetches one to build with.
    offline = (
        ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            *offline,
            "--target",
            str(root / "site"),
            str(src),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = Installed(root)
    installed.home.mkdir()
    (root / "shim").mkdir()
    (root / "shim" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return installed
