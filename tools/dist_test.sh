#!/usr/bin/env bash
# Test (and evaluate) with torchrun, GPUS processes on each node (mmdet's script):
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py arguments]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (node 0's address) and PORT on every node. PYTHON selects the
# interpreter. On machines without GPUs the GPUS processes run on the CPU and communicate with gloo.
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT GPUS [test.py arguments]  (GPUS: processes per node)" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
PYTHON=${PYTHON:-python}

PYTHONPATH="$(dirname "$0")/..${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$(dirname "$0")/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "${@:4}"
