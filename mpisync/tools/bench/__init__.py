"""The ``mpisync bench`` microbenchmark suite (see :func:`mpisync.tools.bench.suite.main`)."""

from .suite import main, parser, run

__all__ = ["main", "parser", "run"]
