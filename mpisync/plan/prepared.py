"""A validated parameter set with its compiled programs, reusable while the same arrays come
back."""

from __future__ import annotations

import collections.abc as _abc
import dataclasses as _dc
import operator as _operator

from .._runtime.speedups import loops
from ..params.bulk import scan
from ..params.manifest import build_manifest
from ..params.recheck import Snapshot, unchanged

__all__ = [
    "Prepared",
    "Recognizer",
    "all_smaller",
    "devices_key_of",
    "find_manifest",
    "matching",
    "recognizer",
]


def devices_key_of(devices):
    """``devices`` as a recognizer compares it: a sequence as a tuple, anything else as it is."""
    if devices is not None and isinstance(devices, _abc.Sequence):
        return tuple(devices)
    return devices


class Recognizer:
    """What recognises a prepared parameter set when it comes back: the same keys and the same
    array objects (held, so never recycled), under the same ``devices``, each array still at the
    address and with the shape, strides, dtype and writability it was prepared with (see
    :mod:`mpisync.params.recheck`). ``ParamSync`` and ``GradSync`` both reuse through it."""

    __slots__ = ("values", "keys", "devices", "state", "version")

    def __init__(self, values: tuple, keys: tuple, devices, state: Snapshot):
        self.values, self.keys, self.devices, self.state = values, keys, devices, state
        self.version: tuple = (None, -1)  # (the dict last matched, its version tag)

    def matches(self, params, devices) -> bool:
        """Whether ``params`` holds exactly the arrays prepared, each still as it was prepared."""
        if devices != self.devices or not isinstance(params, _abc.Mapping):
            return False
        if type(params) is dict:
            # An unchanged version tag means no entry changed: the walk over the entries is skipped.
            version = loops.dict_version(params)
            if version == -1 or version != self.version[1] or params is not self.version[0]:
                if not loops.same_items(params, self.keys, self.values):
                    return False
                self.version = (params, version)
        elif tuple(params) != self.keys or not all(
            map(_operator.is_, params.values(), self.values)
        ):
            return False
        return unchanged(self.values, self.state)


@_dc.dataclass
class Prepared:
    """What a sync compiled for one parameter set and one transport."""

    recognizer: Recognizer | None  # None: not kept (replica lists, a one-shot sync)
    manifest: object
    layout: object  # this rank's (params.layout.Layout)
    # the layout the plan follows: this rank's when every rank's agreed, else NO_RUNS
    agreed: object
    channel: str  # the host transport the program is for
    program: object  # that transport's compiled program
    fused_buckets: int
    transfers: int  # host plan steps; device steps are added when they run
    device_steps: list
    host_bytes: int
    small: bool  # every host tensor smaller than fusion_bytes


def matching(prepared, params, devices_key):
    """``prepared`` (a syncer's kept set, with its ``recognizer``) when ``params`` under
    ``devices_key`` still holds exactly its arrays, each as it was prepared, else None: the one
    reuse check of ``ParamSync`` and ``GradSync``."""
    recognizer = getattr(prepared, "recognizer", None)
    return prepared if recognizer is not None and recognizer.matches(params, devices_key) else None


def find_manifest(
    params, devices, devices_key, prepared, *, rank, size, root, settings, settings_error
):
    """``(manifest, prepared)``: the prepared set when ``params`` still matches it, else a fresh
    manifest (the bulk scan for plain numpy dicts, else the general one) and ``None``."""
    if matching(prepared, params, devices_key) is not None:
        manifest = prepared.manifest
        if manifest.settings != settings:
            manifest.settings = settings
        return manifest, prepared
    manifest = (
        None
        if settings_error
        else scan(params, rank=rank, size=size, root=root, devices=devices, settings=settings)
    )
    if manifest is None:
        manifest = build_manifest(
            params, rank=rank, size=size, root=root, devices=devices, settings=settings
        )
        if settings_error:
            manifest.errors.append((None, settings_error))
    return manifest, None


def all_smaller(manifest, fusion_bytes: int) -> bool:
    """Whether every host tensor of ``manifest`` is smaller than ``fusion_bytes`` (there is one at
    least)."""
    sizes = manifest.host_sizes
    return bool(len(sizes)) and int(sizes.max()) < fusion_bytes


def recognizer(params, manifest, devices) -> Recognizer | None:
    """What recognises ``params`` next time (prepared as ``manifest`` under ``devices``), or None
    when it holds replica lists (their containers are rebuilt every time: nothing to recognise)."""
    if not manifest.leaves_only:
        return None
    values, keys, state = manifest.recorded(params)
    return Recognizer(values, keys, devices, state)
