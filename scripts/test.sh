#!/usr/bin/env bash
# Set up .venv (the runtime and the test extra: pytest, hypothesis, torch CPU, transformers, ruff) and run the tests
# (--extended: only the checks marked extended; --heavy: every test, those marked heavy included).
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "test"
set +e
# glibc's huge pages for XLA's CPU buffers in the pytest process too (the entry points restart with them themselves;
# scalerl_jax/hostmem.py decides: Linux, glibc 2.35+, the kernel's THP on, SCALERL_HUGEPAGES not 0)
TUNABLES="$(.venv/bin/python -c 'from scalerl_jax.hostmem import hugepage_tunables as t; print(t() or "")')"
if [ -n "$TUNABLES" ]; then export GLIBC_TUNABLES="$TUNABLES"; fi
# the 15 slowest tests close every run (a later --durations=N overrides it; --cpu-durations N lists CPU time).
# The suite is every test but two kinds, so that it aims at 20 minutes on 2 cores: those marked extended (checks
# of minutes that CI runs besides it: --extended runs only them) and those marked heavy (end-to-end checks of several
# minutes whose path the suite covers otherwise: --heavy runs everything, both kinds included).
# A -m EXPR of the caller narrows that selection (-m "not slow": the suite without its whole runs).
TIER="not heavy and not extended"
USER_M=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --heavy) TIER="" ;;
    --extended) TIER="extended and not heavy" ;;
    -m) USER_M="$2"; shift ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
if [ -n "$TIER" ] && [ -n "$USER_M" ]; then SELECT=(-m "($USER_M) and $TIER")
elif [ -n "$TIER$USER_M" ]; then SELECT=(-m "$TIER$USER_M")
else SELECT=(); fi
.venv/bin/python -m pytest tests --durations=15 ${SELECT[@]+"${SELECT[@]}"} ${ARGS[@]+"${ARGS[@]}"}
rc=$?
# pytest exits 5 when no test ran: that is a failure here, not a pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests ran"; exit 1; fi
exit "$rc"
