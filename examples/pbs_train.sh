#!/bin/bash
#PBS -N mpisync-train
#PBS -l select=2:ncpus=4:mpiprocs=4
#PBS -l walltime=00:30:00
#
# Train with mpisync under PBS Pro / OpenPBS (qsub examples/pbs_train.sh): the
# same flow as slurm_train.sbatch, launched with mpirun over $PBS_NODEFILE.
set -euo pipefail
cd "${PBS_O_WORKDIR:-$PWD}"
source "${VENV:-.venv}/bin/activate"

export MPISYNC_TIMEOUT=${MPISYNC_TIMEOUT:-600}
export MPISYNC_LOG=${MPISYNC_LOG:-info}
NP=$(wc -l < "$PBS_NODEFILE")              # one line per MPI process
CKPT=${CKPT:-checkpoints/latest.npz}
LOCAL=${LOCAL_DIR:-${TMPDIR:-/tmp}}/mpisync-${PBS_JOBID:-local}
STEPS=${STEPS:-50}
mkdir -p "$(dirname "$CKPT")"
launch() { mpirun -np "$NP" -machinefile "$PBS_NODEFILE" "$@"; }

if [ -f "$CKPT" ]; then
  launch mpisync stage-checkpoint "$CKPT" --to "$LOCAL/latest.npz" --no-progress
  launch python examples/train_resume.py --steps "$STEPS" --resume "$LOCAL/latest.npz" --save "$CKPT"
else
  launch python examples/train_resume.py --steps "$STEPS" --save "$CKPT"
fi
