"""stage-checkpoint: root's file reaches every writer intact, or no DEST exists anywhere."""

import json
import pickle
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.launcher


def _safetensors(path: Path, tensors: dict) -> bytes:
    header, blobs, offset = {"__metadata__": {"format": "np"}}, [], 0
    for name, array in tensors.items():
        raw = array.tobytes()
        header[name] = {"dtype": {"float32": "F32", "int64": "I64"}[array.dtype.name], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    data = struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)
    path.write_bytes(data)
    return data


def _stage(env, n, src, dest, *extra, timeout=120):
    cmd = ["mpiexec", "-n", str(n), "mpisync", "stage-checkpoint", str(src), "--to", str(dest), "--no-progress", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_npz_to_every_rank_in_small_chunks(bounded_env, tmp_path):
    src = tmp_path / "ckpt.npz"
    np.savez(src, w=np.arange(300_000, dtype=np.float32), b=np.ones((7, 3)))
    proc = _stage(bounded_env, 3, src, tmp_path / "local{rank}" / "ckpt.npz", "--per-rank", "--chunk-mb", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"{src.stat().st_size} bytes to 3 writer(s)" in proc.stdout and "verified" in proc.stdout
    for rank in range(3):
        assert (tmp_path / f"local{rank}" / "ckpt.npz").read_bytes() == src.read_bytes()
    assert not list(tmp_path.rglob("*mpisync-tmp*"))


def test_safetensors_one_writer_per_node(bounded_env, tmp_path):
    data = _safetensors(tmp_path / "model.safetensors", {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                                                          "step": np.array([5], dtype=np.int64)})
    proc = _stage(bounded_env, 2, tmp_path / "model.safetensors", tmp_path / "node" / "model.safetensors")
    assert proc.returncode == 0, proc.stderr
    assert "to 1 writer(s)" in proc.stdout  # both ranks share this machine's memory: one node
    assert (tmp_path / "node" / "model.safetensors").read_bytes() == data


@pytest.mark.parametrize("kind", ["pickle", "object-npz", "bad-header"])
def test_unsafe_or_corrupt_checkpoints_are_refused(bounded_env, tmp_path, kind):
    if kind == "pickle":
        src = tmp_path / "model.pt"
        src.write_bytes(pickle.dumps({"w": [1, 2, 3]}))
        expected = "only .safetensors and .npz are staged"
    elif kind == "object-npz":
        src = tmp_path / "model.npz"
        np.savez(src, ok=np.zeros(3), bad=np.array([{"a": 1}, None], dtype=object))
        expected = "holds Python objects (a pickle); refused"
    else:
        src = tmp_path / "model.safetensors"
        src.write_bytes(struct.pack("<Q", 10**9) + b"{}")
        expected = "does not fit the file"
    proc = _stage(bounded_env, 2, src, tmp_path / "out" / "{rank}" / src.name, "--per-rank")
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_failing_writer_leaves_no_partial_dest_anywhere(bounded_env, tmp_path):
    src = tmp_path / "ckpt.npz"
    np.savez(src, w=np.arange(200_000, dtype=np.float64))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "2").write_text("a file where rank 2 needs a folder")
    proc = _stage(bounded_env, 3, src, tmp_path / "out" / "{rank}" / "ckpt.npz", "--per-rank", "--chunk-mb", "1")
    assert proc.returncode != 0
    assert "checkpoint staging failed before streaming; no DEST was written: rank 2 cannot write" in proc.stderr
    assert not list((tmp_path / "out").rglob("ckpt.npz*"))
