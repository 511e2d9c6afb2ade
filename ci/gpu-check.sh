#!/usr/bin/env bash
# The GPU check, for a machine with a GPU and no network (540 s in all; docs/gpu.md says how to run it).
#   bash ci/gpu-check.sh            install from .whl/ (ci/gpu-wheels.sh), preflight, GPU tests at 1, 2
#                                   and 4 ranks on the machine's GPU(s), the staging bench at 2 ranks, summary
#   bash ci/gpu-check.sh --dry-run  the same install and preflight on a machine without a GPU (no GPU
#                                   lines, no GPU runs); ends with "gpu-check: dry run ok"
# Wheels are installed under a prefix, not with --target (which drops the MPICH wheel's data files, so
# libmpi.so.12 never arrives) and not into a venv (the GPU machine's python3 is itself a venv, and a venv
# made from it would not see its torch and CuPy). MPI4PY_LIBMPI pins mpi4py to that prefix's libmpi, and
# the preflight checks that the library loaded is that one, whatever else is on the loader's path.
# The log is written as it goes to $OUT/gpu-check.log when OUT is set, else into this run's own folder
# (mktemp: ${TMPDIR:-/tmp}/mpisync-gpu-check-$USER.XXXXXX, no fixed name another user or run could own
# or plant a link at), so a run killed at a limit still leaves it. The installed wheels are removed at
# exit. PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
case "${1:-}" in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "usage: bash ci/gpu-check.sh [--dry-run]" >&2; exit 2 ;;
esac
py=${PYTHON:-python3}
budget=${MPISYNC_GPU_CHECK_SECONDS:-540}
deadline=$((SECONDS + budget))
work=$(mktemp -d "${TMPDIR:-/tmp}/mpisync-gpu-check-${USER:-$(id -un)}.XXXXXX") \
  || { echo "gpu-check: FAIL cannot create a folder under ${TMPDIR:-/tmp}"; exit 1; }
prefix="$work/prefix"
runs="$work/runs"
log="${OUT:-$work}/gpu-check.log"
trap 'rm -rf "$prefix"' EXIT
exec > >(tee "$log") 2>&1
say() { echo "gpu-check: $*"; }
fail() { say "FAIL $*"; say "log: $log"; exit 1; }
last_line() { grep -v '^\s*$' | tail -n 1; }
say "$([ $dry = 1 ] && echo "dry run" || echo "GPU check") with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])' 2>&1), $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget ${budget} s"

# -- install: every wheel from .whl/, nothing from the network ----------------------------------------
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
compgen -G ".whl/*.whl" >/dev/null || fail "install: no wheels in .whl/ (run ci/gpu-wheels.sh on a machine with PyPI, then carry .whl/ with the tree)"
mkdir -p "$runs"
requirements=(-r ci/gpu-requirements.txt)
"$py" -c "import numpy" 2>/dev/null || requirements+=(numpy)  # never replace the machine's own numpy
out=$("$py" -m pip install -q --no-index --find-links .whl --prefix "$prefix" --ignore-installed --no-compile \
  --no-cache-dir --no-warn-script-location "${requirements[@]}" 2>&1) \
  || fail "install: pip install from .whl/ failed: $(echo "$out" | grep -v '^WARNING' | last_line)"
site=$(find "$prefix" -type d -name site-packages | head -n 1)
libmpi=$(find "$prefix" -name libmpi.so.12 | head -n 1)
[ -n "$site" ] && [ -n "$libmpi" ] && [ -x "$prefix/bin/mpiexec" ] \
  || fail "install: the MPICH wheel's library or mpiexec is missing under $prefix (site=$site libmpi=$libmpi)"
export PYTHONPATH="$PWD:$site" PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$(dirname "$libmpi")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MPI4PY_LIBMPI="$libmpi" HYDRA_LAUNCHER=fork PYTHONUNBUFFERED=1 MPISYNC_TEST_LOGS="$runs/rank-logs"
# pytest loads pytest-mpi alone: not the machine's own plugins, made for its own pytest.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_PLUGINS=pytest_mpi
mpiexec="$prefix/bin/mpiexec"
say "installed $(cd "$site" && ls -d *.dist-info | sed 's/\.dist-info$//' | tr '\n' ' ')under $prefix in $SECONDS s"

# -- the optional C extension, where a compiler is there ---------------------------------------------
if "$py" -c "import os, sys, mpisync._speedups as m; sys.exit(0 if m.__file__.startswith(os.getcwd()) else 1)" 2>/dev/null; then
  say "C extension: already built"
elif command -v cc >/dev/null || command -v gcc >/dev/null; then
  if out=$("$py" setup.py -q build_ext --inplace 2>&1); then say "C extension: built"
  else say "C extension: not built, Python paths used ($(echo "$out" | last_line))"; fi
else
  say "C extension: no C compiler, Python paths used"
fi

# -- preflight: one clear line per failure ------------------------------------------------------------
out=$(timeout 60 "$py" -c "
import numpy, mpi4py, pytest, pytest_mpi, mpisync
print(f'numpy {numpy.__version__}, mpi4py {mpi4py.__version__} ({mpi4py.__file__}), pytest {pytest.__version__}, mpisync {mpisync.__version__} ({mpisync.__file__})')
" 2>&1) || fail "imports: $(echo "$out" | last_line)"
say "imports: $out"
case "$out" in *"$site/mpi4py/"*) ;; *) fail "imports: mpi4py is not the one from .whl/ ($out)";; esac
case "$out" in *"($PWD/mpisync/__init__.py)"*) ;; *) fail "imports: mpisync is not this tree's ($out)";; esac

# Every rank checks that it loaded the wheel's MPICH; rank 0 alone prints (ranks' lines would interleave).
export MPISYNC_CHECK_LIBDIR="$(realpath "$(dirname "$libmpi")")"
out=$(timeout 60 "$py" ci/gpu_preflight.py mpi 2>&1) || fail "MPI library: mpi4py failed to load it: $(echo "$out" | last_line)"
case "$out" in
  "size 1 |"*"the wheel's MPICH on every rank") say "MPI library: $out" ;;
  *) fail "MPI library: not the MPICH wheel's ($(realpath "$libmpi")): $out" ;;
esac

out=$(MPIEXEC_TIMEOUT=60 timeout 90 "$mpiexec" -n 2 "$py" ci/gpu_preflight.py mpi 2>&1)
rc=$?
case "$rc|$out" in
  "0|size 2 |"*"the wheel's MPICH on every rank") say "mpiexec -n 2: $out" ;;
  *) fail "mpiexec -n 2: expected one job of size 2 on the wheel's MPICH (rc=$rc): $(echo "$out" | tr '\n' ';' | cut -c1-400)" ;;
esac

if [ $dry = 1 ]; then
  out=$(timeout 60 "$py" -m pytest -q --collect-only tests/devices/test_gpu.py tests/transports/test_device.py 2>&1) \
    || fail "GPU tests do not collect: $(echo "$out" | last_line)"
  say "GPU tests collect: $(echo "$out" | last_line)"
  out=$(timeout 60 "$py" -c "
import importlib.util, sys
spec = importlib.util.spec_from_file_location('gpu_bench', 'benchmarks/gpu_bench.py')
spec.loader.exec_module(importlib.util.module_from_spec(spec))
eager = [name for name in ('torch', 'cupy') if name in sys.modules]
sys.exit(f'imports {eager} before choosing a library' if eager else 0)
" 2>&1) || fail "benchmarks/gpu_bench.py: $(echo "$out" | last_line)"
  say "GPU bench imports without torch or CuPy"
  say "dry run ok in $SECONDS s (no GPU lines, no GPU runs); log: $log"
  exit 0
fi

command -v nvidia-smi >/dev/null && say "nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tr '\n' ';')"
out=$(timeout 120 "$py" ci/gpu_preflight.py gpu 2>&1)
rc=$?
echo "$out" | sed 's/^/gpu-check: /'
[ $rc = 0 ] || fail "GPU preflight (rc=$rc): $(echo "$out" | grep -m1 'FAIL' || echo "$out" | last_line)"
timeout 60 "$py" -m mpisync info 2>&1 | sed 's/^/  info: /'

# -- GPU runs: each mpiexec bounded by MPIEXEC_TIMEOUT and timeout(1), within the budget -----------------
export MPISYNC_REQUIRE_GPU=1
declare -A verdict
run_bounded() {  # run_bounded NAME SECONDS-WANTED RESERVE-AFTER COMMAND...
  local name=$1 want=$2 reserve=$3 left limit share rc
  shift 3
  left=$((deadline - SECONDS))
  limit=$((left - reserve))  # what the later runs may need stays theirs; when that is too tight,
  share=$((left * want / (want + reserve)))  # each run gets its share of what is left instead
  limit=$((limit > share ? limit : share))
  limit=$((limit < want ? limit : want))
  if [ "$limit" -lt 20 ]; then verdict[$name]="not run (budget spent)"; say "$name: not run, budget spent"; return; fi
  say "== $name (limit $limit s)"
  MPIEXEC_TIMEOUT=$((limit - 5)) timeout "$limit" "$@" 2>&1 | tee "$runs/$name.txt"
  rc=${PIPESTATUS[0]}
  local summary
  summary=$(grep -E "^=*\s*[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s" "$runs/$name.txt" | tail -n 1 | tr -d '=' | sed 's/^ *//')
  if [ $rc = 0 ]; then verdict[$name]="passed${summary:+ ($summary)}"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then verdict[$name]="FAILED: timed out after $limit s${summary:+ ($summary)}"
  else verdict[$name]="FAILED rc=$rc${summary:+ ($summary)}"; fi
}
tests=(tests/devices/test_gpu.py tests/transports/test_device.py)
run_bounded "tests-1-rank" 90 380 "$mpiexec" -n 1 "$py" ci/mpi_pytest.py -q "${tests[@]}"
run_bounded "tests-2-ranks" 110 270 "$mpiexec" -n 2 "$py" ci/mpi_pytest.py -q "${tests[@]}"
run_bounded "tests-4-ranks" 130 140 "$mpiexec" -n 4 "$py" ci/mpi_pytest.py -q "${tests[@]}"
run_bounded "bench-2-ranks" 140 5 "$mpiexec" -n 2 "$py" benchmarks/gpu_bench.py

# -- summary ------------------------------------------------------------------------------------------
echo
say "summary ($SECONDS s of $budget)"
status=0
for name in tests-1-rank tests-2-ranks tests-4-ranks bench-2-ranks; do
  echo "  $name: ${verdict[$name]:-not run}"
  case "${verdict[$name]:-}" in passed*) ;; *) status=1 ;; esac
done
if [ -s "$runs/bench-2-ranks.txt" ]; then
  sed -n '/^mpisync GPU check/,$p' "$runs/bench-2-ranks.txt" | sed 's/^/  /'
fi
say "$([ $status = 0 ] && echo "all runs passed" || echo "some runs FAILED"); log: $log"
exit $status
