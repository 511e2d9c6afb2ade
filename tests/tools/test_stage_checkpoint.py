"""stage-checkpoint: root's file reaches every writer intact, or no DEST exists anywhere.

The command-line tests run the installed package (see cliutil); the tests
marked ``mpi`` call :func:`mpisync.tools.stage_checkpoint.stage_checkpoint` on every rank.
"""

import json
import os
import pickle
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from mpiutil import last_rank, need_ranks, raises_everywhere

launcher = pytest.mark.launcher


def _safetensors(path: Path, tensors: dict) -> bytes:
    header, blobs, offset = {"__metadata__": {"format": "np"}}, [], 0
    for name, array in tensors.items():
        raw = array.tobytes()
        header[name] = {
            "dtype": {"float32": "F32", "int64": "I64"}[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    data = struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)
    path.write_bytes(data)
    return data


def _stage(installed, env, n, src, dest, *extra, timeout=120):
    return installed.run(
        ["stage-checkpoint", src, "--to", dest, "--no-progress", *extra],
        env,
        ranks=n,
        timeout=timeout,
    )


@launcher
def test_npz_to_every_rank_in_small_chunks(installed, bounded_env, tmp_path):
    src = tmp_path / "ckpt.npz"
    np.savez(src, w=np.arange(300_000, dtype=np.float32), b=np.ones((7, 3)))
    proc = _stage(
        installed,
        bounded_env,
        3,
        src,
        tmp_path / "local{rank}" / "ckpt.npz",
        "--per-rank",
        "--chunk-mb",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{src.stat().st_size} bytes to 3 writers" in proc.stdout and "verified" in proc.stdout
    for rank in range(3):
        assert (tmp_path / f"local{rank}" / "ckpt.npz").read_bytes() == src.read_bytes()
    assert not list(tmp_path.rglob("*mpisync-tmp*"))


@launcher
def test_safetensors_one_writer_per_node_at_node_index(installed, bounded_env, tmp_path):
    data = _safetensors(
        tmp_path / "model.safetensors",
        {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": np.array([5], dtype=np.int64)},
    )
    proc = _stage(
        installed,
        bounded_env,
        2,
        tmp_path / "model.safetensors",
        tmp_path / "node{node}-{host}" / "model.safetensors",
    )
    assert proc.returncode == 0, proc.stderr
    assert "to 1 writer in" in proc.stdout  # both ranks share this machine's memory: one node
    assert (tmp_path / f"node0-{socket.gethostname()}" / "model.safetensors").read_bytes() == data


@launcher
def test_any_file_is_copied_as_bytes_with_its_permission_bits(installed, bounded_env, tmp_path):
    src = tmp_path / "model.pt"  # a pickle: copied, never loaded
    src.write_bytes(pickle.dumps({"w": list(range(1000))}) * 50)
    os.chmod(src, 0o600)
    proc = installed.run(
        [
            "stage-checkpoint",
            src,
            "--to",
            tmp_path / "out" / "{rank}" / "model.pt",
            "--per-rank",
            "--chunk-mb",
            "1",
        ],
        bounded_env,
        ranks=2,
        without=("tqdm",),
    )
    assert proc.returncode == 0, proc.stderr
    for rank in range(2):
        dest = tmp_path / "out" / str(rank) / "model.pt"
        assert dest.read_bytes() == src.read_bytes() and (dest.stat().st_mode & 0o777) == 0o600
    size = src.stat().st_size
    # plain progress, total
    assert f"stage-checkpoint: {size / 1e3:.1f} kB/{size / 1e3:.1f} kB (100%)" in proc.stderr


@launcher
def test_a_symlink_planted_at_dest_is_refused_not_followed(installed, bounded_env, tmp_path):
    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(100_000))
    victim = tmp_path / "victim.txt"
    victim.write_text("must stay")
    (tmp_path / "out").mkdir()
    dest = tmp_path / "out" / "ckpt.bin"
    dest.symlink_to(victim)
    for name in [
        f"ckpt.bin.mpisync-tmp-{pid}" for pid in range(os.getpid() - 50, os.getpid() + 500)
    ]:
        (tmp_path / "out" / name).symlink_to(victim)  # the old, predictable temporary names
    proc = _stage(installed, bounded_env, 2, src, dest)
    assert proc.returncode == 1, proc.stderr
    assert f"refusing to write {dest}: it is a symbolic link" in proc.stderr, proc.stderr
    assert "no DEST was written" in proc.stderr
    assert victim.read_text() == "must stay"
    assert dest.is_symlink() and os.readlink(dest) == str(victim)
    assert not list((tmp_path / "out").glob("*mpisync-tmp"))


@launcher
@pytest.mark.parametrize("kind", ["list-header", "deep-header", "long-header", "missing"])
def test_malformed_or_missing_checkpoint_fails_every_rank_at_once(
    installed, bounded_env, tmp_path, kind
):
    src = tmp_path / "model.safetensors"
    header = {"list-header": b"[1, 2, 3]", "deep-header": b"[" * 100_000 + b"]" * 100_000}.get(
        kind, b"{}"
    )
    if kind == "long-header":
        src.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    elif kind != "missing":
        src.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    expected = {
        "list-header": "the header is a JSON list, not an object",
        "deep-header": "the header's JSON nests too deeply",
        "long-header": "does not fit the file",
        "missing": "does not exist",
    }[kind]
    start = time.monotonic()
    proc = _stage(
        installed,
        dict(bounded_env, MPISYNC_TIMEOUT="300"),
        3,
        src,
        tmp_path / "out" / "{rank}" / src.name,
        "--per-rank",
    )
    # every rank exits 1: none aborted, none waited
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert expected in proc.stderr and proc.stderr.count("mpisync stage-checkpoint: error:") == 1, (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
    assert time.monotonic() - start < 60


@launcher
def test_failing_writer_leaves_no_partial_dest_anywhere(installed, bounded_env, tmp_path):
    src = tmp_path / "ckpt.npz"
    np.savez(src, w=np.arange(200_000, dtype=np.float64))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "2").write_text("a file where rank 2 needs a folder")
    proc = _stage(
        installed,
        bounded_env,
        3,
        src,
        tmp_path / "out" / "{rank}" / "ckpt.npz",
        "--per-rank",
        "--chunk-mb",
        "1",
    )
    assert proc.returncode == 1
    assert (
        "checkpoint staging failed before streaming; no DEST was written: rank 2 (node 0, "
        f"{socket.gethostname()}): FileExistsError"
    ) in proc.stderr, proc.stderr
    assert not list((tmp_path / "out").rglob("ckpt.npz*")) and not list(
        (tmp_path / "out").rglob(".ckpt*")
    )


# -- in-process, every rank: the same error everywhere ------------------------------------------


def _source_and_previous_dests(
    folder: Path, comm, source, previous: bytes
) -> tuple[Path, Path, Path]:
    """In the shared ``folder``, ``ckpt.bin`` written by root with ``source()``, and this rank's
    ``out{rank}/ckpt.bin`` holding ``previous``: (folder, source path, this rank's DEST)."""
    src = folder / "ckpt.bin"
    if comm.rank == 0:
        src.write_bytes(source())
    comm.Barrier()
    mine = folder / f"out{comm.rank}" / "ckpt.bin"
    mine.parent.mkdir()
    mine.write_bytes(previous)
    return folder, src, mine


def _a_rename_failing_on_the_last_rank(
    folder: Path, comm, monkeypatch, source_bytes: int, previous: bytes
):
    """Root's random ``ckpt.bin`` of ``source_bytes``, each rank's DEST holding ``previous``, and
    the last rank's rename into its DEST failing (disk full): (the staging module, the last rank,
    SRC, the DEST template, this rank's DEST)."""
    need_ranks(comm, 2)
    import mpisync.tools.stage_checkpoint as staging

    bad = last_rank(comm)
    folder, src, mine = _source_and_previous_dests(
        folder, comm, lambda: os.urandom(source_bytes), previous
    )
    real_replace = os.replace

    def failing_replace(a, b, *args, **kwargs):
        # DEST's name in its folder (renames are relative to the folder opened)
        if comm.rank == bad and str(b) in (str(mine), mine.name):
            raise OSError(28, "No space left on device (simulated)")
        return real_replace(a, b, *args, **kwargs)

    monkeypatch.setattr(staging._os, "replace", failing_replace)
    return staging, bad, src, str(folder / "out{rank}" / "ckpt.bin"), mine


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["list-header", "deep-header"])
def test_malformed_header_on_root_is_the_same_error_everywhere(comm, kind, shared_folder):
    folder = shared_folder
    src = folder / "model.safetensors"
    if comm.rank == 0:
        header = b"[[1]]" if kind == "list-header" else b'{"a":' * 50_000 + b"1" + b"}" * 50_000
        src.write_bytes(struct.pack("<Q", len(header)) + header)
    comm.Barrier()
    from mpisync.tools.stage_checkpoint import stage_checkpoint

    expected = "not an object" if kind == "list-header" else "nests too deeply"
    raises_everywhere(
        comm,
        __import__("mpisync").InvalidParamError,
        lambda: stage_checkpoint(
            str(src), str(folder / "out{rank}" / "m.safetensors"), comm, per_rank=True
        ),
        expected,
    )
    comm.Barrier()
    assert not list(folder.glob("out*"))


@pytest.mark.mpi
def test_a_rename_failing_on_one_writer_rolls_the_others_back(comm, monkeypatch, shared_folder):
    staging, bad, src, template, mine = _a_rename_failing_on_the_last_rank(
        shared_folder, comm, monkeypatch, 300_000, b"the previous checkpoint of rank %d" % comm.rank
    )
    raises_everywhere(
        comm,
        __import__("mpisync").SyncError,
        lambda: staging.stage_checkpoint(
            str(src), template, comm, per_rank=True, chunk_bytes=1 << 16
        ),
        "checkpoint staging failed while renaming into place",
        f"rank {bad} (node 0",
        "No space left on device (simulated)",
        "rolled back on every other writer: no DEST was written",
    )
    monkeypatch.undo()
    # the old one is back
    assert mine.read_bytes() == b"the previous checkpoint of rank %d" % comm.rank
    # no temporary or backup left
    assert sorted(p.name for p in mine.parent.iterdir()) == ["ckpt.bin"]


@pytest.mark.mpi
def test_a_roll_back_without_hard_links_says_the_previous_dest_is_gone(
    comm, monkeypatch, shared_folder
):
    staging, bad, src, template, mine = _a_rename_failing_on_the_last_rank(
        shared_folder, comm, monkeypatch, 100_000, b"previous %d" % comm.rank
    )

    def no_hard_links(*args, **kwargs):
        raise OSError(95, "Operation not supported (simulated)")

    monkeypatch.setattr(staging._os, "link", no_hard_links)
    message = raises_everywhere(
        comm,
        __import__("mpisync").SyncError,
        lambda: staging.stage_checkpoint(str(src), template, comm, per_rank=True),
        "not everything could be rolled back",
        "could not be kept (no hard links here)",
    )
    monkeypatch.undo()
    assert "no DEST was written" not in message
    if comm.rank == bad:  # its rename failed: the previous DEST is untouched
        assert mine.read_bytes() == b"previous %d" % comm.rank
    else:  # renamed, then rolled back with no backup: gone, and the message names this rank
        assert not mine.exists() and f"rank {comm.rank} (node 0)" in message


@pytest.mark.mpi
def test_a_source_rewritten_while_it_streams_writes_no_dest(comm, monkeypatch, shared_folder):
    # A save rewriting SRC in place while root streams it: the bytes sent mix two versions, and the
    # digests of what was sent still match; root finds SRC changed and no DEST is written.
    import mpisync.tools.stage_checkpoint as staging

    folder, src, mine = _source_and_previous_dests(
        shared_folder, comm, lambda: b"\1" * (16 << 20), b"previous %d" % comm.rank
    )
    if comm.rank == 0:
        real_stream = staging._stream

        class Rewritten:  # the file object root reads, rewritten on disk after its first chunk
            def __init__(self, source):
                self.source, self.reads = source, 0

            def readinto(self, view):
                got = self.source.readinto(view)
                self.reads += 1
                if self.reads == 1:
                    time.sleep(0.05)  # a later tick of the file system's clock
                    with open(src, "r+b") as f:
                        f.write(b"\2" * (16 << 20))
                return got

        def stream(comm_, call, syncer, source, *args):
            return real_stream(comm_, call, syncer, Rewritten(source), *args)

        monkeypatch.setattr(staging, "_stream", stream)
    raises_everywhere(
        comm,
        __import__("mpisync").SyncError,
        lambda: staging.stage_checkpoint(
            str(src),
            str(folder / "out{rank}" / "ckpt.bin"),
            comm,
            per_rank=True,
            chunk_bytes=1 << 20,
        ),
        "checkpoint staging failed while streaming; no DEST was written",
        "changed while it streamed",
    )
    assert mine.read_bytes() == b"previous %d" % comm.rank
    assert sorted(p.name for p in mine.parent.iterdir()) == ["ckpt.bin"]


@pytest.mark.mpi
def test_a_dest_folder_that_another_user_may_write_into_is_refused_everywhere(comm, shared_folder):
    """``--to <shared>/ckpt/latest.bin`` where another user made ``ckpt/`` writable by all (no
    sticky bit): that user could replace the staged checkpoint, so no rank writes it, and every
    rank raises the same error naming the path and why. Tests run as root: "another user" is a
    folder chown'ed to nobody."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")  # the same on every rank
    from mpisync.tools.stage_checkpoint import stage_checkpoint

    folder = shared_folder
    src = folder / "ckpt.bin"
    shared = folder / "ckpt"
    if comm.rank == 0:
        src.write_bytes(os.urandom(50_000))
        shared.mkdir()
        os.chown(shared, 65534, 65534)
        os.chmod(shared, 0o777)
    comm.Barrier()
    dest = shared / "latest.bin"
    raises_everywhere(
        comm,
        __import__("mpisync").SyncError,
        lambda: stage_checkpoint(str(src), str(dest), comm),
        "checkpoint staging failed before streaming; no DEST was written",
        f"refusing to write {dest}: its folder {shared} is not safe: it belongs to another user "
        "(uid 65534",
    )
    comm.Barrier()
    assert list(shared.iterdir()) == []


@pytest.mark.mpi
def test_a_dest_folder_of_ours_writable_by_all_is_refused_and_a_sticky_one_taken(
    comm, shared_folder
):
    from mpisync.tools.stage_checkpoint import stage_checkpoint

    folder = shared_folder
    src = folder / "ckpt.bin"
    shared = folder / "open"
    if comm.rank == 0:
        src.write_bytes(os.urandom(50_000))
        os.chmod(src, 0o666)  # copied less write permission for others
        shared.mkdir()
        os.chmod(shared, 0o777)
    comm.Barrier()
    dest = shared / "latest.bin"
    raises_everywhere(
        comm,
        __import__("mpisync").SyncError,
        lambda: stage_checkpoint(str(src), str(dest), comm),
        f"its folder {shared} is not safe: every user may write into it (mode 0777, no sticky bit)",
    )
    comm.Barrier()
    if comm.rank == 0:
        os.chmod(shared, 0o1777)  # as /tmp: nobody removes or renames another user's files
    comm.Barrier()
    stage_checkpoint(str(src), str(dest), comm)
    comm.Barrier()
    assert dest.read_bytes() == src.read_bytes() and dest.stat().st_mode & 0o777 == 0o644
