"""How the bench's tables write what they show: the page that explains them, and ratios."""

from __future__ import annotations

__all__ = ["DOCS", "ratio_text"]

#: Where the tables' columns and methods are explained.
DOCS = "docs/performance.md"


def ratio_text(value) -> str:
    """A ratio as the tables print it (``1.23x``; ``-`` where there is none)."""
    return "-" if value is None else f"{value:.2f}x"
