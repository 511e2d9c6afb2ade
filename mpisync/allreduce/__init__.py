"""Internal, no stability promise: the all-reduce (public: ``mpisync.allreduce``, ``GradSync``).

The gradient counterpart of the parameter sync: :func:`allreduce` and :class:`GradSync`."""

from .gradsync import GradSync, allreduce

__all__ = ["GradSync", "allreduce"]
