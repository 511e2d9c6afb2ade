"""Each loop of mpisync._runtime.speedups on 5000 arrays of 100 float32, C and Python (timeit).

    python benchmarks/speedups_parts.py

Prints one Markdown row per loop: microseconds per call in C, in Python, and the ratio.
"""

from __future__ import annotations

import timeit

import numpy as np

from mpisync._runtime.speedups import choose, speedups

ARRAYS = [np.full(100, 0.0, np.float32) for _ in range(5000)]  # written: no zero page
PARAMS = {f"layer{i:05d}.weight": a for i, a in enumerate(ARRAYS)}


def _calls(loops) -> dict:
    """One call of each loop, its inputs prepared beforehand."""
    states = loops.array_states(ARRAYS, np.ndarray)
    held, names = loops.BufferList(ARRAYS), list(PARAMS)
    keys, values, arena = tuple(PARAMS), tuple(ARRAYS), bytearray(held.nbytes)
    return {
        "sorted_names": lambda: loops.sorted_names(PARAMS),
        "joined_names": lambda: loops.joined_names(names),
        "array_list": lambda: loops.array_list(ARRAYS, np.ndarray),
        "array_states": lambda: loops.array_states(ARRAYS, np.ndarray),
        "same_states": lambda: loops.same_states(ARRAYS, np.ndarray, states),
        "dict_version": lambda: loops.dict_version(PARAMS),
        "same_items": lambda: loops.same_items(PARAMS, keys, values),
        "BufferList (gather of 5000)": lambda: held.gather(arena),
    }


def _best_us(call) -> float:
    return min(timeit.repeat(call, number=5, repeat=7)) / 5 * 1e6


def main() -> int:
    """Print the table; the exit status is 0 (1 where the C loops are not built)."""
    if speedups is None:
        print("mpisync._speedups is not built here (or MPISYNC_SPEEDUPS=0)")
        return 1
    compiled, python = _calls(choose(speedups)), _calls(choose(None))
    print("| loop | C, us | Python, us | Python/C |")
    print("|---|---|---|---|")
    for name, call in compiled.items():
        tc, tp = _best_us(call), _best_us(python[name])
        print(f"| `{name}` | {tc:.1f} | {tp:.1f} | {tp / tc:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
