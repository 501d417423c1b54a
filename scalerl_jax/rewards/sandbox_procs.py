"""A sandbox run's processes once launched: the process-tree accounting from ``/proc`` (memory, CPU time, the
processes of a uid), watching the two interpreters' pipes until the run ends or breaks a limit, how each one ended
as observed from outside, and stopping what is left.

:class:`~scalerl_jax.rewards.sandbox.Sandbox` decides how a run is isolated and launches it; everything here comes
after the launch and reads only what the kernel and the launchers report (never an exit status read as a signal),
which is what :func:`~scalerl_jax.rewards.code_types.classify_run` turns into a reason. Kept apart from the
sandbox's construction and probing because it is the one part that runs, sampled and polled, for the whole life of
every program.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import time
from typing import NamedTuple

from scalerl_jax.rewards.code_types import HEAD_BYTES, SandboxConfig, tree_cpu_limit_s

_VERDICT_MAX = 1 << 16  # more than this on the verdict pipe is not a verdict
_STOP_GRACE_S = 2.0  # after SIGTERM, how long an rlimits launcher may take to kill its tree before SIGKILL
_RSS_EVERY_S = 0.25  # how often a running program's memory is sampled (only runs that last longer are sampled)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """``{pid: (parent pid, resident pages, CPU clock ticks)}`` of every live process."""
    table = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{d}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                table[int(d)] = (int(fields[1]), int(fields[21]), int(fields[11]) + int(fields[12]))
    return table


def _tree(table: dict, pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for p, row in table.items():
        kids.setdefault(row[0], []).append(p)
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out += [p] if p in table else []
        stack += kids.get(p, [])
    return out


def tree_rss_mb(*pids: int, table: dict | None = None) -> float:
    """Resident memory of ``pids`` and all their descendants, MB (children of a pid namespace's init included)."""
    table = _proc_table() if table is None else table
    return sum(table[p][1] for pid in pids for p in _tree(table, pid)) * _PAGE / 2**20


def tree_cpu_s(pid: int, table: dict | None = None) -> float:
    """The most CPU seconds any one process of ``pid``'s tree has used (RLIMIT_CPU binds each process)."""
    table = _proc_table() if table is None else table
    return max((table[p][2] for p in _tree(table, pid)), default=0) / _TICK


def _real_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return None


def kill_uid(uid: int, rounds: int = 500) -> int:
    """SIGKILL every process whose real uid is ``uid`` until none is left (root only); returns how many."""
    killed = 0
    for _ in range(rounds):
        victims = [p for p in _proc_table() if _real_uid(p) == uid]
        for p in victims:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
                killed += 1
        if not victims:
            break
        time.sleep(0.005)
    return killed


class _Launch(NamedTuple):
    """One launched interpreter: its launcher process, the read end of its status pipe, its uid (as root), its
    scratch directory (rlimits) and its cgroup (:class:`~scalerl_jax.rewards.cgroups.RunGroup`, where used)."""

    proc: subprocess.Popen
    status: int
    uid: int | None
    scratch: str | None
    mode: str
    group: object = None


def _status(raw: bytes) -> dict:
    """The launcher's (or bubblewrap's) JSON status lines, merged."""
    out: dict = {}
    for line in raw.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if isinstance(d, dict):
                out.update(d)
    return out


def _ended(launch: _Launch, status_head: bytearray, sampled_cpu: float = 0.0, wait_s: float = 1.0) -> dict:
    """How one interpreter ended, as observed outside it: ``{"how", "signal", "code", "cpu"}``. ``how``:
    ``"timeout"`` (the rlimits launcher's own clock), ``"signal"`` (the kernel's signal, from the launcher's
    ``wait4``), ``"exit"``, ``"status"`` (bubblewrap's exit status: an exit code and a signal read alike) or
    ``"gone"`` (still running after ``wait_s``, or ended without a word); ``cpu``: CPU seconds of the interpreter
    and the children it waited for (bubblewrap's ``wait4`` rusage, or the launcher's report)."""
    p, rc, cpu = launch.proc, None, 0.0
    deadline = time.monotonic() + wait_s  # a launcher that ended its child may still be sweeping
    while p.returncode is None:
        try:
            pid, st, usage = os.wait4(p.pid, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            p.returncode = os.waitstatus_to_exitcode(st)
            cpu = usage.ru_utime + usage.ru_stime
            break
        if time.monotonic() >= deadline:
            return {"how": "gone", "signal": 0, "code": 0, "cpu": 0.0}
        time.sleep(0.005)
    rc = p.returncode
    if launch.mode == "bwrap":  # its rusage misses the sandbox's processes: the CPU sampled while it ran, to the
        # sampling interval (a process killed at the CPU limit was last seen at most one interval before)
        cpu = max(cpu, sampled_cpu + _RSS_EVERY_S + 0.05 if sampled_cpu else 0.0)
        return {"how": "status", "signal": 0, "code": rc if rc is not None else 0, "cpu": cpu}
    with contextlib.suppress(OSError):  # the launcher's last line, written after its child ended
        os.set_blocking(launch.status, False)
        while len(status_head) < _VERDICT_MAX and (chunk := os.read(launch.status, 1 << 16)):
            status_head += chunk
    last = _status(bytes(status_head))
    if last.get("ended") not in ("timeout", "signal", "exit"):
        return {"how": "gone", "signal": 0, "code": 0, "cpu": 0.0}
    return {"how": last["ended"], "signal": int(last.get("signal", 0)), "code": int(last.get("code", 0)),
            "cpu": int(last.get("cpu_ms", 0)) / 1000}


def _stop(launch: _Launch) -> None:
    """End one interpreter and its whole tree: an rlimits / none launcher is asked with SIGTERM (it kills its pid
    namespace and sweeps its descendants), then killed; bubblewrap's namespace dies with it."""
    p = launch.proc
    if launch.mode != "bwrap":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(_STOP_GRACE_S)
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def _collect(prog: _Launch, test: _Launch, ver_r: int, deadline: float, cfg: SandboxConfig
             ) -> tuple[str | None, dict]:
    """Read both interpreters' stdout, stderr and status pipes and the verdict pipe until the tests process has
    ended (and the program's, or 0.3 s more), or a limit is broken, sampling the memory of both process trees.
    Returns ``(killed, heads)``: ``killed`` is None, ``"timeout"``, ``"output"``, ``"memory"``, ``"oom"`` (the
    kernel ended a process over its cgroup's memory limit) or ``"cpu"`` (the tree's CPU time in its cgroup over
    :func:`~scalerl_jax.rewards.code_types.tree_cpu_limit_s`); ``heads`` the first bytes of each stream."""
    streams = {prog.proc.stdout.fileno(): "stdout", prog.proc.stderr.fileno(): "stderr",
               test.proc.stdout.fileno(): "tstdout", test.proc.stderr.fileno(): "tstderr", ver_r: "verdict",
               prog.status: "pstatus", test.status: "tstatus"}
    head = {name: bytearray() for name in streams.values()}
    total = dict.fromkeys(head, 0)
    pidfds = {os.pidfd_open(prog.proc.pid): "prog", os.pidfd_open(test.proc.pid): "test"}
    poller = select.poll()  # not select(): a big trainer's descriptors run past 1024
    for fd in (*streams, *pidfds):
        poller.register(fd, select.POLLIN)
    killed, exited, sample_at, cpu = None, {}, time.monotonic() + _RSS_EVERY_S, {"prog": 0.0, "test": 0.0}
    try:
        while killed is None:
            now = time.monotonic()
            if now >= deadline:
                killed = "timeout"
                break
            if "test" in exited:
                last = max(exited.values())
                if ("prog" in exited and (not streams or now - last > 0.5)) or now - exited["test"] > 0.3:
                    break
            if not exited and now >= sample_at:
                # RLIMIT_AS bounds each process; this bounds the run (max_procs processes could hold more)
                table = _proc_table()
                if tree_rss_mb(prog.proc.pid, test.proc.pid, table=table) > cfg.memory_mb:
                    killed = "memory"
                    break
                for name, launch in (("prog", prog), ("test", test)):  # bubblewrap's exit status cannot say
                    cpu[name] = max(cpu[name], tree_cpu_s(launch.proc.pid, table))
                # where cgroups count them: a process the kernel ended over the memory limit, and the whole tree's
                # CPU time (RLIMIT_CPU binds each process alone)
                groups = [g for g in (prog.group, test.group) if g is not None]
                if any(g.oom_kills() for g in groups):
                    killed = "oom"
                    break
                if any(g.cpu_s() > tree_cpu_limit_s(cfg) for g in groups):
                    killed = "cpu"
                    break
                sample_at = now + _RSS_EVERY_S
            end = min(deadline, sample_at if not exited else now + 0.05)
            for fd, _ in poller.poll(math.ceil(max(0.0, end - now) * 1000)):
                if fd in pidfds:
                    exited[pidfds[fd]] = time.monotonic()
                    poller.unregister(fd)
                    continue
                data = os.read(fd, 1 << 16)
                name = streams.get(fd)
                if not data:
                    poller.unregister(fd)
                    del streams[fd]
                    continue
                total[name] += len(data)
                room = (HEAD_BYTES if name not in ("verdict", "pstatus", "tstatus") else _VERDICT_MAX) - len(head[name])
                if room > 0:
                    head[name] += data[:room]
                if name in ("stdout", "stderr", "tstdout", "tstderr") and total[name] > cfg.max_output_bytes:
                    killed = "output"
    finally:
        for fd in pidfds:
            os.close(fd)
    head["cpu"] = cpu
    return killed, head


def _read_verdict(raw: bytes) -> tuple[str, str] | None:
    """The tests process's ``(reason, detail)``: the first complete line of the verdict pipe, or None."""
    line, newline, _ = raw.partition(b"\n")
    parts = line.split(b"\t", 1)
    if not newline or len(parts) != 2:
        return None
    return parts[0].decode("ascii", "replace"), parts[1].decode("utf-8", "replace")
