#!/usr/bin/env bash
# The suite under load: `bash scripts/test.sh` (its arguments passed on, e.g. --heavy, -x, test files) with CPU-bound
# processes running beside it for its whole length (HOGS of them, default 2: each a shell spinning on a no-op at the
# suite's own priority, all user CPU, no memory, no I/O), as on a machine shared with other jobs. The hogs stop when
# the suite ends, and also when this script is interrupted (Ctrl-C), sent SIGTERM or hung up on: then the suite is
# interrupted as by Ctrl-C (pytest closes its background runs), terminated if still there after 60 s, killed 10 s
# later. Prints the suite's wall time and the load average around it, and exits with the suite's status. A suite that
# passes here does not need a quiet machine.
set -uo pipefail
set -m  # the suite and each hog in a process group of its own: signalled as a whole, SIGINT not ignored
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
HOGS="${HOGS:-2}"
if ! [[ "$HOGS" =~ ^[0-9]+$ ]]; then
  echo "[load] HOGS must be a whole number of processes, got '$HOGS'" >&2
  exit 2
fi
HOG_PIDS=()
SUITE=""

stop_hogs() {
  local pid
  for pid in ${HOG_PIDS[@]+"${HOG_PIDS[@]}"}; do
    kill -- "-$pid" 2>/dev/null
  done
  for pid in ${HOG_PIDS[@]+"${HOG_PIDS[@]}"}; do
    wait "$pid" 2>/dev/null
  done
  HOG_PIDS=()
}

stop_suite() {  # interrupt the suite's process group as Ctrl-C would (pytest closes its background runs); SIGTERM
  # to what is left of the group after 60 s (a command started in the background by a script ignores SIGINT, and so
  # do its children), SIGKILL 10 s later: until no process of the group is left, the suite's own shell or not
  [ -n "$SUITE" ] && kill -0 -- "-$SUITE" 2>/dev/null || return 0
  local sig end
  for sig in INT:60 TERM:10 KILL:0; do
    kill "-${sig%%:*}" -- "-$SUITE" 2>/dev/null
    end=$((SECONDS + ${sig##*:}))
    while [ "$SECONDS" -lt "$end" ]; do
      kill -0 -- "-$SUITE" 2>/dev/null || break 2
      sleep 0.2
    done
  done
  wait "$SUITE" 2>/dev/null
}

on_signal() {
  echo "[load] interrupted: stopping the suite and the $HOGS CPU-bound processes" >&2
  stop_suite
  stop_hogs
  exit "$1"
}
trap stop_hogs EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

for _ in $(seq 1 "$HOGS"); do
  bash -c 'while :; do :; done' &
  HOG_PIDS+=("$!")
done
echo "[load] $HOGS CPU-bound processes beside the suite (pids ${HOG_PIDS[*]:-none}) on $(nproc) cores;" \
     "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s)
# in the background and waited for: a signal to this script runs its trap at once
bash "$ROOT/scripts/test.sh" "$@" &
SUITE=$!
wait "$SUITE"
rc=$?
SUITE=""
t1=$(date +%s)
echo "[load] load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
stop_hogs
echo "[load] scripts/test.sh $* took $((t1 - t0)) s ($(( (t1 - t0) / 60 )) min $(( (t1 - t0) % 60 )) s) beside" \
     "$HOGS CPU-bound processes: exit status $rc"
exit "$rc"
