#!/usr/bin/env bash
# Regenerate the README's Performance figures: the full suite at 2 ranks on the embedded MPICH.
# Writes docs/bench-2ranks.{txt,json,csv} and docs/bench.png. Timings at more ranks than cores mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate 2>/dev/null || { bash ci/setup.sh; . .venv/bin/activate; }
export HYDRA_LAUNCHER=fork
MPIEXEC_TIMEOUT=1500 timeout 1560 mpiexec -n "${RANKS:-2}" mpisync bench --no-progress \
  --json docs/bench-2ranks.json --csv docs/bench-2ranks.csv --plot docs/bench.png "$@" | tee docs/bench-2ranks.txt
