"""Internal, no stability promise: the all-reduce (public: ``mpisync.allreduce``, ``GradSync``).

The gradient counterpart of the parameter sync: :func:`allreduce` and :class:`GradSync`, and
:class:`GradOverlap` (the same reduction started during backward)."""

from .gradsync import GradSync, allreduce
from .overlap import GradOverlap

__all__ = ["GradSync", "GradOverlap", "allreduce"]
