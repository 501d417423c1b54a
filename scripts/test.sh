#!/usr/bin/env bash
# Set up .venv (the runtime and the test extra: pytest, hypothesis, torch CPU, transformers, ruff) and run the tests
# (--heavy: also the end-to-end checks marked heavy).
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "test"
set +e
# glibc's huge pages for XLA's CPU buffers in the pytest process too (the entry points restart with them themselves;
# scalerl_jax/hostmem.py decides: Linux, glibc 2.35+, the kernel's THP on, SCALERL_HUGEPAGES not 0)
TUNABLES="$(.venv/bin/python -c 'from scalerl_jax.hostmem import hugepage_tunables as t; print(t() or "")')"
if [ -n "$TUNABLES" ]; then export GLIBC_TUNABLES="$TUNABLES"; fi
# the 15 slowest tests close every run (a later --durations=N overrides it; --cpu-durations N lists CPU time).
# Tests marked heavy (end-to-end checks of several minutes each) run only with --heavy, so that the suite fits CI.
SELECT=(-m "not heavy")
ARGS=()
for a in "$@"; do
  if [ "$a" = "--heavy" ]; then SELECT=(); else ARGS+=("$a"); fi
done
.venv/bin/python -m pytest tests --durations=15 ${SELECT[@]+"${SELECT[@]}"} ${ARGS[@]+"${ARGS[@]}"}
rc=$?
# pytest exits 5 when no test ran: that is a failure here, not a pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests ran"; exit 1; fi
exit "$rc"
