"""Unit tests of the loops (mpisync._runtime.speedups): the C module and its Python form, each
to the same contract."""

import numpy as np
import pytest

from unitutil import LOOP_FORMS, loops_of, speedups_or_skip

forms = pytest.mark.parametrize("form", LOOP_FORMS)


@forms
def test_buffer_list_copies_within_the_arena_and_refuses_what_would_not_fit(form):
    speedups = loops_of(form)
    sources = [np.arange(n, dtype=np.uint8) + n for n in (5, 0, 3)]
    held = speedups.BufferList([memoryview(a) for a in sources])
    assert len(held) == 3 and held.nbytes == 8
    arena = bytearray(12)
    assert held.gather(arena, 2) == 8
    assert bytes(arena) == bytes([0, 0, 5, 6, 7, 8, 9, 3, 4, 5, 0, 0])
    with pytest.raises(ValueError, match="do not fit"):
        held.gather(arena, 5)  # 8 bytes from offset 5 of 12
    with pytest.raises(ValueError, match="do not fit"):
        held.gather(arena, -1)
    frozen = np.zeros(4, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        speedups.BufferList([frozen]).scatter(bytes(4))
    assert not frozen.any()
    with pytest.raises((ValueError, BufferError)):
        speedups.BufferList([np.zeros((3, 3))[:, 0]])  # not contiguous
    targets = [np.zeros(n, np.uint8) for n in (5, 0, 3)]
    speedups.BufferList(targets).scatter(bytes(arena), 2)
    assert [t.tolist() for t in targets] == [s.tolist() for s in sources]


@forms
def test_buffer_list_gather_gives_the_same_bytes_at_every_alignment(form):
    speedups = loops_of(form)
    rng = np.random.default_rng(5)
    sources = [
        rng.integers(0, 256, n, dtype=np.uint8)
        for n in (1, 15, 16, 17, 63, 64, 65, 400, 1000, 0, 3, 4096)
    ]
    packed = np.concatenate(sources)
    held = speedups.BufferList(sources)
    for offset in range(40):
        expected = np.full(8192, 7, np.uint8)
        expected[offset : offset + packed.size] = packed
        arena = np.full(8192, 7, np.uint8)
        assert held.gather(arena, offset) == packed.size
        assert arena.tobytes() == expected.tobytes(), offset
    with pytest.raises(ValueError):
        # one byte short: refused, nothing written
        held.gather(np.zeros(packed.size, np.uint8), 1)


@forms
def test_same_items_is_identity_of_keys_and_values_in_order(form):
    speedups = loops_of(form)
    a, b = np.zeros(1), np.zeros(1)
    params = {"a": a, "b": b}
    assert speedups.same_items(params, ("a", "b"), (a, b))
    assert not speedups.same_items(params, ("b", "a"), (b, a))  # insertion order differs
    # equal values, another array
    assert not speedups.same_items(params, ("a", "b"), (a, np.zeros(1)))
    assert not speedups.same_items(params, ("a",), (a,))
    assert not speedups.same_items({"a": a, "b": b, "c": a}, ("a", "b"), (a, b))


@forms
def test_array_list_reads_what_buffer_exports_give_in_one_pass_and_holds_the_arrays(form):
    speedups = loops_of(form)
    rng = np.random.default_rng(3)
    dtypes = [np.float32, np.float32, np.int16, np.float64, np.float64, np.uint8, np.complex64]
    arrays = [
        rng.integers(0, 100, shape).astype(dtype)
        for shape, dtype in zip([(3,), (0,), (2, 5), (), (4, 1, 2), (7,), (1,)], dtypes)
    ]
    arrays[2].flags.writeable = False
    caller_list = list(arrays)
    held, runs, states = speedups.array_list(caller_list, np.ndarray)
    exported = speedups.BufferList(arrays, np.ndarray)
    assert (held.lengths(), held.shapes(), held.nbytes, held.readonly, len(held)) == (
        exported.lengths(),
        exported.shapes(),
        exported.nbytes,
        True,
        7,
    )
    assert [[d.name, c] for d, c in runs] == [
        ["float32", 2],
        ["int16", 1],
        ["float64", 2],
        ["uint8", 1],
        ["complex64", 1],
    ]
    # the arrays' own objects
    assert all(d is arrays[i].dtype for (d, _), i in zip(runs, [0, 2, 3, 5, 6]))
    assert states == speedups.array_states(arrays, np.ndarray)
    assert held.addresses() == exported.addresses()
    assert (
        held.part(2, 3).readonly
        and not held.part(3, 7).readonly
        and held.part(3, 7).nbytes == 8 + 64 + 7 + 8
    )
    packed = bytearray(held.nbytes)
    held.gather(packed)
    expected = b"".join(a.tobytes() for a in arrays)
    caller_list.clear()  # the list holds its own references: the bytes stay readable and in place
    del arrays[:], exported
    again = bytearray(held.nbytes)
    held.gather(again)
    assert bytes(packed) == bytes(again) == expected
    with pytest.raises(ValueError, match="keeps no shapes"):
        held.part(0, 2).shapes()


@forms
def test_array_list_refuses_what_a_buffer_export_refuses(form):
    speedups = loops_of(form)
    with pytest.raises(BufferError, match="item 1 is not C-contiguous"):
        speedups.array_list([np.zeros(3), np.zeros((3, 3))[:, 0]], np.ndarray)
    with pytest.raises(TypeError, match="item 1 is a list, not exactly a numpy.ndarray"):
        speedups.array_list([np.zeros(3), [1.0]], np.ndarray)

    class Subclass(np.ndarray):
        pass

    with pytest.raises(TypeError, match="item 0 is a Subclass, not exactly"):
        speedups.array_list([np.zeros(2).view(Subclass)], np.ndarray)
    held, runs, states = speedups.array_list([], np.ndarray)
    assert (len(held), runs, states, held.nbytes) == (0, [], b"", 0)


@forms
def test_sorted_names_sorts_as_sorted_does_and_says_whether_the_dict_was_in_order(form):
    speedups = loops_of(form)
    ordered = {f"p{i:03d}": i for i in range(50)}
    names, in_order = speedups.sorted_names(ordered)
    assert names == sorted(ordered) and in_order is True
    shuffled = {k: ordered[k] for k in reversed(list(ordered))}
    assert speedups.sorted_names(shuffled) == (sorted(ordered), False)
    assert speedups.sorted_names({"b": 0, "a": 1, "é": 2}) == (["a", "b", "é"], False)
    assert speedups.sorted_names({}) == ([], True)
    assert speedups.sorted_names({"a": 0, 1: 1}) is None  # not all str: the caller's general path
    import collections

    moved = collections.OrderedDict((k, 0) for k in ["a", "b", "c"])
    # iterates b, c, a; the dict underneath still holds a, b, c in that order
    moved.move_to_end("a")
    assert speedups.sorted_names(moved) == (["a", "b", "c"], False)
    moved.move_to_end("b"), moved.move_to_end("c")
    assert speedups.sorted_names(moved) == (["a", "b", "c"], True)

    class Name(str):
        pass

    assert speedups.sorted_names({Name("a"): 0}) is None


@forms
def test_joined_names_is_the_nul_joined_utf8_or_none(form):
    speedups = loops_of(form)
    names = ["a", "bé", "", "名"]
    assert speedups.joined_names(names) == "\x00".join(names).encode()
    assert speedups.joined_names([]) == b"" and speedups.joined_names(("x",)) == b"x"
    assert speedups.joined_names(["a\x00b"]) is None and speedups.joined_names(["\udc80"]) is None
    assert speedups.joined_names(["a", 1]) is None


def test_the_c_and_python_loops_give_the_same_words():
    # A snapshot taken by one form is compared by the other (MPISYNC_SPEEDUPS_WITHOUT mixes them).
    c, py = loops_of("C"), loops_of("Python")
    arrays = [np.zeros((2, 3), np.float32), np.arange(4.0)[::2], np.array(1, np.int8), [1.0]]
    arrays[0].flags.writeable = False
    assert c.array_states(arrays, np.ndarray) == py.array_states(arrays, np.ndarray)
    contiguous = arrays[:1] + [np.ones(5, np.complex64), np.zeros(0)]
    for left, right in ((c, py), (py, c)):
        held, runs, states = left.array_list(contiguous, np.ndarray)
        assert right.same_states(contiguous, np.ndarray, states)
        assert held.lengths() == right.array_list(contiguous, np.ndarray)[0].lengths()
        assert held.shapes() == right.array_list(contiguous, np.ndarray)[0].shapes()
    with pytest.raises(TypeError, match="numpy.ndarray"):
        c.array_states(arrays, list)


def test_dict_version_changes_with_every_change_and_differs_between_dicts():
    speedups = speedups_or_skip()
    a = np.zeros(1)
    params = {"a": a}
    version = speedups.dict_version(params)
    if version == -1:
        pytest.skip("no dict version tag in this Python (3.12 on): same_items alone decides")
    params["a"] = a  # the same object again: nothing changed
    assert speedups.dict_version(params) == version
    params["a"] = np.zeros(1)
    changed = speedups.dict_version(params)
    assert changed != version
    params["a"] = a  # back to the first array: still a new version
    assert speedups.dict_version(params) not in (version, changed)
    assert speedups.dict_version({"a": a}) != speedups.dict_version({"a": a})
    with pytest.raises(TypeError):
        speedups.dict_version([])


def test_the_python_form_has_no_dict_version_so_the_entries_are_compared():
    py = loops_of("Python")
    assert py.dict_version({"a": 1}) == -1
    with pytest.raises(TypeError):
        py.dict_version([])
