"""examples/horovod_train.py, a Horovod PyTorch script, with Horovod's own import line: run at 2
ranks on mpisync.horovod, it ends where one process training on the whole data ends."""

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
# a stand-in for Horovod's package: "horovod.torch" is mpisync.horovod
SHIM = "import sys\n\nimport mpisync.horovod\n\nsys.modules[__name__] = mpisync.horovod\n"


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
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")
    (tmp_path / "horovod" / "torch.py").write_text(SHIM)
    env = dict(bounded_env, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    two = _run(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
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
