#!/usr/bin/env bash
# Train under SLURM, one task per GPU (mmdet's script):
#   [GPUS=8] [GPUS_PER_NODE=8] tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py arguments]
# GPUS: tasks in all; GPUS_PER_NODE: tasks per node; CPUS_PER_TASK (default 5); SRUN_ARGS: more srun options;
# GRES: the generic resources each node is asked for (default gpu:GPUS_PER_NODE). On nodes without GPUs set
# GRES= (empty): the tasks then train on the CPU and communicate with gloo. PYTHON selects the interpreter.
set -x

if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py arguments]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
GRES=${GRES-gpu:${GPUS_PER_NODE}}
SRUN_ARGS=${SRUN_ARGS:-""}
PYTHON=${PYTHON:-python}

# SRUN_ARGS is split into words on purpose: it holds several srun options.
PYTHONPATH="$(dirname "$0")/..${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    ${GRES:+--gres="$GRES"} \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$(dirname "$0")/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher="slurm" "${@:5}"
