"""The one selection policy (mpisync.transports.policy), without MPI: each operation's decision at
its boundary sizes, and a scan of mpisync's sources that keeps every size choosing a path in the
policy module."""

import ast
from pathlib import Path

import pytest

from mpisync.transports import policy
from mpisync.transports.policy import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    ARRAY,
    BROADCAST,
    CROSS,
    LIST,
    MPI,
    PAIRWISE,
    REDUCE,
    REDUCE_SCATTER,
    choose,
)

PACKAGE = Path(__file__).resolve().parents[2] / "mpisync"

CROSS_MIN = policy.CROSS_REDUCE_MIN_BYTES


def test_the_thresholds_keep_their_values():
    assert CROSS_MIN == 16 << 20 and policy.CROSS_BROADCAST_MIN_BYTES == 8 << 20
    assert policy.PAIRWISE_MAX_RANKS == 16


@pytest.mark.parametrize("operation", [ALLREDUCE, REDUCE])
@pytest.mark.parametrize("layout", [ARRAY, LIST])
def test_reductions_are_mpi_below_cross_memorys_floor(operation, layout):
    expected = [
        (0, MPI),
        (1 << 20, MPI),
        (CROSS_MIN - 1, MPI),
        (CROSS_MIN, CROSS),
        (CROSS_MIN * 4, CROSS),
    ]
    got = [(n, choose(operation, n, 2, layout)) for n, _ in expected]
    assert got == expected


def test_reduce_scatter_is_cross_memory_from_the_reductions_floor_else_mpi():
    for layout in (ARRAY, LIST):
        assert choose(REDUCE_SCATTER, CROSS_MIN - 1, 3, layout) == MPI
        assert choose(REDUCE_SCATTER, CROSS_MIN, 3, layout) == CROSS


def test_broadcast_takes_one_array_by_cross_memory_from_its_own_floor():
    floor = policy.CROSS_BROADCAST_MIN_BYTES
    assert choose(BROADCAST, floor - 1, 2) == MPI
    assert choose(BROADCAST, floor, 2) == CROSS
    assert choose(BROADCAST, floor, 2, LIST) == MPI  # several tensors: one Ibcast each


def test_allgather_counts_the_bytes_gathered_and_takes_one_input_only():
    assert choose(ALLGATHER, CROSS_MIN - 1, 4) == MPI
    assert choose(ALLGATHER, CROSS_MIN, 4) == CROSS
    assert choose(ALLGATHER, CROSS_MIN, 4, LIST) == MPI


def test_alltoall_posts_pairs_for_pieces_sized_by_pair_up_to_a_nodes_worth():
    most = policy.PAIRWISE_MAX_RANKS
    assert choose(ALLTOALL, 1 << 30, most, LIST) == PAIRWISE
    assert choose(ALLTOALL, 0, most + 1, LIST) == MPI
    assert choose(ALLTOALL, 1 << 30, 4, ARRAY) == MPI  # an equal split: MPI's Ialltoall
    assert choose(ALLTOALL, 10, 1, LIST) == MPI


@pytest.mark.parametrize("operation", [BROADCAST, ALLREDUCE, REDUCE, ALLGATHER, REDUCE_SCATTER])
def test_one_rank_or_no_node_mechanism_is_mpi_at_any_size(operation):
    for nbytes in (0, 1 << 20, CROSS_MIN, 1 << 32):
        assert choose(operation, nbytes, 1) == MPI
        assert choose(operation, nbytes, 8, node=False) == MPI


def test_unknown_operations_and_layouts_are_refused():
    with pytest.raises(ValueError, match="operation"):
        choose("scan", 1, 2)
    with pytest.raises(ValueError, match="layout"):
        choose(ALLREDUCE, 1, 2, "strided")


def test_a_parameter_set_of_large_tensors_takes_cross_memory_where_it_can():
    assert policy.parameter_set(False, True)[0] == CROSS
    assert policy.parameter_set(True, True)[0] == MPI  # fused buckets
    assert policy.parameter_set(False, False)[0] == MPI


# Constants named like a size bound that do not choose a path, each with what it bounds.
_NOT_A_PATH = {
    ("_runtime/observe.py", "_MAX_BYTES"): "a trace file's growth",
}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def _bound_name(name: str) -> bool:
    """A constant's name (upper case) that reads as a size bound."""
    if not name.isupper():
        return False
    return name.endswith(("MIN_BYTES", "MAX_BYTES")) or "THRESHOLD" in name


def _names(node) -> list:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def test_no_module_but_the_policy_defines_or_compares_a_path_size():
    """A constant named as a size bound (``*_MIN_BYTES``, ``*_MAX_BYTES``, ``*THRESHOLD*``) is
    defined in the policy module only, and no other module compares a size with one."""
    found = []
    for name, tree in _sources():
        if name == "transports/policy.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for ident in _names(target):
                        if _bound_name(ident) and (name, ident) not in _NOT_A_PATH:
                            found.append(f"{name}:{node.lineno} defines {ident}")
            elif isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    for ident in _names(side):
                        if _bound_name(ident) and (name, ident) not in _NOT_A_PATH:
                            found.append(f"{name}:{node.lineno} compares with {ident}")
    assert found == []


def test_no_module_imports_a_size_bound_from_a_mechanism():
    """The mechanisms' modules export no size bound: a front end takes it from the policy (or,
    better, asks :func:`~mpisync.transports.policy.choose`)."""
    found = []
    for name, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not (node.module or "").endswith("policy"):
                found += [
                    f"{name}:{node.lineno} imports {a.name} from {node.module}"
                    for a in node.names
                    if _bound_name(a.name)
                ]
    assert found == []
