#!/usr/bin/env bash
# The newest releases users get: install the project beside the newest version of every dependency that
# pyproject.toml allows (no lock file), run the fast tests there, and name any package whose newest release breaks
# them. The locks (scripts/lock.sh) say what CI and the README's commands install; this says what a user who runs
# `pip install scalerl_jax transformers` today gets, before it reaches the locks.
#
#   bash scripts/newest.sh                 # venv .venv-newest, the fast tests (-m "not slow and not heavy and not extended")
#   bash scripts/newest.sh -k hf_io        # extra arguments go to pytest instead of that -m
#   bash scripts/newest.sh --strict        # exit 1 when a newest release breaks a test (CI runs it without)
#
# What it prints: each watched package's locked version (requirements-test.lock) beside the newest one installed;
# the tests' summary; when tests fail, each watched package whose newest release differs from the lock is put back to
# its locked version alone (jax with jaxlib) and the failed tests run again: a package whose locked version makes any
# of them pass is named ("[newest] BREAKS: ..."). Failures that no package explains are reported as such.
# torch stays at the test lock's CPU build (pyproject.toml pins it exactly; PyPI's Linux torch is a CUDA build of GBs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VENV="${NEWEST_VENV:-.venv-newest}"
WATCH=(transformers kernels jax jaxlib optax orbax-checkpoint grain numpyro flax chex sglang-router math-verify wandb
       tokenizers safetensors huggingface-hub)
STRICT=0
ARGS=()
for a in "$@"; do
  if [ "$a" = "--strict" ]; then STRICT=1; else ARGS+=("$a"); fi
done
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-m "not slow and not heavy and not extended")

locked() {  # the version requirements-test.lock pins for $1 ('' when it pins none)
  grep -i -m1 "^$1==" requirements-test.lock | sed -E 's/^[^=]+==([^ ;]+).*/\1/' || true
}

rm -rf "$VENV"
echo "[newest] creating $VENV with $PY"
"$PY" -m venv "$VENV"
PIPI=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
TORCH_PIN="$(grep -o '^torch==[^ ]*' requirements-test.lock | head -1)"
if [ "$(uname -s)" = Linux ] && ! "${PIPI[@]}" --dry-run --no-deps --no-index "$TORCH_PIN" >/dev/null 2>&1; then
  TORCH_FROM=(--extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
else
  TORCH_FROM=()
fi
[ "$(uname -s)" = Linux ] || TORCH_PIN="${TORCH_PIN%%+cpu}"
echo "[newest] $TORCH_PIN, then the newest release of everything else pyproject.toml allows"
"${PIPI[@]}" "$TORCH_PIN" ${TORCH_FROM[@]+"${TORCH_FROM[@]}"}
# flax is not a dependency (docs/DESIGN.md) but sits beside the project in many users' environments
"${PIPI[@]}" --upgrade --upgrade-strategy eager -e ".[test]" flax kernels

echo "[newest] package            locked       newest"
CHANGED=()
for p in "${WATCH[@]}"; do
  new="$("$VENV/bin/python" -m pip show "$p" 2>/dev/null | sed -n 's/^Version: //p' || true)"
  old="$(locked "$p")"
  printf '[newest] %-20s %-12s %s\n' "$p" "${old:--}" "${new:--}"
  if [ -n "$old" ] && [ -n "$new" ] && [ "$old" != "$new" ] && [ "$p" != jaxlib ]; then CHANGED+=("$p"); fi
done

export JAX_PLATFORMS=cpu
PYTEST=("$VENV/bin/python" -m pytest -q -rfE --no-header -p no:cacheprovider)
# pytest's own closing line stays in the log: CI reads the suite's (scripts/test.sh), not this one's
echo "[newest] pytest ${ARGS[*]} (log: $VENV/pytest.log)"
set +e
"${PYTEST[@]}" tests "${ARGS[@]}" >"$VENV/pytest.log" 2>&1
rc=$?
set -e
grep -E '^(FAILED|ERROR) ' "$VENV/pytest.log" | sed 's/^/[newest] /' || true
echo "[newest] tests: $(tail -1 "$VENV/pytest.log" | tr -d '=' | sed -E 's/ in [0-9.]+s.*//; s/^ +//' \
  | sed -E 's/([0-9]+) (passed|failed)/\2 \1/g')"
if [ "$rc" -eq 0 ]; then
  echo "[newest] the fast tests pass with the newest releases"
  exit 0
fi
if [ "$rc" -eq 5 ]; then echo "[newest] no tests ran"; exit 1; fi
if [ "$rc" -ne 1 ]; then echo "[newest] pytest stopped with exit status $rc (see $VENV/pytest.log)"; exit 1; fi
# the failed tests, by node id, read once: every rollback below reruns exactly these
mapfile -t FAILED < <(sed -n -E 's/^(FAILED|ERROR) ([^ ]+).*/\2/p' "$VENV/pytest.log" | sort -u)

echo "[newest] ${#FAILED[@]} tests failed; putting each changed package back to its locked version in turn:" \
  "${CHANGED[*]:-none}"
BROKE=()
for p in ${CHANGED[@]+"${CHANGED[@]}"}; do
  group=("$p")
  [ "$p" = jax ] && [ -n "$(locked jaxlib)" ] && group+=(jaxlib)  # jax and jaxlib move together
  back=() ; fwd=()
  for q in "${group[@]}"; do
    back+=("$q==$(locked "$q")")
    fwd+=("$q==$("$VENV/bin/python" -m pip show "$q" | sed -n 's/^Version: //p')")
  done
  "${PIPI[@]}" --no-deps "${back[@]}"
  set +e
  "${PYTEST[@]}" -rA "${FAILED[@]}" >"$VENV/rollback_$p.log" 2>&1
  set -e
  "${PIPI[@]}" --no-deps "${fwd[@]}"
  fixed="$(grep -c -E '^PASSED ' "$VENV/rollback_$p.log" || true)"
  if [ "$fixed" -gt 0 ]; then
    BROKE+=("$p")
    echo "[newest] BREAKS: ${fwd[*]} (with ${back[*]} $fixed of the ${#FAILED[@]} failed tests pass:" \
      "$VENV/rollback_$p.log)"
  else
    echo "[newest] ${fwd[*]}: the failed tests fail with ${back[*]} too"
  fi
done
[ ${#BROKE[@]} -gt 0 ] || echo "[newest] no package's newest release alone explains the failures"
[ "$STRICT" -eq 1 ] && exit 1
exit 0
