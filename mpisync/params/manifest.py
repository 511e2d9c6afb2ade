"""What one rank holds: the sorted parameter list, its replicas, and local problems.

Nothing here talks to other ranks; :mod:`mpisync.params.agreement` compares manifests.
"""

from __future__ import annotations

import array as _array
import collections.abc as _abc
import dataclasses as _dc
import functools as _functools
import hashlib as _hashlib
import itertools as _itertools
import json as _json
import struct as _struct

import numpy as _np

from .._runtime.speedups import loops
from .adapters import UnsupportedArray, as_array_view, is_array_like, numpy_view
from .columns import DeviceColumns, HostColumns, device_columns, general_columns
from .layout import Layout, host_layout
from .recheck import snapshot

__all__ = [
    "Param",
    "Manifest",
    "build_manifest",
    "params_digest",
    "runs",
    "settings_digest",
    "shape_words",
]


class Param:
    """One named parameter: its replicas' byte views, master first."""

    __slots__ = ("name", "replicas", "master", "nbytes")

    def __init__(self, name: str, replicas: list):
        self.name = name
        self.replicas = replicas  # list[ArrayView]
        self.master = replicas[0]  # whose bytes travel (on the root) or arrive first (elsewhere)
        self.nbytes = replicas[0].data.nbytes


@_dc.dataclass
class Manifest:
    """This rank's view of a sync: parameters in sorted order, local errors, settings that must
    agree.

    ``leaves_only`` is True when every value of ``params`` was itself an array
    (no replica containers), the precondition of ParamSync's fast path.
    """

    params: list  # list[Param], sorted by name
    errors: list  # list[tuple[str | None, str]]
    settings: dict  # values every rank must share (root, fusion_bytes, ...)
    leaves_only: bool = False
    _params_digest: bytes | None = None
    _digest: tuple = (None, b"")  # (the settings dict it was computed with, the digest)

    def describe(self) -> list:
        """One row per parameter: ``[name, shape, dtype, replicas, "host" or "device"]``,
        JSON-safe."""
        return [
            [p.name, list(p.master.shape), p.master.dtype, len(p.replicas), p.master.kind]
            for p in self.params
        ]

    def encode(self) -> bytes:
        """A JSON encoding of everything other ranks must compare (never pickle)."""
        doc = {"settings": self.settings, "params": self.describe(), "errors": self.errors}
        return _json.dumps(doc, separators=(",", ":")).encode()

    def digest(self) -> bytes:
        """16 bytes that differ, with overwhelming probability, when the comparable parts differ."""
        if self._params_digest is None:
            params = self.params
            self._params_digest = params_digest(
                [p.name for p in params],
                runs(p.master.dtype for p in params),
                shape_words(p.master.shape for p in params),
                runs(len(p.replicas) for p in params),
                runs(p.master.kind[0] for p in params),
            )
        # a repeated sync keeps its settings dict: computed once
        if self._digest[0] is not self.settings:
            self._digest = (self.settings, settings_digest(self._params_digest, self.settings))
        return self._digest[1]

    @property
    def tensors(self) -> int:
        """Parameters in the set."""
        return len(self.params)

    @property
    def names(self) -> list:
        """Parameter names, sorted."""
        return [p.name for p in self.params]

    @_functools.cached_property
    def nbytes(self) -> int:
        """Bytes of one copy of every parameter."""
        return sum(p.nbytes for p in self.params)

    @_functools.cached_property
    def host_params(self) -> list:
        """Parameters whose replicas are in host memory, in sorted order."""
        return [p for p in self.params if p.master.kind == "host"]

    @_functools.cached_property
    def device_params(self) -> list:
        """Parameters whose replicas are on devices, in sorted order."""
        return [p for p in self.params if p.master.kind == "device"]

    @_functools.cached_property
    def device_columns(self) -> DeviceColumns:
        """The device masters as columns, with their replicas (see :meth:`device_params`)."""
        return device_columns(self.device_params)

    @_functools.cached_property
    def host_nbytes(self) -> int:
        """Bytes of the host masters."""
        return sum(p.nbytes for p in self.host_params)

    @_functools.cached_property
    def host_sizes(self) -> _np.ndarray:
        """Bytes of each host master, in sorted order (int64)."""
        return _np.array([p.nbytes for p in self.host_params], dtype=_np.int64)

    def replica_bytes(self, to_host=None):
        """Per name, in sorted order: ``(master, other replicas)`` as host buffers;
        ``to_host(view)`` copies a device replica's bytes to host memory (lazily, one at a time)."""

        def host(view):
            return view.data if view.kind == "host" else to_host(view)

        return ((host(p.master), map(host, p.replicas[1:])) for p in self.params)

    def recorded(self, params) -> tuple:
        """``(values, keys, snapshot)``: ``params`` (a mapping of bare arrays, the one this
        manifest was built from) as a :class:`~mpisync.plan.prepared.Recognizer` compares it next
        time."""
        values = tuple(params.values())
        return values, tuple(params), snapshot(values)

    def host_layout(self) -> Layout:
        """Where the host masters sit: runs end to end, aliases, overlaps."""
        return host_layout(self.host_params)

    def host_columns(self, layout, fusion: int) -> HostColumns:
        """The host masters as columns under the agreed ``layout`` (its runs of at least
        ``fusion`` bytes travel as spans, its one-replica aliases not at all)."""
        return general_columns(self.host_params, layout.runs, layout.aliases, fusion)

    @_functools.cached_property
    def nreplicas(self) -> int:
        """Replicas on this rank, all parameters together."""
        return sum(len(p.replicas) for p in self.params)


def params_digest(
    names: list, dtype_runs: list, shapes: bytes, count_runs: list, kind_runs: list
) -> bytes:
    """16 bytes over what every rank's parameters must share, in sorted order: ``names`` (joined by
    NUL when no name holds one, else each name's length and then the names: no two lists of names
    encode alike, whatever characters they hold), ``shapes`` (int64 words: ndim, then the extents,
    per parameter), and as
    ``[value, how many in a row]`` runs (see :func:`runs`) the dtype names, replica counts and
    placements (``"h"`` or ``"d"``). Computed alike from a manifest's parameters and from
    :mod:`mpisync.params.bulk`'s scan, so ranks on either path compare equal. SHA-256
    (hardware-assisted
    on current CPUs) over about 40 bytes a tensor."""
    h = _hashlib.sha256()
    h.update(_struct.pack("=q", len(names)))
    for part in _names_encoding(names):
        h.update(part)
    h.update(_json.dumps([dtype_runs, count_runs, kind_runs]).encode())
    h.update(_struct.pack("=q", len(shapes)))
    h.update(shapes)
    return h.digest()[:16]


def _names_encoding(names: list) -> tuple:
    """``(form, names)`` as the digest takes them: ``b"J"`` and the NUL-joined UTF-8 when no name
    holds
    a NUL (built in C where it can be), else ``b"L"`` with each name's length, and the names
    joined."""
    joined = loops.joined_names(names)
    if joined is not None:
        return b"J", joined
    text = "\x00".join(names)
    # no name holds a NUL: the separators are the bounds
    if text.count("\x00") == max(len(names) - 1, 0):
        form = b"J"
    else:  # each name's length (in characters), then the names: unambiguous whatever they hold
        form = b"L" + _array.array("q", map(len, names)).tobytes()
        text = "".join(names)
    return form, text.encode("utf-8", "surrogatepass")  # lone surrogates are valid str, not UTF-8


def runs(items) -> list:
    """``[[value, count], ...]`` for consecutive equal items (JSON-safe values, for the digest)."""
    return [[value, sum(1 for _ in group)] for value, group in _itertools.groupby(items)]


def shape_words(shapes) -> bytes:
    """Shapes as int64 words, ndim then extents, one after another (as the digest takes them)."""
    return _np.fromiter(
        _itertools.chain.from_iterable((len(s), *s) for s in shapes), dtype=_np.int64
    ).tobytes()


def settings_digest(params_digest_: bytes, settings: dict) -> bytes:
    """The digest ranks compare: a parameters digest with the settings that must agree."""
    h = _hashlib.blake2b(params_digest_, digest_size=16)
    h.update(_json.dumps(settings, sort_keys=True).encode())
    return h.digest()


def _replica_list(replicas, devices) -> list:
    """The replicas of one parameter as a list, master first; raises ``ValueError`` saying why
    not."""
    if isinstance(replicas, _abc.Mapping):
        if devices is None:
            return list(replicas.values())
        missing = [d for d in devices if d not in replicas]
        if missing:
            raise ValueError(f"no replica for device(s) {missing!r}; it has {list(replicas)!r}")
        return [replicas[d] for d in devices]
    if isinstance(replicas, _abc.Sequence) and not isinstance(replicas, str):
        return list(replicas)
    raise ValueError(
        f"unsupported object of type {type(replicas).__module__}.{type(replicas).__qualname__}: "
        "expected an array, a sequence of arrays or a mapping of device to array"
    )


def _device_kind(key) -> tuple | None:
    """``("host" or "device", index or None)`` for a device key that names one (``"cpu"``,
    ``"cuda:1"``, a ``torch.device``, ...), else None (an opaque key: nothing to check)."""
    text = (
        str(key).strip().lower() if isinstance(key, str) or type(key).__name__ == "device" else ""
    )
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda", "gpu"):
        return None
    return ("host" if kind == "cpu" else "device"), (int(index) if index.isdigit() else None)


def _check_devices(views: list, devices) -> None:
    """``ValueError`` when the replicas do not match ``devices``: one replica per device, each on
    the device its key names (where the key names one)."""
    if len(views) != len(devices):
        raise ValueError(
            f"has {len(views)} replica(s), but devices lists {len(devices)}: {list(devices)!r}"
        )
    for i, (view, key) in enumerate(zip(views, devices)):
        named = _device_kind(key)
        if named is None:
            continue
        kind, index = named
        where = "host memory" if view.kind == "host" else f"device {view.device}"
        if view.kind != kind or (index is not None and kind == "device" and view.device != index):
            raise ValueError(f"replica {i} is in {where}, but devices[{i}] is {key!r}")


def _check_param(views: list, receiving: bool) -> str | None:
    master = views[0]
    for i, view in enumerate(views[1:], start=1):
        if view.kind != master.kind:
            return (
                f"replica {i} is in {'host memory' if view.kind == 'host' else 'device memory'} "
                "and the "
                "master is not: the replicas of one name must all be on devices or all in host "
                "memory"
            )
        if view.shape != master.shape or view.dtype != master.dtype:
            return (
                f"replica {i} has shape {view.shape} dtype {view.dtype}, but the master "
                f"has shape {master.shape} dtype {master.dtype}"
            )
    for i, view in enumerate(views):
        if not view.writable and (receiving or i > 0):
            return f"replica {i} is read-only, but this rank must write into it"
    return None


def build_manifest(params, *, rank: int, size: int, root, devices=None, settings=None) -> Manifest:
    """Inspect ``params`` on this rank; collect every local problem instead of raising.

    Precondition: none; any object is accepted and problems are reported in
    ``Manifest.errors`` as ``(parameter name or None, message)``: whatever reading the input
    raises (a tensor type that refuses to be viewed, a mapping whose lookups fail) becomes such an
    error, so the other ranks learn of it in the validation exchange instead of waiting.
    """
    errors: list = []
    try:
        out, leaves_only = _read_params(params, rank, size, root, devices, errors)
    except Exception as exc:  # a mapping that cannot be walked: the same error on every rank
        out, leaves_only = [], False
        errors.append((None, f"reading params raised {_raised(exc)}"))
    root_ok = isinstance(root, int) and not isinstance(root, bool) and 0 <= root < size
    values = dict(settings or {})
    values["root"] = root if root_ok else repr(root)
    return Manifest(out, errors, values, leaves_only=leaves_only)


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}".removeprefix("builtins.")


def _read_params(params, rank, size, root, devices, errors) -> tuple:
    """``(Params in sorted order, leaves only)``, appending each problem to ``errors``."""
    out: list = []
    root_ok = isinstance(root, int) and not isinstance(root, bool) and 0 <= root < size
    if not root_ok:
        errors.append((None, f"root={root!r} is not a rank of this communicator (size {size})"))
    receiving = not (root_ok and rank == root)
    if devices is not None and (
        isinstance(devices, (str, bytes)) or not isinstance(devices, _abc.Sequence) or not devices
    ):
        errors.append(
            (None, f"devices must be a non-empty sequence of device keys, got {devices!r}")
        )
        devices = None
    if not isinstance(params, _abc.Mapping):
        errors.append(
            (None, f"params must be a mapping of name to replicas, got {type(params).__qualname__}")
        )
        params = {}
    bad_names = [n for n in params if not isinstance(n, str)]
    if bad_names:
        errors.append((None, f"parameter names must be str, got {bad_names[:3]!r}"))
    leaves_only = True
    for name in sorted(n for n in params if isinstance(n, str)):
        try:
            value = params[name]
            if type(value) is _np.ndarray:
                views = [numpy_view(value)]
            elif is_array_like(value):
                views = [as_array_view(value)]
            else:
                leaves_only = False
                views = [as_array_view(o) for o in _replica_list(value, devices)]
                if not views:
                    raise ValueError("has no replicas")
            if devices is not None:
                _check_devices(views, devices)
        except (ValueError, UnsupportedArray) as exc:
            errors.append((name, str(exc)))
            continue
        except (
            Exception
        ) as exc:  # the array library refused (torch's nested or negative-bit tensors)
            errors.append((name, f"reading it raised {_raised(exc)}"))
            continue
        if len(views) > 1 or not (views[0].writable or not receiving):
            problem = _check_param(views, receiving)
            if problem:
                errors.append((name, problem))
                continue
        out.append(Param(name, views))
    return out, leaves_only
