# Sourced by scripts/tiny.sh and scripts/test.sh: create or reuse .venv and install the project from its lock file.
# Needs only python3.11 (or python3 >= 3.11) and pip, on Linux (x86-64, aarch64) or macOS 14+ (Apple silicon).
# Installs every dependency at the version and sha256 hash pinned in requirements.lock (requirements-test.lock with
# the "test" extra; its torch is the CPU build, from PyTorch's CPU index on Linux: TORCH_INDEX_URL), then the project
# itself (editable, no dependencies of its own). Re-installs when pyproject.toml or the lock file changes. Refresh
# the locks with scripts/lock.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
EXTRA="${1:-}"
LOCK="requirements${EXTRA:+-$EXTRA}.lock"
if [ ! -f "$LOCK" ]; then
  echo "[setup] no lock file $LOCK for extra '$EXTRA' (scripts/lock.sh writes requirements[-test].lock)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $PY"
  "$PY" -m venv .venv
fi
STAMP=".venv/.installed${EXTRA:+-$EXTRA}"
WANT="$(cat pyproject.toml "$LOCK" | sha1sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing scalerl_jax${EXTRA:+[$EXTRA]} into .venv from $LOCK (first run takes a few minutes)"
  PIP_FROM=()
  TORCH_PIN="$(grep -o '^torch==[^ ]*+cpu' "$LOCK" || true)"
  if [ -n "$TORCH_PIN" ] && [ "$(uname -s)" = Linux ] \
     && ! .venv/bin/python -m pip install -q --dry-run --no-deps --no-index "$TORCH_PIN" >/dev/null 2>&1; then
    # torch's CPU build (+cpu) is on PyTorch's CPU index, not on PyPI; pip looks there unless it finds the wheel
    # already (installed, or in a find-links folder it is configured with). The lock holds the index's sha256.
    TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
    echo "[setup] $TORCH_PIN from $TORCH_INDEX_URL (TORCH_INDEX_URL)"
    PIP_FROM=(--extra-index-url "$TORCH_INDEX_URL")
  fi
  .venv/bin/python -m pip install -q --require-hashes -r "$LOCK" ${PIP_FROM[@]+"${PIP_FROM[@]}"}
  # setuptools (the build backend) came from the lock too, so the project builds without fetching anything
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  echo "$WANT" > "$STAMP"
fi
