"""The writer of every mpisync file: no symlink followed, no folder another user may write into
(unless sticky, as /tmp), a whole file under its final name or none; a refusal names the path
and why. Tests run as root: "another user" is uid 65534 (nobody), given a folder by chown."""

import os
import stat

import pytest

import mpisync
from mpisync._runtime import safefiles
from mpisync._runtime.safefiles import UnsafePathError

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _refused(path, *parts) -> str:
    with pytest.raises(UnsafePathError) as info:
        safefiles.write(str(path), b"mine")
    message = str(info.value)
    assert message.startswith(f"mpisync: refusing to write {path}: "), message
    for part in parts:
        assert part in message, message
    return message


def test_a_refusal_is_an_mpisync_error_and_an_os_error():
    assert issubclass(UnsafePathError, mpisync.InvalidParamError)
    assert issubclass(UnsafePathError, PermissionError)


@as_root
def test_a_folder_of_another_user_writable_by_all_with_a_planted_symlink(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    os.chmod(shared, 0o777)
    victim = tmp_path / "victim"
    victim.write_bytes(b"must stay")
    (shared / "trace.rank0.json").symlink_to(victim)
    _refused(
        shared / "trace.rank0.json", f"its folder {shared} is not safe", "another user (uid 65534"
    )
    with pytest.raises(UnsafePathError):
        safefiles.create(str(shared / "trace.rank0.json"))
    assert victim.read_bytes() == b"must stay"
    assert sorted(p.name for p in shared.iterdir()) == ["trace.rank0.json"]


@as_root
def test_a_folder_of_another_user_even_closed_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    _refused(theirs / "f", "belongs to another user (uid 65534")
    assert list(theirs.iterdir()) == []


def test_our_folder_writable_by_all_is_refused_and_with_the_sticky_bit_taken(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    _refused(shared / "f", "every user may write into it (mode 0777, no sticky bit)")
    assert list(shared.iterdir()) == []
    os.chmod(shared, 0o1777)
    safefiles.write(str(shared / "f"), b"mine")
    assert (shared / "f").read_bytes() == b"mine"


@as_root
def test_in_a_sticky_folder_a_file_of_another_user_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    planted = shared / "f"
    planted.write_bytes(b"theirs")
    os.chown(planted, NOBODY, NOBODY)
    _refused(planted, "belongs to another user (uid 65534) in a folder shared by all")
    assert planted.read_bytes() == b"theirs"


@as_root
def test_a_group_writable_folder_shared_with_a_group_is_refused(tmp_path):
    import grp

    shared = tmp_path / "group"
    shared.mkdir()
    others = [g for g in grp.getgrall() if g.gr_name != "root" and g.gr_gid != 0]
    if not others:
        pytest.skip("no group but root's")
    os.chown(shared, 0, others[0].gr_gid)
    os.chmod(shared, 0o775)
    _refused(shared / "f", f"its group (gid {others[0].gr_gid}) may write into it")


def test_a_symlink_at_the_name_is_refused_in_our_own_folder(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"must stay")
    (tmp_path / "out.json").symlink_to(victim)
    _refused(tmp_path / "out.json", "it is a symbolic link")
    assert victim.read_bytes() == b"must stay" and (tmp_path / "out.json").is_symlink()


def test_a_whole_file_under_its_name_with_its_mode_and_no_temporary_left(tmp_path):
    target = tmp_path / "new" / "deeper" / "out.json"
    safefiles.write(str(target), "first")
    assert target.read_text() == "first"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o755 & ~_umask()
    inode = target.stat().st_ino
    with pytest.raises(RuntimeError), safefiles.replacing(str(target)) as f:
        f.write("half")
        raise RuntimeError("the writer fails")
    assert target.read_text() == "first"  # the previous file, untouched
    safefiles.write(str(target), b"second", 0o600)
    assert target.read_bytes() == b"second" and target.stat().st_ino != inode  # renamed over
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_create_names_a_file_holding_its_first_bytes(tmp_path):
    target = tmp_path / "trace.json"
    target.write_bytes(b"an old trace")
    fd = safefiles.create(str(target), 0o666, b'{"a": [')
    try:
        assert target.read_bytes() == b'{"a": ['  # the old one replaced, not truncated in place
        os.write(fd, b"1]}")
    finally:
        os.close(fd)
    assert target.read_bytes() == b'{"a": [1]}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()  # never others' to write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
