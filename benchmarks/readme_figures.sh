#!/usr/bin/env bash
# Regenerate the README's Performance figures: the full suite at 2 ranks on the embedded MPICH.
# Writes benchmarks/results/<date>-<commit>/bench-2ranks.{txt,json,csv} and docs/img/bench.png.
# Timings at more ranks than cores mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate 2>/dev/null || { bash ci/setup.sh; . .venv/bin/activate; }
export HYDRA_LAUNCHER=fork
out=benchmarks/results/$(date -u +%F)-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p "$out" docs/img
MPIEXEC_TIMEOUT=1500 timeout 1560 mpiexec -n "${RANKS:-2}" mpisync bench --no-progress \
  --json "$out/bench-2ranks.json" --csv "$out/bench-2ranks.csv" --plot docs/img/bench.png "$@" \
  | tee "$out/bench-2ranks.txt"
