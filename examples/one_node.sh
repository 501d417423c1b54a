#!/bin/bash
# One 8-GPU host (H100 or H200) running a whole run: SGLang servers on some GPUs behind an sglang-router, the trainer on
# the others. The servers and the trainer never share a GPU (SGLang keeps MEM_FRACTION of each of its GPUs; the
# trainer's XLA takes XLA_PYTHON_CLIENT_MEM_FRACTION of its own). Check that the trainer's half fits first:
#
#   python -m experiments.math_8b --preset 8b --dry-run --devices 4 --device-memory-gb 80    # 141 on an H200
#   bash examples/one_node.sh
#
# Every value below can be overridden from the environment (BASE_MODEL=/ckpt/x bash examples/one_node.sh). Ctrl-C or
# the end of the run stops the servers and the router. Not run on GPUs yet (docs/GPU.md).
set -euo pipefail

REPO="${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"   # this checkout
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"              # the trainer's venv (docs/GPU.md: JAX with CUDA)
SGLANG_PYTHON="${SGLANG_PYTHON:-python3}"               # a Python with SGLang (CUDA build) and sglang-router
PRESET="${PRESET:-8b}"
BASE_MODEL="${BASE_MODEL:-/ckpt/Llama-3.1-8B}"          # Hugging Face checkpoint directory
DATA="${DATA:-/data/polaris53k.jsonl}"                  # math prompts, one JSON object a line (scalerl_jax.data.prepare)
OUT="${OUT:-$REPO/runs/8b_one_node_s0}"                 # metrics, checkpoints and the weight exports the servers read
GEN_GPUS="${GEN_GPUS:-0,1,2,3}"                         # one SGLang server per GPU listed here
TRAIN_GPUS="${TRAIN_GPUS:-4,5,6,7}"                     # the trainer's devices (one process, fsdp over all of them)
SERVER_PORT="${SERVER_PORT:-30001}"                     # server i listens on SERVER_PORT + i
ROUTER_PORT="${ROUTER_PORT:-30000}"
MEM_FRACTION="${MEM_FRACTION:-0.85}"                    # SGLang's --mem-fraction-static: weights + KV cache
FP32_HEAD_FLAG="${FP32_HEAD_FLAG:---enable-fp32-lm-head}"   # "" where your SGLang release has no such option
LOG_DIR="$OUT/generators"                               # the servers' and the router's logs

mkdir -p "$LOG_DIR"
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done; }
trap cleanup EXIT

IFS=, read -r -a GPUS <<< "$GEN_GPUS"
WORKERS=()
for i in "${!GPUS[@]}"; do
  port=$((SERVER_PORT + i))
  CUDA_VISIBLE_DEVICES="${GPUS[$i]}" "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$BASE_MODEL" \
    --host 127.0.0.1 --port "$port" --dtype bfloat16 --mem-fraction-static "$MEM_FRACTION" $FP32_HEAD_FLAG \
    > "$LOG_DIR/server_$i.log" 2>&1 &
  PIDS+=($!)
  WORKERS+=("http://127.0.0.1:$port")
done
for url in "${WORKERS[@]}"; do
  until curl -sf "$url/health" > /dev/null; do sleep 5; done
done
"$SGLANG_PYTHON" -m sglang_router.launch_router --worker-urls "${WORKERS[@]}" --policy cache_aware \
  --host 127.0.0.1 --port "$ROUTER_PORT" > "$LOG_DIR/router.log" 2>&1 &
PIDS+=($!)
until curl -sf "http://127.0.0.1:$ROUTER_PORT/health" > /dev/null; do sleep 2; done

export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92               # leave the rest of each trainer GPU to CUDA
cd "$REPO"
CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" "$PYTHON" -m experiments.math_8b --preset "$PRESET" --model "$BASE_MODEL" \
  --data "$DATA" --sglang-urls "http://127.0.0.1:$ROUTER_PORT" --out "$OUT" --resume
