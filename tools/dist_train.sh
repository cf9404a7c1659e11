#!/usr/bin/env bash
# Train with torchrun, GPUS processes on each node (mmdet's script):
#   tools/dist_train.sh CONFIG GPUS [train.py arguments]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (node 0's address) and PORT on every node. PYTHON selects the
# interpreter. On machines without GPUs the GPUS processes train on the CPU and communicate with gloo.
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG GPUS [train.py arguments]  (GPUS: processes per node)" >&2
    exit 2
fi
CONFIG=$1
GPUS=$2
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
    "$(dirname "$0")/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
