"""The one rule for the command line's output files: a missing folder is created, as ``mkdir -p``
would (``bench --json/--csv/--plot``, ``tune --output``, ``timeline --out``;
``stage-checkpoint --to`` creates DEST's folder on each writer the same way), and the file is
written only where another user can neither redirect nor replace it
(:mod:`mpisync._runtime.safefiles`: no folder another user owns or may write into without the
sticky bit, no symbolic link at the file's name). Checked before any work: a folder that cannot
be created or is not safe, or an output path that is a folder or a symlink, is the command's
usage error."""

from __future__ import annotations

import os as _os

from .._runtime import safefiles

__all__ = ["prepare_output", "plot_format"]


def prepare_output(path: str | None, option: str) -> str:
    """Create the folder that is to hold the file ``path`` (given as ``option``) and check that
    it may be written there; return ``""``, or why the file cannot be written there."""
    if not path:
        return ""
    if _os.path.isdir(path) and not _os.path.islink(path):
        return f"{option} {path} is a folder; name the file to write"
    folder = _os.path.dirname(_os.path.abspath(path))
    try:
        safefiles.make_folder(folder)
    except OSError as exc:
        return f"{option} {path}: cannot create its folder {folder}: {exc.strerror or exc}"
    try:
        with safefiles.Folder(path) as opened:
            opened.check_final()
    except safefiles.UnsafePathError as exc:
        return f"{option}: {exc}"
    except OSError as exc:
        return f"{option} {path}: cannot open its folder {folder}: {exc.strerror or exc}"
    return ""


def plot_format(path: str) -> str:
    """The image format of ``path`` by its extension (``png`` without one): what matplotlib is
    told when it writes into a file object rather than to a path."""
    return _os.path.splitext(path)[1].lstrip(".").lower() or "png"
