#!/usr/bin/env bash
# Each C loop against its Python form, side by side in one checkout: for every loop of
# mpisync._runtime.speedups, benchmarks/side_by_side.py with MPISYNC_SPEEDUPS_WITHOUT=<loop> on the
# "new" side; then all of them at once (MPISYNC_SPEEDUPS=0, as an install without a compiler).
# Usage: bash benchmarks/speedups_with_without.sh OUT_DIR [ROUNDS]   (from the repository root,
# with the extension built in place: python setup.py build_ext --inplace)
set -euo pipefail
out=${1:?usage: speedups_with_without.sh OUT_DIR [ROUNDS]}
rounds=${2:-7}
mkdir -p "$out"
bench=(--quick --workloads many-small,resnet50 --no-osu --no-sweep --allreduce grads
  --allreduce-sets many-small,resnet50)
loops=$(python -c "from mpisync._runtime.speedups import NAMES; print(' '.join(NAMES))")
for name in $loops; do
  python benchmarks/side_by_side.py . . --rounds "$rounds" \
    --new-env "MPISYNC_SPEEDUPS_WITHOUT=$name" -- "${bench[@]}" > "$out/without-$name.txt"
  echo "without $name: done" >&2
done
python benchmarks/side_by_side.py . . --rounds "$rounds" --new-env MPISYNC_SPEEDUPS=0 \
  -- "${bench[@]}" > "$out/without-all.txt"
echo "without all: done" >&2
