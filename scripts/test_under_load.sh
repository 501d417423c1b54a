#!/usr/bin/env bash
# The suite under load: scripts/test.sh with CPU-bound processes running beside it for its whole length (default 2,
# LOAD_PROCS=N for another count), as on a machine shared with other jobs. They start before the suite and are
# stopped when it ends, however it ends (an interrupted run stops the suite too). Prints the suite's wall time and
# exits with its status. Arguments go to scripts/test.sh (e.g. --heavy, -x).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N="${LOAD_PROCS:-2}"
if ! [[ "$N" =~ ^[0-9]+$ ]]; then
  echo "[load] LOAD_PROCS must be a whole number, got '$N'" >&2
  exit 2
fi
HOGS=()
SUITE=""
stop_hogs() {
  for pid in ${HOGS[@]+"${HOGS[@]}"}; do kill "$pid" 2>/dev/null; done
  for pid in ${HOGS[@]+"${HOGS[@]}"}; do wait "$pid" 2>/dev/null; done
  HOGS=()
}
stop_suite() {  # $1: the signal; the suite runs in a session of its own (setsid below), stopped as a whole
  if [ -n "$SUITE" ]; then
    kill -s "$1" -- "-$SUITE" 2>/dev/null || kill -s "$1" "$SUITE" 2>/dev/null
    wait "$SUITE" 2>/dev/null
  fi
}
trap stop_hogs EXIT
trap 'stop_suite INT; stop_hogs; exit 130' INT
trap 'stop_suite TERM; stop_hogs; exit 143' TERM
for _ in $(seq 1 "$N"); do
  # a shell spinning on a no-op: all user CPU, no memory, no I/O, at the suite's own priority
  bash -c 'while :; do :; done' &
  HOGS+=("$!")
done
echo "[load] $N CPU-bound processes beside the suite (pids ${HOGS[*]:-none}) on $(nproc) cores;" \
     "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s)
setsid bash scripts/test.sh "$@" &
SUITE=$!
wait "$SUITE"
rc=$?
SUITE=""
t1=$(date +%s)
echo "[load] load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
stop_hogs
echo "[load] scripts/test.sh $* took $((t1 - t0)) s ($(( (t1 - t0) / 60 )) min $(( (t1 - t0) % 60 )) s) with $N" \
     "CPU-bound processes beside it: exit status $rc"
exit "$rc"
