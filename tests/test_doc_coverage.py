"""ci/doc_coverage.py: what it asks of a public name's docstring, and that mpisync's and
mpisync.torch's names have it."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("doc_coverage", ROOT / "ci" / "doc_coverage.py")
doc_coverage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doc_coverage)


def complete(values: list, *, scale: float = 1.0) -> list:
    """Scale ``values``.

    Args:
        values: The numbers.
        scale (float): The factor.

    Returns:
        The scaled numbers.

    Raises:
        ValueError: ``scale`` is negative.
    """
    return [v * scale for v in values]


def incomplete(values: list, scale=1.0) -> list:
    """Scale ``values``.

    Args:
        values: The numbers.
    """
    return values


def nothing_to_say() -> None:
    """Do nothing."""


class Resource:
    """A thing with a life.

    Args:
        size: Its size.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    @property
    def double(self) -> int:
        """Twice the size."""
        return 2 * self.size

    def grow(self, by: int) -> int:
        """Grow.

        Args:
            by: How much.
        """
        return self.size + by

    def hidden(self, x):
        """Left out of the manual.

        :meta private:
        """


def test_a_complete_docstring_passes():
    assert doc_coverage.check_callable(complete, complete.__doc__) == []
    assert doc_coverage.check_callable(nothing_to_say, nothing_to_say.__doc__) == []


def test_each_missing_part_is_named():
    assert doc_coverage.check_callable(incomplete, incomplete.__doc__) == [
        "Args section lacks scale",
        "no type hint on scale",
        "no Returns section",
        "no Raises section",
    ]
    assert doc_coverage.check_callable(complete, None) == ["no docstring"]


def test_a_class_is_checked_with_its_constructor_and_methods():
    expected = {"grow": ["no Returns section", "no Raises section"]}
    assert doc_coverage.check_class(Resource, package=__name__) == expected


def test_sections_are_read_as_napoleon_reads_them():
    found = doc_coverage.sections(complete.__doc__.replace("\n    ", "\n"))
    assert set(found) == {"Args", "Returns", "Raises"}
    assert doc_coverage.documented_names(found, ("Args",)) == {"values", "scale"}


@pytest.mark.parametrize("module", ["mpisync", "mpisync.torch"])
def test_public_names_are_documented(module):
    if module == "mpisync.torch":
        pytest.importorskip("torch")
    _, problems = doc_coverage.check_module(module)
    # broadcast_parameters and broadcast_optimizer_state live in mpisync.horovod, whose
    # docstrings are checked with that module.
    problems = [p for p in problems if not p.startswith("mpisync.broadcast_")]
    assert problems == []
