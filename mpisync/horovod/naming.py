"""The names the ranks match a wrapped optimizer's reductions by, as Horovod gives them."""

from __future__ import annotations

__all__ = ["named_parameters_of"]


def named_parameters_of(optimizer, named_parameters) -> list:
    """``[(name, parameter)]`` for every parameter of ``optimizer``, in its order: the names of
    ``named_parameters`` (each parameter once, no name twice), else Horovod's
    ``allreduce.noname.<i>``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters holds duplicate names: {duplicates}")
    by_id = {id(p): n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in by_id]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but {len(unnamed)} of the optimizer's parameters are "
            "not in it (indices " + ", ".join(map(str, unnamed[:10])) + ")"
        )
    return [(by_id[id(p)], p) for p in params]
