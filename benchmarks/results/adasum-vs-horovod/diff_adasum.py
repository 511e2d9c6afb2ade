"""Compare two result files of compare_adasum.py: max abs diff, elements not bit-equal."""

import sys

import numpy as np

a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert sorted(a.files) == sorted(b.files), set(a.files) ^ set(b.files)
worst = 0.0
for key in sorted(a.files):
    x, y = a[key], b[key]
    same_ranks = all(np.array_equal(x[0], x[r]) for r in range(len(x))) and all(
        np.array_equal(y[0], y[r]) for r in range(len(y))
    )
    diff = float(np.max(np.abs(x - y), initial=0.0))
    rel = diff / max(float(np.max(np.abs(x), initial=0.0)), 1e-30)
    unequal = int(np.sum(x[0] != y[0]))
    worst = max(worst, rel)
    print(
        f"{key:40s} n={x.shape[1]:5d} max_abs_diff={diff:.3e} rel={rel:.3e} "
        f"not_bit_equal={unequal} equal_on_all_ranks={same_ranks}"
    )
print(f"worst relative diff: {worst:.3e}")
