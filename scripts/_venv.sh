# Sourced by scripts/tiny.sh and scripts/test.sh: create or reuse .venv and install the project from its lock file.
# Needs only python3.11 (or python3 >= 3.11) and pip. Installs every dependency at the version and sha256 hash pinned
# in requirements.lock (requirements-test.lock with the "test" extra), then the project itself (editable, no
# dependencies of its own). Re-installs when pyproject.toml or the lock file changes. Refresh the locks with
# scripts/lock.sh.
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
  .venv/bin/python -m pip install -q --require-hashes -r "$LOCK"
  # setuptools (the build backend) came from the lock too, so the project builds without fetching anything
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  echo "$WANT" > "$STAMP"
fi
