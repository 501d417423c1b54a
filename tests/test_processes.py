"""scalerl_jax/rollout/fleet/processes.py and fleet/guard.py: the guard started by its documented module path
(``python -m scalerl_jax.rollout.fleet.guard --guard PPID -- CMD``, what :func:`guarded` builds), free ports and
log tails."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from scalerl_jax.rollout.fleet.processes import PACKAGE_PARENT, free_port, guarded, log_tail
from tests.conftest import HANG_S
from tests.servers import ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_guard_by_module_path_runs_the_command_and_returns_its_status():
    cmd = guarded([sys.executable, "-c", "import sys; sys.exit(7)"])
    assert cmd[1:4] == ["-m", "scalerl_jax.rollout.fleet.guard", "--guard"]
    run = subprocess.run(cmd, env=ENV, cwd=ROOT, timeout=HANG_S, capture_output=True, text=True)
    # the guard module is not imported by its package before ``-m`` runs it (runpy would warn on stderr)
    assert run.returncode == 7 and run.stderr == ""
    # a PARENT_PID that is not the guard's parent: it refuses (3) without running the command
    wrong = [sys.executable, "-m", "scalerl_jax.rollout.fleet.guard", "--guard", "1", "--", "true"]
    assert subprocess.run(wrong, env=ENV, cwd=ROOT, timeout=HANG_S).returncode == 3
    no_cmd = subprocess.run(wrong[:-2], env=ENV, cwd=ROOT, timeout=HANG_S, capture_output=True, text=True)
    assert no_cmd.returncode == 2 and "no command given" in no_cmd.stderr


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_guard_kills_the_command_once_its_parent_is_gone():
    # parent -> guard -> sleeper; the sleeper prints its pid; SIGKILL the parent (no hooks run)
    parent_code = textwrap.dedent("""
        import subprocess, sys
        from scalerl_jax.rollout.fleet.processes import guarded
        sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
        subprocess.Popen(guarded([sys.executable, "-c", sleeper])).wait()
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=ENV, cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        pid = int(parent.stdout.readline())
        assert _alive(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=60)
        # the guard polls every 0.5 s, then terminates the command: a hang guard with room for a loaded machine
        deadline = time.monotonic() + 60
        while _alive(pid):
            assert time.monotonic() < deadline, "the guarded command outlived its experiment"
            time.sleep(0.1)
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_free_port_and_log_tail(tmp_path):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: it binds
    log = tmp_path / "x.log"
    assert log_tail(log) == ""
    log.write_text("a" * 10 + "END")
    assert log_tail(log, max_chars=5) == "aaEND" and log_tail(log) == "a" * 10 + "END"


def test_the_children_start_from_the_package_parent():
    """The servers and the guard run ``python -m scalerl_jax...`` with this directory as cwd and on PYTHONPATH."""
    assert PACKAGE_PARENT == ROOT and (PACKAGE_PARENT / "scalerl_jax" / "serve.py").is_file()
