"""Unit tests of mpisync.params.manifest: the parameters digest every rank compares."""

import pytest

from unitutil import loops_of, speedups_or_skip

NAME_SETS = [
    [],
    ["w"],
    [f"layer{i:04d}.weight" for i in range(300)],
    ["a", "bé", "名前", "emoji😀"],
    ["a\x00b", "c"],  # a name holding a NUL: lengths first ("L" form)
    ["\udc80", "x"],  # a lone surrogate: valid str, not UTF-8 (surrogatepass)
    ["", "", "a"],
]


@pytest.mark.parametrize("names", NAME_SETS, ids=range(len(NAME_SETS)))
def test_params_digest_is_the_same_with_and_without_the_c_join(names, monkeypatch):
    # A rank with the C loops and one without (MPISYNC_SPEEDUPS=0 there) must compare equal.
    speedups_or_skip()
    from mpisync.params import manifest

    args = (
        names,
        [["float32", len(names)]],
        b"\x01" * 8 * len(names),
        [[1, len(names)]],
        [["h", len(names)]],
    )
    with_c = manifest.params_digest(*args)
    monkeypatch.setattr(manifest, "loops", loops_of("Python"))
    assert manifest.params_digest(*args) == with_c


def test_params_digest_tells_apart_names_that_join_alike():
    from mpisync.params.manifest import params_digest

    def digest(names):
        return params_digest(names, [], b"", [], [])

    assert digest(["a\x00b", "c"]) != digest(["a", "b\x00c"]) != digest(["a", "b", "c"])
    assert digest(["ab"]) != digest(["a", "b"]) and digest([]) != digest([""])
