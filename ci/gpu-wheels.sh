#!/usr/bin/env bash
# Fetch, on a machine with PyPI, every wheel ci/gpu-check.sh installs (ci/gpu-requirements.txt, with
# their dependencies) into .whl/ (git-ignored): for the GPU machine's Python 3.12 (manylinux x86-64)
# and for this machine's Python (for the dry run). A set already fetched (a stamp per Python and
# requirement list) is not fetched again. Usage: bash ci/gpu-wheels.sh
#   PYTHON=...               the local interpreter (default python3)
#   MPISYNC_GPU_PYTHON=3.13  another Python version on the GPU machine (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
mkdir -p .whl
export PIP_DISABLE_PIP_VERSION_CHECK=1
requirements=ci/gpu-requirements.txt
digest=$(cksum <"$requirements" | cut -d' ' -f1)
quiet() { grep -v "^WARNING: Location" || true; }
fetch() {  # fetch STAMP-NAME PIP-OPTIONS... -- EXTRA-REQUIREMENTS...
  local stamp=".whl/.fetched-$1-$digest" options=() extra=()
  shift
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  extra=("$@")
  if [ -e "$stamp" ]; then echo "gpu-wheels: $stamp present, nothing to fetch"; return; fi
  "$py" -m pip download -q --only-binary=:all: -d .whl "${options[@]}" -r "$requirements" ${extra[@]+"${extra[@]}"} 2>&1 | quiet
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "gpu-wheels: pip download failed (${options[*]})" >&2; exit 1; }
  touch "$stamp"
}
target=${MPISYNC_GPU_PYTHON:-3.12}
fetch "cp${target/./}-manylinux-x86_64" --python-version "$target" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any --
local_tag=$("$py" -c "import sys, platform; print(f'cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}')")
# numpy only where this Python lacks it (the GPU machine has its own, built with CuPy and torch).
local_extra=$("$py" -c "import numpy" 2>/dev/null || echo numpy)
fetch "local-$local_tag${local_extra:+-numpy}" -- $local_extra
echo "gpu-wheels: $(ls .whl/*.whl | wc -l) wheels, $(du -sm .whl | cut -f1) MiB in .whl/"
