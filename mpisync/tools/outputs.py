"""The one rule for the command line's output files: a missing folder is created, as ``mkdir -p``
would (``bench --json/--csv/--plot``, ``tune --output``, ``timeline --out``;
``stage-checkpoint --to`` creates DEST's folder on each writer the same way). Checked before any
work: a folder that cannot be created, or an output path that is a folder, is the command's
usage error."""

from __future__ import annotations

import os as _os

__all__ = ["prepare_output"]


def prepare_output(path: str | None, option: str) -> str:
    """Create the folder that is to hold the file ``path`` (given as ``option``); return ``""``,
    or why the file cannot be written there."""
    if not path:
        return ""
    if _os.path.isdir(path):
        return f"{option} {path} is a folder; name the file to write"
    folder = _os.path.dirname(_os.path.abspath(path))
    try:
        _os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        return f"{option} {path}: cannot create its folder {folder}: {exc.strerror or exc}"
    return ""
