"""Unit tests of mpisync.params.agreement.diagnose: the error built from every rank's manifest
document."""

from mpisync import InvalidParamError, ManifestMismatchError
from mpisync.params.agreement import diagnose


def _doc(params, errors=(), root=0, **settings):
    return {"settings": {"root": root, **settings}, "params": params, "errors": list(errors)}


def test_diagnose_prefers_invalid_input_and_lists_every_rank():
    docs = [
        _doc([["a", [2], "float32", 1, "host"]]),
        _doc([], [["a", "not C-contiguous"]]),
        _doc([], [[None, "bad root"]]),
    ]
    err = diagnose(docs)
    assert isinstance(err, InvalidParamError)
    assert str(err) == (
        "mpisync: invalid input on rank(s) 1, 2: rank 1: parameter 'a': not C-contiguous; "
        "rank 2: bad root"
    )


def test_diagnose_names_mismatches_against_root():
    row = ["a", [2, 3], "float32", 1, "host"]
    docs = [
        _doc([row, ["b", [1], "int8", 1, "host"]], root=1),
        _doc([row], root=1),
        _doc([["a", [3, 2], "float64", 2, "device"]], root=1),
    ]
    err = diagnose(docs)
    assert isinstance(err, ManifestMismatchError)
    text = str(err)
    assert text.startswith("mpisync: parameters differ from root rank 1's on rank(s) 0, 2: ")
    assert "rank 0: parameter 'b' is not on root rank 1" in text
    assert "rank 2: parameter 'a' has shape (3, 2), root has (2, 3)" in text
    assert "rank 2: parameter 'a' has dtype float64, root has float32" in text
    assert "rank 2: parameter 'a' has 2 replica(s), root has 1" in text
    assert "rank 2: parameter 'a' is in device memory, on root in host memory" in text


def test_diagnose_long_lists_are_cut():
    docs = [_doc([[f"p{i}", [1], "int8", 1, "host"] for i in range(50)]), _doc([])]
    assert str(diagnose(docs)).endswith("; ... and 30 more")


def test_rank_list_shows_runs_as_ranges():
    from mpisync.params.agreement import rank_list

    assert rank_list([3]) == "3"
    assert rank_list([1, 2]) == "1, 2"
    assert rank_list(range(64)) == "0-63"
    assert rank_list([0, 2, 3, 4, 9, 7, 8]) == "0, 2-4, 7-9"


def test_the_same_message_on_many_ranks_is_one_line():
    # 64 ranks with the same bad setting: one line naming them all, not 64 copies
    docs = [_doc([], [[None, "MPISYNC_LOG: bad"], ["w", "not C-contiguous"]]) for _ in range(64)]
    docs[5]["errors"].append(["b", "read-only"])
    assert str(diagnose(docs)) == (
        "mpisync: invalid input on rank(s) 0-63: ranks 0-63: MPISYNC_LOG: bad; "
        "ranks 0-63: parameter 'w': not C-contiguous; rank 5: parameter 'b': read-only"
    )
    row = ["a", [2], "float32", 1, "host"]
    docs = [_doc([row])] + [_doc([]) for _ in range(63)]
    assert str(diagnose(docs)) == (
        "mpisync: parameters differ from root rank 0's on rank(s) 1-63: "
        "ranks 1-63: parameter 'a' is missing (root has it)"
    )
    docs = [_doc([row], fusion_bytes=8)] * 3 + [_doc([row], fusion_bytes=0)]
    assert str(diagnose(docs)) == (
        "mpisync: ranks disagree on sync settings: fusion_bytes: ranks 0-2=8, rank 3=0"
    )
