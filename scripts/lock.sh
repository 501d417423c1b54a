#!/usr/bin/env bash
# Refresh the lock files that scripts/_venv.sh installs from (pinned versions with sha256 hashes):
#   requirements-test.lock  the project's dependencies and its `test` extra (scripts/test.sh, CI)
#   requirements.lock       the project's dependencies alone, pinned to the same versions (scripts/tiny.sh)
# Run it after changing the dependencies in pyproject.toml, then commit pyproject.toml and both lock files.
# Existing pins are kept unless a new requirement rules them out; extra arguments go to pip-compile:
#   bash scripts/lock.sh                          # add / drop what pyproject.toml changed, keep the rest
#   bash scripts/lock.sh --upgrade                # every pin to the newest release pyproject.toml allows
#   bash scripts/lock.sh --upgrade-package optax  # one package (and what it needs)
# pip-tools (version pinned below) runs from a throwaway venv. torch resolves to the CPU wheel 2.13.0+cpu that pip
# is configured to find on this machine (find-links); elsewhere, give pip-compile PyTorch's CPU wheel index.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TOOL="$(mktemp -d)"
trap 'rm -rf "$TOOL"' EXIT
"$PY" -m venv "$TOOL/venv"
"$TOOL/venv/bin/python" -m pip install -q "pip-tools==7.6.2"
COMPILE=("$TOOL/venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras
         --build-deps-for=editable --no-emit-find-links --no-emit-index-url "$@")
echo "[lock] requirements-test.lock (pyproject.toml with the test extra)"
"${COMPILE[@]}" --extra test --output-file requirements-test.lock pyproject.toml
echo "[lock] requirements.lock (pyproject.toml, the same versions)"
"${COMPILE[@]}" --constraint requirements-test.lock --output-file requirements.lock pyproject.toml
echo "[lock] done: $(grep -c '^[A-Za-z]' requirements.lock) and $(grep -c '^[A-Za-z]' requirements-test.lock) pins"
