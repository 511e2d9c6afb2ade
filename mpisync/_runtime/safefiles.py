"""Every file mpisync writes (trace files, staged checkpoints, the tuning file, the command line's
outputs) is written here, so that another user of a shared folder can neither redirect nor
replace it.

- **The folder.** The folder that is to hold the file is opened, and what was opened is checked
  (not the path again, which another user could change meanwhile): it must belong to this user
  or to root, and no other user may write into it, unless it has the sticky bit (``/tmp``), where
  nobody removes or renames what another user made. A folder that its group may write into is
  accepted only where that group is its owner's private group (no other member), as ssh's
  ``StrictModes`` accepts it on such systems. A missing folder is created, writable by its owner
  only.
- **The name.** The file is made under a fresh name in that folder (``O_CREAT | O_EXCL |
  O_NOFOLLOW``: nothing planted there is opened) and renamed over the final name (``rename``
  replaces a name, it never follows it): a reader sees the previous file or the whole new one.
  A final name that is a symbolic link is refused, as is one another user made in a sticky
  folder.
- **A refusal** is an :class:`UnsafePathError`, which names the path and why: an
  :class:`~mpisync.InvalidParamError` and a :class:`PermissionError`, so that code which treats
  an unwritable file as an ``OSError`` treats this one alike.
"""

from __future__ import annotations

import contextlib as _contextlib
import os as _os
import secrets as _secrets
import stat as _stat
import typing as _typing
from collections.abc import Iterator

from ..errors import InvalidParamError

__all__ = ["UnsafePathError", "Folder", "create", "make_folder", "replacing", "write"]

_O_CLOEXEC = getattr(_os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(_os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(_os, "O_DIRECTORY", 0)
# Permission bits a file mpisync writes never has: nobody else may change it.
_NOT_OTHERS_WRITE = ~0o022 & 0o7777
# The mode of a folder mpisync creates (before the umask): its owner's to write.
_FOLDER_MODE = 0o755


class UnsafePathError(InvalidParamError, PermissionError):
    """mpisync refuses to write a file where another user could redirect or replace it.

    Raised on the rank that writes, naming the path and why: a folder that another user owns,
    or that other users may write into without the sticky bit, or a final name that is a
    symbolic link or was made by another user in a sticky folder. An
    :class:`~mpisync.InvalidParamError` (a ``ValueError``) and a ``PermissionError`` (an
    ``OSError``).
    """


def _owner_name(uid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return None


def _private_group(gid: int, owner: int) -> bool:
    """Whether group ``gid`` is the private group of user ``owner``: its own name, no other
    member."""
    try:
        import grp

        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    name = _owner_name(owner)
    return name is not None and group.gr_name == name and set(group.gr_mem) <= {name}


def _folder_problem(info: _os.stat_result) -> str:
    """Why a folder of this ``fstat`` may not hold mpisync's files (``""``: it may)."""
    me = _os.geteuid()
    if info.st_uid not in (me, 0):
        return f"it belongs to another user (uid {info.st_uid}; this process runs as uid {me})"
    mode = _stat.S_IMODE(info.st_mode)
    if mode & 0o002 and not mode & _stat.S_ISVTX:
        return f"every user may write into it (mode {mode:04o}, no sticky bit)"
    if mode & 0o020 and not mode & _stat.S_ISVTX and not _private_group(info.st_gid, info.st_uid):
        return (
            f"its group (gid {info.st_gid}) may write into it (mode {mode:04o}, no sticky bit) "
            "and holds other users"
        )
    return ""


def _refuse(path: str, why: str) -> UnsafePathError:
    return UnsafePathError(f"mpisync: refusing to write {path}: {why}")


def make_folder(folder: str) -> None:
    """Create ``folder`` and its missing parents, as ``mkdir -p`` (``0755`` at most, less by the
    umask); an existing one is left as it is (:class:`Folder` checks the one it writes into)."""
    _os.makedirs(folder, mode=_FOLDER_MODE, exist_ok=True)


class Folder:
    """The folder that is to hold the file ``path``: created if missing, opened and checked
    (see the module's docstring). Names are relative to it from then on, so that a folder that
    another user swaps in under the same path later is never written.

    Raises:
        UnsafePathError: The folder is not safe, or ``path`` names a folder.
        OSError: The folder cannot be created or opened.
    """

    def __init__(self, path: str):
        self.path = path
        self.folder, self.name = _os.path.split(_os.path.abspath(path))
        if not self.name:
            raise _refuse(path, "it names a folder, not a file")
        make_folder(self.folder)
        self.fd = _os.open(self.folder, _os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            info = _os.fstat(self.fd)
            why = _folder_problem(info)
            if why:
                raise _refuse(path, f"its folder {self.folder} is not safe: {why}")
        except BaseException:
            self.close()
            raise
        self.sticky = bool(info.st_mode & _stat.S_ISVTX)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the folder (closing twice is harmless)."""
        if self.fd >= 0:
            _os.close(self.fd)
        self.fd = -1

    def check_final(self) -> None:
        """Refuse a final name that a rename must not replace: a symbolic link, a folder, or (in
        a sticky folder) a file of another user."""
        try:
            info = _os.lstat(self.name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        if _stat.S_ISLNK(info.st_mode):
            raise _refuse(self.path, "it is a symbolic link (mpisync never writes through one)")
        if _stat.S_ISDIR(info.st_mode):
            raise _refuse(self.path, "it is a folder; name the file to write")
        if self.sticky and info.st_uid != _os.geteuid():
            raise _refuse(
                self.path,
                f"it belongs to another user (uid {info.st_uid}) in a folder shared by all",
            )

    def temporary(self, mode: int = 0o644) -> tuple[int, str]:
        """A new file of the folder under a fresh hidden name (``O_EXCL | O_NOFOLLOW``; ``mode``
        less the umask and less write permission for others): ``(descriptor, name)``."""
        flags = _os.O_RDWR | _os.O_CREAT | _os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        while True:
            temporary = f".{self.name}.{_secrets.token_hex(6)}.mpisync-tmp"
            try:
                fd = _os.open(temporary, flags, mode & _NOT_OTHERS_WRITE, dir_fd=self.fd)
            except FileExistsError:
                continue
            return fd, temporary

    def replace(self, source: str, target: str | None = None) -> None:
        """Rename ``source`` over ``target`` (default: the final name), both names of the
        folder; the final name is checked again first."""
        if target is None:
            self.check_final()
        name = self.name if target is None else target
        _os.replace(source, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def link(self, source: str, target: str) -> None:
        """A hard link ``target`` to ``source`` (names of the folder; a symlink is linked as
        itself)."""
        _os.link(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)

    def remove(self, name: str) -> None:
        """Remove ``name`` from the folder (gone already: nothing to do)."""
        with _contextlib.suppress(FileNotFoundError):
            _os.unlink(name, dir_fd=self.fd)

    def exists(self, name: str) -> bool:
        """Whether the folder holds ``name`` (a dangling symlink too)."""
        try:
            _os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def sync(self) -> None:
        """``fsync`` the folder: its renames survive a crash."""
        _os.fsync(self.fd)


def create(path: str, mode: int = 0o644, initial: bytes = b"") -> int:
    """A new file that ``path`` names from now on, holding ``initial``: its descriptor, open for
    writing (the caller writes on and closes it).

    Made under a fresh name in ``path``'s folder, ``initial`` written, then renamed over
    ``path``: a reader never sees a file without ``initial``.

    Raises:
        UnsafePathError: ``path``'s folder or ``path`` itself is not safe (see the module's
            docstring); the message names the path and why.
        OSError: The folder cannot be created or written.
    """
    with Folder(path) as folder:
        folder.check_final()
        fd, temporary = folder.temporary(mode)
        try:
            view = memoryview(initial)
            while view:
                view = view[_os.write(fd, view) :]
            folder.replace(temporary)
        except BaseException:
            _os.close(fd)
            with _contextlib.suppress(OSError):
                folder.remove(temporary)
            raise
    return fd


@_contextlib.contextmanager
def replacing(
    path: str, mode: int = 0o644, *, text: bool = True, newline: str | None = None
) -> Iterator[_typing.IO]:
    """A file object to write ``path``'s new content into: renamed over ``path`` when the block
    ends, removed if it raises (``path`` keeps its previous content then). ``text``: a UTF-8 text
    file (``newline`` as :func:`open`'s), else binary.

    Raises:
        UnsafePathError: As :func:`create`, before anything is written.
        OSError: The folder cannot be created or written.
    """
    with Folder(path) as folder:
        folder.check_final()
        fd, temporary = folder.temporary(mode)
        try:
            handle: _typing.IO = (
                open(fd, "w", encoding="utf-8", newline=newline) if text else open(fd, "wb")
            )
        except BaseException:
            _os.close(fd)
            folder.remove(temporary)
            raise
        try:
            with handle:
                yield handle
                handle.flush()
                _os.fsync(handle.fileno())
            folder.replace(temporary)
        except BaseException:
            with _contextlib.suppress(OSError):
                folder.remove(temporary)
            raise


def write(path: str, data: bytes | str, mode: int = 0o644) -> None:
    """Write ``data`` (``str``: as UTF-8) to ``path`` whole or not at all (:func:`replacing`).

    Raises:
        UnsafePathError: As :func:`create`.
        OSError: The folder cannot be created or written.
    """
    raw = data.encode() if isinstance(data, str) else data
    with replacing(path, mode, text=False) as handle:
        handle.write(raw)
