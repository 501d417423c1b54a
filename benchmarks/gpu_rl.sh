#!/usr/bin/env bash
# One command for one NVIDIA GPU: a whole RL run on a Llama-3.2-1B-shaped model inside a budget (default 300 s),
# phase by phase (setup, aot, warm_start, rl, fit), the JSON rewritten after each phase:
#
#     bash benchmarks/gpu_rl.sh [--out FILE.json] [--budget-s 300] [more benchmarks/gpu_rl.py flags]
#     bash benchmarks/gpu_rl.sh --cpu-smoke [--out FILE.json]   # the same phases, tiny model, on the CPU
#     bash benchmarks/gpu_check.sh --quick && bash benchmarks/gpu_rl.sh   # with the GPU check in one 10-minute slot
#
# 1. Python: $PYTHON, else python3. The project runs from this checkout through PYTHONPATH (nothing built).
# 2. Packages: the run path imports, beyond the GPU image's jax / numpy / optax / safetensors / ml_dtypes /
#    orbax-checkpoint / numpyro: tyro (experiments/cli.py), tokenizers (the preset's tokenizer.json), grain (the
#    prompt pipeline) and matplotlib (the fit's figures). A missing one is
#    installed as benchmarks/gpu_check.sh does: from wheels in ./.whl (pip install --no-index --no-deps --target
#    $GPU_CHECK_SITE, default /tmp/gpu_check_site; BUILD.md "One RL run on one GPU" says which to download), else
#    from the package index. Still missing: exit status 2.
# 3. Without --cpu-smoke, jax must see a GPU (exit status 2 otherwise).
# 4. Runs python -m benchmarks.gpu_rl (every phase in its own process with its own timeout). Compiled programs go
#    to JAX's persistent cache (JAX_COMPILATION_CACHE_DIR, default ~/.cache/scalerl_jax/xla, the same directory as
#    gpu_check.sh's), so a second run loads them. Exit status: 0 when every phase ran and succeeded, else 1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# the trainer and the embedded engine share the device: memory grows on demand instead of being taken up front
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# JAX's persistent compilation cache: one directory for gpu_check.sh and gpu_rl.sh (scalerl_jax/compile_cache.py's
# default), so what one compiled the other, and a second run, load instead of compiling again
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/scalerl_jax/xla}"
CPU_SMOKE=0
for a in "$@"; do [ "$a" = --cpu-smoke ] && CPU_SMOKE=1; done
if [ "$CPU_SMOKE" = 1 ]; then
    export JAX_PLATFORMS=cpu
else
    unset JAX_PLATFORMS
fi

# import name -> pip name
NEED="jax:jax numpy:numpy optax:optax safetensors:safetensors ml_dtypes:ml-dtypes orbax.checkpoint:orbax-checkpoint
numpyro:numpyro tyro:tyro tokenizers:tokenizers grain:grain matplotlib:matplotlib"

source "$ROOT/benchmarks/_packages.sh"

echo "== python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
ensure_packages gpu_rl "$NEED"

if [ "$CPU_SMOKE" = 0 ]; then
    if ! "$PY" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; then
        echo "gpu_rl: jax sees no GPU ($("$PY" -c 'import jax; print(jax.devices())' 2>&1 | tail -1)); run" \
            "'bash benchmarks/gpu_rl.sh --cpu-smoke' on a CPU" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
fi
"$PY" -c 'import jax; print("== jax", jax.__version__, jax.devices())'
exec "$PY" -m benchmarks.gpu_rl "$@"
