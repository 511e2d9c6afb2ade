"""The gradient counterpart of the parameter sync: :func:`allreduce` and :class:`GradSync`."""

from .gradsync import GradSync, allreduce

__all__ = ["GradSync", "allreduce"]
