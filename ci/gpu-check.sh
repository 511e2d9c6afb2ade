#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no network (under 5 minutes): installs what it needs
# from wheels carried with the tree (.whl/, made by ci/gpu-wheels.sh), runs the GPU and device tests
# at 1, 2 and 4 ranks sharing the GPU (failing, not skipping, without a GPU), then prints the
# staging table of benchmarks/gpu_bench.py at 2 ranks.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
site=/tmp/mpisync-site
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH="$site:${PYTHONPATH:-}" PATH="$site/bin:$PATH"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" HYDRA_LAUNCHER=fork MPISYNC_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -m mpisync info || status=1
for n in 1 2 4; do
  echo "== GPU tests at $n rank(s)"
  MPIEXEC_TIMEOUT=150 timeout 170 mpiexec -n "$n" "$py" ci/mpi_pytest.py -q -p no:cacheprovider \
    tests/test_gpu.py tests/test_devices.py || status=1
done
echo "== staging figures, 2 ranks"
MPIEXEC_TIMEOUT=150 timeout 170 mpiexec -n 2 "$py" benchmarks/gpu_bench.py || status=1
exit $status
