#!/bin/bash
# One GPU host, several trainer processes of one run: rank r of PROCESSES gets this host's GPUs
# r*GPUS_PER_PROCESS .. r*GPUS_PER_PROCESS+GPUS_PER_PROCESS-1 (its CUDA_VISIBLE_DEVICES; BUILD.md "Multi-host trainer").
# The generators run elsewhere (BUILD.md "Generators (SGLang) beside the trainer"); this host only trains.
#
#   bash examples/one_node_gpus.sh
#
# Edit the values below; nothing else is read from the environment.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"  # this checkout
PYTHON="$REPO/.venv/bin/python"                           # the environment scripts/test.sh (or pip install -e .) set up
PROCESSES=4                                               # trainer processes on this host
GPUS_PER_PROCESS=2                                        # 4 x 2 = an 8-GPU host; the launcher refuses more than it has
PRESET=8b                                                 # the mesh (fsdp=-1) spans all 8 GPUs of the 4 processes
BASE_MODEL=/ckpt/Llama-3.1-8B                             # Hugging Face checkpoint directory the run starts from
DATA=/data/polaris53k.jsonl                               # math prompts, one JSON object a line
ROUTER_URL=http://gen-router:30000                        # the generators' sglang-router
OUT="$REPO/runs/8b_one_node_s0"                           # metrics, checkpoints, weight exports (the generators read them)
LOG_DIR="$OUT/launch"                                     # one log per process (process_0.log ...)

export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92                # leave the rest of each GPU to NCCL and CUDA
export SCALERL_CHANNEL_POLL_S=30                          # how often a follower wakes while it waits for the leader

cd "$REPO"
exec "$PYTHON" -m scalerl_jax.launch --processes "$PROCESSES" --gpus-per-process "$GPUS_PER_PROCESS" \
    --log-dir "$LOG_DIR" -- \
    experiments.math_8b --preset "$PRESET" --model "$BASE_MODEL" --data "$DATA" --sglang-urls "$ROUTER_URL" \
    --out "$OUT" --resume                                 # --resume: continue from the last checkpoint if there is one
