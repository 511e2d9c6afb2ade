#!/usr/bin/env bash
# The main job: set-up, then a 2-rank sync of a ResNet-50 parameter set on the embedded MPICH.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh .venv mpich
. .venv/bin/activate
export HYDRA_LAUNCHER=fork
MPIEXEC_TIMEOUT=300 timeout 360 mpiexec -n 2 python examples/sync_demo.py "$@"
