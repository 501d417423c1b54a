# Sourced by scripts/tiny.sh and scripts/test.sh: create or reuse .venv and install the project.
# Needs only python3.11 (or python3 >= 3.11) and pip. Re-installs when pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
EXTRA="${1:-}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $PY"
  "$PY" -m venv .venv
fi
STAMP=".venv/.installed${EXTRA:+-$EXTRA}"
WANT="$(sha1sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing scalerl_jax${EXTRA:+[$EXTRA]} into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".${EXTRA:+[$EXTRA]}"
  echo "$WANT" > "$STAMP"
fi
