"""examples/horovod_train.py, a Horovod PyTorch script, with Horovod's own import line: run at 2
ranks by ``python -m mpisync.horovod``, it ends where one process training on the whole data
ends; and the runner's stand-in for Horovod's package exists in that process only."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.launcher
ROOT = Path(__file__).resolve().parents[2]
torch = pytest.importorskip("torch")

MPISYNC_IMPORT = "import mpisync.horovod as hvd  # Horovod: import horovod.torch as hvd"


def _run(cmd, env):
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_horovod_script_unchanged_matches_one_process_on_all_the_data(bounded_env, tmp_path):
    source = (ROOT / "examples" / "horovod_train.py").read_text()
    code = source.split('"""', 2)[2]  # after the module's docstring: Horovod's API alone
    assert code.count(MPISYNC_IMPORT) == 1 and "mpisync" not in code.replace(MPISYNC_IMPORT, "")
    script = tmp_path / "horovod_script.py"
    script.write_text(source.replace(MPISYNC_IMPORT, "import horovod.torch as hvd"))
    env = dict(bounded_env, PYTHONPATH=str(ROOT))
    two = _run(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
            "-m",
            "mpisync.horovod",
            str(script),
            "--epochs",
            "2",
            "--save",
            str(tmp_path / "two.npz"),
        ],
        env,
    )
    # (the ranks' lines may share a line of the launcher's output: found wherever they are)
    digests = sorted(re.findall(r"rank (\d+)/(\d+): parameters ([0-9a-f]+)", two))
    assert [(rank, size) for rank, size, _ in digests] == [("0", "2"), ("1", "2")], two
    assert len({digest for _, _, digest in digests}) == 1, two  # the same on both ranks
    assert two.count("Test set: Average loss") == 2, two
    # One process, the global batch (2 x 16) and the learning rate the script scaled by size.
    one = _run(
        [
            sys.executable,
            "examples/horovod_train.py",
            "--epochs",
            "2",
            "--batch-size",
            "32",
            "--lr",
            "0.1",
            "--save",
            str(tmp_path / "one.npz"),
        ],
        env,
    )
    assert "rank 0/1: parameters" in one
    with np.load(tmp_path / "two.npz") as a, np.load(tmp_path / "one.npz") as b:
        assert (
            sorted(a.files)
            == sorted(b.files)
            == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
        )
        # float32 sums in another order: equal to a few ulps of the values trained
        worst = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
        assert worst < 1e-5, worst
    torch.manual_seed(42)
    start = torch.nn.Linear(20, 64).weight.detach().numpy()
    with np.load(tmp_path / "two.npz") as a:
        assert float(np.abs(a["fc1.weight"] - start).max()) > 1e-2  # it did train


HOROVOD_SCRIPT = """
import sys

import horovod
import torch

import horovod.torch as hvd

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}: sum {total.item()}, argv {sys.argv[1:]}, "
      f"horovod {horovod.__version__}, {__name__}", flush=True)
try:
    import horovod.tensorflow  # noqa: F401
except ImportError as exc:
    print(f"rank {hvd.rank()}: refused: {exc}", flush=True)
"""


@pytest.mark.parametrize("form", ["script", "module"])
def test_the_runner_resolves_horovod_torch_in_its_process_only(bounded_env, tmp_path, form):
    (tmp_path / "hvd_job.py").write_text(HOROVOD_SCRIPT)
    env = dict(bounded_env, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    target = [str(tmp_path / "hvd_job.py")] if form == "script" else ["-m", "hvd_job"]
    out = _run(
        ["mpiexec", "-n", "2", sys.executable, "-m", "mpisync.horovod", *target, "--x", "1"], env
    )
    for rank in (0, 1):
        assert f"rank {rank} of 2: sum 3.0, argv ['--x', '1'], horovod 0.28.1, __main__" in out, out
        assert (
            f"rank {rank}: refused: mpisync.horovod does not provide TensorFlow: "
            "mpisync.horovod is Horovod's PyTorch API only" in out
        ), out
    alone = subprocess.run(
        [sys.executable, "-c", "import mpisync.horovod, horovod"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 1 and "No module named 'horovod'" in alone.stderr, alone.stderr


def test_the_runner_without_a_script_prints_its_usage(bounded_env):
    proc = subprocess.run(
        [sys.executable, "-m", "mpisync.horovod"],
        env=dict(bounded_env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m mpisync.horovod")
