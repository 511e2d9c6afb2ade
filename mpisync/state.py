"""``sync_state``: sync a nested training state (optimizer state_dict, pytree) from root.

Array leaves are synced in place by :class:`~mpisync.ParamSync` under their
dotted paths (``state.0.exp_avg``). Every other leaf (int, float, bool, str,
None, and tuples of those) takes root's value: root encodes them as tagged
JSON and broadcasts the bytes; nothing is ever unpickled. numpy scalars keep
their exact type and bytes (``np.float32(1.5)`` stays an ``np.float32``).
Containers are visited in sorted key order, so insertion order may differ
between ranks. A tree nested deeper than :data:`MAX_DEPTH` levels, or one that
contains itself, is an :class:`~mpisync.InvalidParamError` on every rank.
"""

from __future__ import annotations

import collections.abc as _abc
import hashlib as _hashlib
import json as _json
import math as _math
from typing import Any

import numpy as _np
from mpi4py import MPI

from .errors import InvalidParamError, ManifestMismatchError
from .params.adapters import is_array_like
from .params.agreement import all_equal, allgather_bytes, merge_ranks
from .sync import ParamSync

__all__ = ["sync_state", "MAX_DEPTH"]

_SCALARS = (bool, int, float, complex, str, type(None))
_NUMPY_KINDS = "biufc"  # numpy scalar kinds carried as (dtype, bytes): bool, ints, floats, complex

#: Containers nested deeper than this are refused (an optimizer's state is 3 or 4 levels deep).
MAX_DEPTH = 100


def _key_sort(key):
    return (type(key).__name__, str(key))


def _is_numpy_scalar(value) -> bool:
    return isinstance(value, _np.generic) and value.dtype.kind in _NUMPY_KINDS


def _is_scalar(value, depth: int = 0) -> bool:
    if isinstance(value, _SCALARS) or _is_numpy_scalar(value):
        return True
    return (
        isinstance(value, tuple)
        and type(value) is tuple
        and depth < MAX_DEPTH
        and all(_is_scalar(v, depth + 1) for v in value)
    )


def _encode_scalar(value):
    """Tagged JSON for one non-array leaf: exact types and values survive the round trip."""
    if _is_numpy_scalar(value):  # numpy's own type and bytes (np.float32 stays np.float32)
        return ["np", [value.dtype.str, value.tobytes().hex()]]
    if isinstance(value, complex):
        return ["c", [_encode_scalar(value.real), _encode_scalar(value.imag)]]
    if isinstance(value, bool):
        return ["b", bool(value)]
    if isinstance(value, int):
        return ["i", int(value)]
    if isinstance(value, float):
        value = float(value)
        return ["f", value.hex() if not _math.isfinite(value) else value]
    if isinstance(value, str):
        return ["s", value]
    if value is None:
        return ["n", None]
    return ["t", [_encode_scalar(v) for v in value]]


def _decode_scalar(doc):
    tag, value = doc
    if tag == "f":
        return float.fromhex(value) if isinstance(value, str) else float(value)
    if tag == "t":
        return tuple(_decode_scalar(v) for v in value)
    if tag == "np":
        dtype = _np.dtype(value[0])
        if dtype.kind not in _NUMPY_KINDS:
            raise ValueError(f"unexpected numpy scalar type {value[0]!r}")
        return _np.frombuffer(bytes.fromhex(value[1]), dtype)[0]
    if tag == "c":
        return complex(_decode_scalar(value[0]), _decode_scalar(value[1]))
    decoders: dict[str, _abc.Callable[[Any], object]]
    decoders = {"b": bool, "i": int, "s": str, "n": lambda v: None}
    return decoders[tag](value)


class _Flat:
    """A tree taken apart: its shape (JSON-safe), array leaves by path, scalar leaves in order."""

    def __init__(self):
        self.arrays: dict = {}
        self.scalars: list = []
        self.errors: list = []
        # ids of the containers on the path being visited (a cycle returns to one)
        self._open: set = set()

    def walk(self, tree):
        """The JSON shape of ``tree``; any failure to walk it becomes an entry of ``errors``."""
        try:
            return self.visit(tree, "", 0)
        # a container that cannot be iterated, a key that cannot be sorted, ...
        except Exception as exc:
            self.errors.append(("<root>", f"cannot walk the tree: {type(exc).__name__}: {exc}"))
            return "?"

    def visit(self, node, path: str, depth: int = 0):
        """Return the JSON shape of ``node`` and collect its leaves."""
        if depth > MAX_DEPTH:
            shown = path if len(path) <= 80 else f"{path[:40]}...{path[-20:]}"
            self.errors.append((shown, f"the tree nests deeper than {MAX_DEPTH} levels"))
            return "?"
        if _is_scalar(node):  # first: numpy scalars also have the buffer protocol
            self.scalars.append(node)
            return "s"
        if is_array_like(node):
            if path in self.arrays:
                self.errors.append((path, "two entries flatten to the same dotted path"))
            self.arrays[path] = node
            return "a"
        if isinstance(node, (_abc.Mapping, list, tuple)):
            if id(node) in self._open:
                self.errors.append((path or "<root>", "the tree contains itself (a cycle)"))
                return "?"
            self._open.add(id(node))
            try:
                return self._container(node, path, depth)
            finally:
                self._open.discard(id(node))
        self.errors.append(
            (
                path or "<root>",
                f"unsupported leaf of type {type(node).__module__}.{type(node).__qualname__}",
            )
        )
        return "?"

    def _container(self, node, path: str, depth: int):
        if isinstance(node, _abc.Mapping):
            keys = list(node)
            bad = [k for k in keys if not isinstance(k, (str, int)) or isinstance(k, bool)]
            if bad:
                self.errors.append(
                    (path or "<root>", f"mapping keys must be str or int, got {bad[:3]!r}")
                )
                return "?"
            children = []
            for key in sorted(keys, key=_key_sort):
                child = f"{path}.{key}" if path else str(key)
                children.append([type(key).__name__, key, self.visit(node[key], child, depth + 1)])
            return {"m": children}
        kind = "l" if isinstance(node, list) else "t"
        return {
            kind: [
                self.visit(v, f"{path}.{i}" if path else str(i), depth + 1)
                for i, v in enumerate(node)
            ]
        }


def _rebuild(node, scalars):
    """``node`` with its scalar leaves replaced, in visiting order, from the iterator
    ``scalars``."""
    if _is_scalar(node):
        return next(scalars)
    if is_array_like(node):
        return node
    if isinstance(node, _abc.Mapping):
        replaced = {key: _rebuild(node[key], scalars) for key in sorted(node, key=_key_sort)}
        items = [(key, replaced[key]) for key in node]  # this rank's own key order
        try:
            # a Mapping subclass's own constructor, or TypeError (then a dict)
            return type(node)(items)  # type: ignore[call-arg]
        except TypeError:
            return dict(items)
    values = [_rebuild(v, scalars) for v in node]
    if isinstance(node, list):
        return values
    # namedtuple or tuple
    return type(node)(*values) if hasattr(node, "_fields") else type(node)(values)


_KINDS = {
    "a": "an array",
    "s": "a non-array value",
    "?": "an unsupported leaf",
    "m": "a mapping",
    "l": "a list",
    "t": "a tuple",
}


def _kind(shape) -> tuple:
    """``(kind letter, children or None)`` of a JSON tree shape."""
    return next(iter(shape.items())) if isinstance(shape, dict) else (shape, None)


# When only root has entries where this rank has none: the usual resume, where root alone loaded
# an optimizer's state. sync_state needs the same structure everywhere; this does not.
_ROOT_ALONE = (
    "; only root has entries here: if this is a torch optimizer's state that only root loaded "
    "(or only root stepped), use mpisync.broadcast_optimizer_state(optimizer, root_rank=...), "
    "which first gives every rank root's structure"
)


def _first_difference(a, b, path: str = "") -> str:
    """The dotted path where two tree shapes first differ, and how."""
    where = path or "<root>"
    (kind_a, items_a), (kind_b, items_b) = _kind(a), _kind(b)
    if kind_a != kind_b:
        return f"{where}: {_KINDS[kind_a]} here, {_KINDS[kind_b]} on root"
    if items_a is None:
        return ""
    if kind_a == "m":
        keys_a, keys_b = [tuple(i[:2]) for i in items_a], [tuple(i[:2]) for i in items_b]
        if keys_a != keys_b:
            missing = [k for _, k in keys_b if (type(k).__name__, k) not in keys_a]
            extra = [k for _, k in keys_a if (type(k).__name__, k) not in keys_b]
            hint = _ROOT_ALONE if not keys_a else ""
            return f"{where}: keys differ (missing here: {missing!r}; not on root: {extra!r}){hint}"
        for (_, key, sa), (_, _, sb) in zip(items_a, items_b):
            found = _first_difference(sa, sb, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return ""
    if len(items_a) != len(items_b):
        return f"{where}: length {len(items_a)} here, {len(items_b)} on root"
    for i, (sa, sb) in enumerate(zip(items_a, items_b)):
        found = _first_difference(sa, sb, f"{path}.{i}" if path else str(i))
        if found:
            return found
    return ""


def _agree_on_shape(comm, flat: _Flat, shape, root, call) -> None:
    doc = {"shape": shape, "errors": flat.errors}
    payload = _json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    digest = _hashlib.blake2b(_json.dumps(shape, sort_keys=True).encode(), digest_size=16).digest()
    words = _np.concatenate([[1 if flat.errors else 0], _np.frombuffer(digest, _np.int64)])
    high, equal = all_equal(comm, words, call)
    if high[0] == 0 and equal:
        return
    docs = [_json.loads(raw) for raw in allgather_bytes(comm, payload, call)]
    invalid = merge_ranks(
        (r, f"{path}: {msg}") for r, d in enumerate(docs) for path, msg in d["errors"]
    )
    if invalid:
        raise InvalidParamError("mpisync: invalid state tree: " + "; ".join(invalid[:20]))
    diffs = merge_ranks(
        (r, _first_difference(d["shape"], docs[root]["shape"]))
        for r, d in enumerate(docs)
        if r != root and d["shape"] != docs[root]["shape"]
    )
    raise ManifestMismatchError(
        f"mpisync: state tree structure differs from root rank {root}'s: " + "; ".join(diffs[:20])
    )


def _broadcast_bytes(comm, payload: bytes, root, call) -> bytes:
    length = _np.array([len(payload)], dtype=_np.int64)
    call(comm.Ibcast(length, root))
    buf = (
        _np.frombuffer(payload, dtype=_np.uint8).copy()
        if comm.rank == root
        else _np.empty(int(length[0]), _np.uint8)
    )
    call(comm.Ibcast([buf, MPI.BYTE], root))
    return buf.tobytes()


def sync_state(
    tree: Any,
    comm: MPI.Intracomm | None = None,
    *,
    root: int = 0,
    max_concurrent: int | None = None,
    fusion_bytes: int | None = None,
    timeout: float | None = None,
    verify: bool = False,
) -> Any:
    """Sync a nested state from ``root``: arrays in place, other leaves to root's values.

    Collective over ``comm``. Array leaves are synced in place as by
    :func:`sync_params` (named by their dotted path); every other leaf takes
    root's value through a safe encoding (tagged JSON, never pickle), in a
    rebuilt tree that is returned: apply it, e.g. with
    ``optimizer.load_state_dict(result)``.

    Args:
        tree: Nested mappings (str or int keys), lists and tuples, such as an optimizer's
            ``state_dict()``; its leaves are arrays, or ints, floats, bools, strings, ``None``
            and tuples of those.
        comm: The intracommunicator whose ranks take part (default ``MPI.COMM_WORLD``).
        root: The rank of ``comm`` whose state every rank receives.
        max_concurrent: The most collectives in flight at once (``MPISYNC_MAX_CONCURRENT``).
        fusion_bytes: Arrays smaller than this are packed into shared buffers of at most this
            size; ``0`` turns fusion off (``MPISYNC_FUSION_BYTES``).
        timeout: Seconds every collective of the call may take (``MPISYNC_TIMEOUT``).
        verify: After the sync, check with a digest that every rank holds root's array bytes.

    Returns:
        The tree rebuilt with root's values (the same arrays, now holding root's bytes, and
        root's other leaves).

    Raises:
        ManifestMismatchError: On every rank, when a rank's structure differs from root's (the
            message names the first differing path), or the arrays' names, shapes or dtypes do.
        InvalidParamError: On every rank, when any rank's tree cannot be walked or holds a leaf
            that cannot be synced, or ``root`` is out of range.
        SyncTimeoutError: A collective did not complete within ``timeout``; by default the job is
            aborted after the diagnostic (``MPISYNC_TIMEOUT_ABORT=0`` raises instead).
        PeerExitedError: A rank of ``comm`` ended its script while others waited.
        VerificationError: ``verify=True`` found a rank whose bytes differ from root's.

    Example::

        synced = mpisync.sync_state(optimizer.state_dict(), MPI.COMM_WORLD, root=0)
        optimizer.load_state_dict(synced)
    """
    with ParamSync(
        comm, root=root, max_concurrent=max_concurrent, fusion_bytes=fusion_bytes, timeout=timeout
    ) as syncer:
        flat = _Flat()
        shape = flat.walk(tree)
        user_comm = syncer._user_comm
        root_ok = (
            isinstance(root, int) and not isinstance(root, bool) and 0 <= root < user_comm.size
        )
        if not root_ok:
            flat.errors.append(
                (
                    "<root>",
                    f"root={root!r} is not a rank of this communicator (size {user_comm.size})",
                )
            )
        if user_comm.size == 1:
            if flat.errors:
                raise InvalidParamError(
                    "mpisync: invalid state tree: "
                    + "; ".join(f"rank 0: {p}: {m}" for p, m in flat.errors)
                )
            rebuilt, problem = _rebuilt(tree, flat.scalars)
            if problem:
                raise InvalidParamError(f"mpisync: invalid state tree: rank 0: {problem}")
        else:
            rebuilt = syncer._collective_exchange(
                "state structure exchange",
                list(flat.arrays),
                lambda comm, call: _exchange(comm, flat, shape, root, call, tree),
            )
        # only now, once every rank holds its rebuilt tree, are arrays written
        syncer.sync(flat.arrays, verify=verify)
        return rebuilt


def _rebuilt(tree, scalars) -> tuple:
    """``(tree rebuilt with scalars, "")``, or ``(None, why not)``: a container's constructor
    (a user's mapping type), or a value root sent, may fail on one rank only."""
    try:
        return _rebuild(tree, iter(scalars)), ""
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank must learn it
        return None, f"cannot rebuild the tree with root's values: {type(exc).__name__}: {exc}"


def _agree_on_rebuild(comm, problem: str, call) -> None:
    """The same :class:`~mpisync.InvalidParamError` on every rank if any rank's rebuild failed
    (one all-reduce; the reasons travel only then)."""
    high, _ = all_equal(comm, [1 if problem else 0], call)
    if not high[0]:
        return
    reasons = allgather_bytes(comm, problem.encode(), call)
    failed = merge_ranks((r, raw.decode()) for r, raw in enumerate(reasons) if raw)
    raise InvalidParamError("mpisync: invalid state tree: " + "; ".join(failed[:20]))


def _exchange(comm, flat, shape, root, call, tree):
    """Agree on the tree's shape, take root's scalar values, rebuild the tree on every rank;
    raises the same error on every rank if any step fails on any."""
    _agree_on_shape(comm, flat, shape, root, call)
    payload = b""
    if comm.rank == root:
        try:
            payload = _json.dumps({"values": [_encode_scalar(v) for v in flat.scalars]}).encode()
        except Exception as exc:  # root's failure travels instead of its values: no rank waits
            payload = _json.dumps(
                {"error": f"rank {root}: cannot encode a value: {type(exc).__name__}: {exc}"}
            ).encode()
    doc = _json.loads(_broadcast_bytes(comm, payload, root, call))
    if "error" in doc:
        raise InvalidParamError(f"mpisync: invalid state tree: {doc['error']}")
    try:
        scalars = [_decode_scalar(d) for d in doc["values"]]
    except Exception as exc:  # noqa: BLE001 - a value this rank cannot decode: agreed below
        rebuilt, problem = None, f"cannot decode root's values: {type(exc).__name__}: {exc}"
    else:
        rebuilt, problem = _rebuilt(tree, scalars)
    _agree_on_rebuild(comm, problem, call)
    return rebuilt
