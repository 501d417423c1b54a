#!/usr/bin/env bash
# One command for a machine with one NVIDIA GPU and a 10-minute budget:
#
#     bash benchmarks/gpu_check.sh [--out FILE.json] [more benchmarks/gpu_check.py flags]
#     bash benchmarks/gpu_check.sh --cpu-smoke [--out FILE.json]   # the same sections at tiny sizes on the CPU
#     bash benchmarks/gpu_check.sh --quick && bash benchmarks/gpu_rl.sh   # a second run: both in one 10-minute slot
#
# 1. Python: $PYTHON, else python3 (on this project's lent H200 machines that is the image's Python 3.12 with
#    JAX 0.11 + CUDA 13 already installed; nothing can be downloaded there).
# 2. Packages: the check imports only what is listed in NEED below (the project itself runs from this checkout
#    through PYTHONPATH: no build, no network). A missing one is installed, in this order of preference:
#    - from wheels in ./.whl (carried to an offline machine, BUILD.md "GPU check"): pip install --no-index
#      --no-deps --target into a scratch site directory ($GPU_CHECK_SITE, default /tmp/gpu_check_site);
#    - else from the package index (a machine with internet): pip install --user.
#    If jax sees no GPU, GPU_CHECK_INSTALL_JAX=1 installs jax[cuda13] from the index (GPU_CHECK_JAX_EXTRA
#    changes the extra, e.g. cuda12); otherwise the script stops with exit status 2.
#    With --cpu-smoke none of this GPU business: JAX runs on the CPU.
# 3. Runs python -m benchmarks.gpu_check: every section in its own process with its own timeout, all inside
#    --budget-s (default 540 s); it prints one table and rewrites the JSON (default ./gpu_check.json) after every
#    section. Exit status: that of the check (1 if any row is an error), 2 if no GPU is usable.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# grow GPU memory on demand: the kernel tests run in a child process beside this one
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# JAX's persistent compilation cache: one directory for gpu_check.sh and gpu_rl.sh (scalerl_jax/compile_cache.py's
# default), so what one compiled the other, and a second run, load instead of compiling again
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/scalerl_jax/xla}"
CPU_SMOKE=0
for a in "$@"; do [ "$a" = --cpu-smoke ] && CPU_SMOKE=1; done
if [ "$CPU_SMOKE" = 1 ]; then
    export JAX_PLATFORMS=cpu
else
    unset JAX_PLATFORMS  # let jax pick the GPU (tests/conftest.py would otherwise default to cpu)
fi

# import name -> pip name
NEED="jax:jax numpy:numpy optax:optax pytest:pytest safetensors:safetensors ml_dtypes:ml-dtypes
orbax.checkpoint:orbax-checkpoint"

source "$ROOT/benchmarks/_packages.sh"

echo "== python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
ensure_packages gpu_check "$NEED"

if [ "$CPU_SMOKE" = 1 ]; then
    "$PY" -c 'import jax; print("== jax", jax.__version__, jax.devices(), "(CPU smoke run)")'
    exec "$PY" -m benchmarks.gpu_check "$@"
fi

gpu_ok() { "$PY" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else 1)' 2>/dev/null; }
if ! gpu_ok && [ "${GPU_CHECK_INSTALL_JAX:-0}" = 1 ]; then
    echo "== jax sees no GPU; installing jax[${GPU_CHECK_JAX_EXTRA:-cuda13}]"
    "$PY" -m pip install -q --user -U "jax[${GPU_CHECK_JAX_EXTRA:-cuda13}]"
fi
if ! gpu_ok; then
    echo "gpu_check: jax sees no GPU ($("$PY" -c 'import jax; print(jax.devices())' 2>&1 | tail -1)); set" \
        "GPU_CHECK_INSTALL_JAX=1 to install jax[cuda13], or run 'python -m benchmarks.gpu_check --cpu-smoke'" >&2
    exit 2
fi
"$PY" -c 'import jax; print("== jax", jax.__version__, jax.devices())'
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || true

exec "$PY" -m benchmarks.gpu_check "$@"
