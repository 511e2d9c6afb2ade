"""A script that ends with the backend's threads busy: they end before the interpreter
finalizes, and the process exits cleanly."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.launcher  # each starts a process of its own: the plain pass runs them

# The exit handler registered first runs last: after mpisync's own.
SCRIPT = """
import atexit, threading

def report():
    alive = sorted(t.name for t in threading.enumerate()
                   if t.name in ("mpisync-worker", "mpisync-settler") and t.is_alive())
    print("alive at exit:", alive, flush=True)

atexit.register(report)

import torch
import torch.distributed as dist
import mpisync.torch

mpisync.torch.init_process_group()
t = torch.ones(4096)
works = [dist.all_reduce(t, async_op=True) for _ in range(2000)]
works[-1].get_future().then(lambda f: None)  # the worker drives, a settler settles
print("submitted", flush=True)
"""


def test_the_threads_end_before_the_interpreter_finalizes(bounded_env):
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=bounded_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["submitted", "alive at exit: []"], proc.stdout
    assert "terminate called" not in proc.stderr
