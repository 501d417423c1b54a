"""The guard: ``python -m scalerl_jax.rollout.fleet.guard --guard PPID -- CMD`` runs CMD and kills it once the
experiment process PPID is gone.

A command that cannot watch its parent itself (the router, a separate binary) runs under it;
:func:`~scalerl_jax.rollout.fleet.processes.guarded` builds the command line. It polls ``os.getppid()`` every
``WATCH_INTERVAL_S`` rather than using ``prctl(PR_SET_PDEATHSIG)`` (see :mod:`scalerl_jax.rollout.fleet.processes`).
This module is only ever run, never imported by the fleet, so that ``-m`` finds it unimported (the fleet package
imports :mod:`~scalerl_jax.rollout.fleet.processes`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from scalerl_jax.rollout.fleet.processes import WATCH_INTERVAL_S


def guard_main(parent_pid: int, cmd: Sequence[str], interval_s: float = WATCH_INTERVAL_S) -> int:
    """Run ``cmd`` (in our process group); stop it when ``parent_pid`` stops being our parent; forward SIGTERM.

    Returns the command's exit status (``128 + signal`` when a signal ended it).
    """
    if os.getppid() != parent_pid:
        return 3
    child = subprocess.Popen(list(cmd))

    def forward(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            rc = child.wait(timeout=interval_s)
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent_pid:
            print(f"[guard] parent process {parent_pid} is gone: stopping {cmd[0]}", file=sys.stderr, flush=True)
            child.terminate()
            try:
                child.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            return 3


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scalerl_jax.rollout.fleet.guard --guard PARENT_PID -- CMD ...`` (used for the router)."""
    p = argparse.ArgumentParser(prog="python -m scalerl_jax.rollout.fleet.guard")
    p.add_argument("--guard", type=int, required=True, metavar="PARENT_PID",
                   help="run CMD and kill it once PARENT_PID is no longer this process's parent")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command given after --")
    return guard_main(args.guard, cmd)


if __name__ == "__main__":
    sys.exit(main())
