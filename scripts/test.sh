#!/usr/bin/env bash
# Set up .venv (with the test extra: pytest, hypothesis, torch CPU, transformers, sglang-router) and run all tests.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" "test"
set +e
# the 15 slowest tests close every run (a later --durations=N overrides it; --cpu-durations N lists CPU time)
.venv/bin/python -m pytest tests --durations=15 "$@"
rc=$?
# pytest exits 5 when no test ran: that is a failure here, not a pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests ran"; exit 1; fi
exit "$rc"
