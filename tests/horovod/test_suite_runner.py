"""ci/horovod_suite.py: the resolver package and the reading of a test's job output."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("horovod_suite", ROOT / "ci" / "horovod_suite.py")
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)


def test_resolver_makes_horovod_torch_mpisync_horovod(tmp_path, bounded_env):
    suite.write_resolver(tmp_path)
    code = (
        "import horovod.torch as hvd, mpisync.horovod as m\n"
        "from horovod.runner.util.threads import in_thread\n"
        "import mock\n"
        "assert hvd is m and in_thread(target=lambda: None).daemon\n"
        "print('ok')"
    )
    # this job's environment without its launcher's wiring: the child is an MPI singleton
    env = dict(bounded_env, PYTHONPATH=f"{tmp_path}:{ROOT}")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_outcomes_are_read_from_the_job_output():
    assert suite.classify(0, "1 passed in 2.0s\n1 passed in 2.1s") == ("pass", "")
    skipped = "SKIPPED [1] test_torch.py:99: No GPUs available\n1 skipped in 1s"
    assert suite.classify(0, skipped) == ("skip", "No GPUs available")
    failed = "E   AssertionError: wrong\nE   more\n1 failed, 0 passed"
    assert suite.classify(1, failed) == ("fail", "AssertionError: wrong")
    assert suite.classify(124, "still running")[0] == "hang"


def test_test_names_are_the_torch_tests_in_file_order(tmp_path):
    path = tmp_path / "test_torch.py"
    path.write_text(
        "class TorchTests:\n    def test_b(self): pass\n    def helper(self): pass\n"
        "    def test_a(self): pass\n"
    )
    assert suite.test_names(path) == ["test_b", "test_a"]
