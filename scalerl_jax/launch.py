"""Start a multi-process run on one machine: P trainer processes of one command, each told its rank.

    python -m scalerl_jax.launch --processes 2 --cpu-devices 2 -- experiments.math_8b --preset smoke --out runs/mp
    python -m scalerl_jax.launch --processes 2 --cpu-devices 2 -- experiments.math_8b --preset small --generators 2
    python -m scalerl_jax.launch --processes 4 --gpus-per-process 2 -- experiments.math_8b --preset 8b ...

Every process runs ``python -m MODULE ARGS`` with ``JAX_COORDINATOR_ADDRESS`` (127.0.0.1 and a free port),
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` set (``--cpu-devices D``: also D simulated CPU devices each, through
``XLA_FLAGS``), so they form one ``jax.distributed`` run; process 0 is the leader (it generates, scores and
writes).

GPUs: ``--gpus-per-process G`` gives rank r the host's GPUs r*G .. r*G+G-1 (counted in the launcher's own
``CUDA_VISIBLE_DEVICES`` when it is set, else in ``nvidia-smi -L``): the rank's ``CUDA_VISIBLE_DEVICES`` lists
only those, and ``SCALERL_LOCAL_DEVICE_IDS`` (0..G-1) tells ``jax.distributed.initialize`` to use them
(:func:`child_env`). P x G more than the host has is refused before anything starts; when the count cannot be
read, the launcher says so and goes on. Without the flag every process sees every GPU.

Generators: the leader starts them when the command has ``--generators N`` (N local servers and the real
``sglang-router``, as in a one-process run), or the command points at a fleet with ``--sglang-urls``.

Output: process 0's lines pass through as they are, the others' are prefixed with ``[pI]``; every process's
output is also written to ``--log-dir`` (default: the command's ``--out`` directory, ``launch/``).

Failure: when a process exits non-zero (or is killed), the launcher stops the others at once (SIGTERM, then
SIGKILL after ``--grace`` seconds) instead of letting them wait in a collective, says which process failed and
how, and exits non-zero; Ctrl-C stops them all. ``--resume`` on the command then continues from the last
checkpoint, with this or another process count. When the failed process was ended by the coordination service's
heartbeat check ("unhealthy (stopped sending heartbeats)"), the launcher says whether the silent processes were
dead (exited before), stopped (state T), or alive and running: then they were busy, not dead, and the message
names ``--heartbeat-timeout`` to raise (:func:`heartbeat_diagnosis`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _out_dir(cmd: list[str]) -> Path | None:
    for i, a in enumerate(cmd):
        if a == "--out" and i + 1 < len(cmd):
            return Path(cmd[i + 1])
        if a.startswith("--out="):
            return Path(a.split("=", 1)[1])
    return None


def host_gpus(env: dict[str, str]) -> tuple[list[str] | None, str]:
    """The GPUs this host lets the launcher use, as ``CUDA_VISIBLE_DEVICES`` entries, and where that came from:
    the launcher's own ``CUDA_VISIBLE_DEVICES`` when set (ids or UUIDs, kept as written), else one index per
    ``GPU i:`` line of ``nvidia-smi -L``; None when neither can be read."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        return [v.strip() for v in raw.split(",") if v.strip()], f"CUDA_VISIBLE_DEVICES={raw!r}"
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"CUDA_VISIBLE_DEVICES is unset and nvidia-smi -L could not run ({e})"
    if r.returncode != 0:
        return None, f"CUDA_VISIBLE_DEVICES is unset and nvidia-smi -L failed ({(r.stderr or r.stdout).strip()[:200]})"
    gpus = [ln for ln in r.stdout.splitlines() if ln.startswith("GPU ")]  # MIG instances are indented lines
    return [str(i) for i in range(len(gpus))], "nvidia-smi -L"


def rank_gpus(gpus: list[str] | None, rank: int, per_process: int) -> list[str]:
    """Rank ``rank``'s share of the host's GPUs: entries rank*G .. rank*G+G-1 (indices when the list is unknown)."""
    lo = rank * per_process
    return gpus[lo:lo + per_process] if gpus is not None else [str(i) for i in range(lo, lo + per_process)]


def child_env(base: dict[str, str], *, coordinator: str, n: int, rank: int, cpu_devices: int | None,
              gpus: list[str] | None = None) -> dict:
    """The environment of rank ``rank`` of ``n``. ``gpus``: the GPUs it alone uses (:func:`rank_gpus`)."""
    env = dict(base, JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=str(n), JAX_PROCESS_ID=str(rank),
               PYTHONUNBUFFERED="1")
    if cpu_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
        env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={cpu_devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        # Ordinals 0..G-1, not the host indices r*G..: jax.distributed.initialize's local_device_ids select among
        # the devices CUDA enumerates, and CUDA enumerates only what CUDA_VISIBLE_DEVICES lists, renumbered from
        # 0 (host GPU r*G is ordinal 0 in this process). Host indices would name ordinals that do not exist for
        # every rank but 0. Setting both: CUDA_VISIBLE_DEVICES keeps the process off the other ranks' GPUs (no
        # CUDA context or memory there), and the explicit ids keep JAX from choosing devices itself.
        env["SCALERL_LOCAL_DEVICE_IDS"] = ",".join(str(i) for i in range(len(gpus)))
    return env


def _pump(proc: subprocess.Popen, rank: int, log_file) -> None:
    prefix = "" if rank == 0 else f"[p{rank}] "
    for line in proc.stdout:
        log_file.write(line)
        log_file.flush()
        sys.stdout.write(prefix + line)
        sys.stdout.flush()


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def proc_state(pid: int) -> str:
    """A live process's scheduler state from ``/proc`` (R, S, D, T ...); "" where it cannot be read."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


UNHEALTHY = re.compile(r"unhealthy \(stopped sending heartbeats\):\s*([\d,\s]+)")
HEARTBEAT = re.compile(r"\[dist\] timeouts: .*?heartbeat (\d+)s")


def heartbeat_diagnosis(log: str, earlier: dict[int, int], stopped: set[int], n: int) -> str | None:
    """Busy or dead, when a process ended because the coordination service found processes silent (JAX's
    "unhealthy (stopped sending heartbeats): 1, 0" in ``log``, the failed process's output); None otherwise.
    ``earlier``: rank -> status of the processes that had exited before it; ``stopped``: ranks the launcher saw
    stopped (state T). A silent process that the launcher saw alive and running was busy, not dead: the message says
    so and names the flag to raise; one that had died or was stopped is named as such."""
    m = UNHEALTHY.search(log)
    if not m:
        return None
    silent = sorted({int(x) for x in re.findall(r"\d+", m.group(1))})
    names = ", ".join(map(str, silent))
    gone = {r: rc for r, rc in earlier.items() if r in silent and rc != 0}
    if gone:
        return (f"the coordination service found process(es) {names} silent: "
                + "; ".join(f"process {r} {_describe(rc)} before" for r, rc in sorted(gone.items()))
                + " (dead, not busy)")
    hung = sorted(r for r in silent if r in stopped)
    if hung:
        return (f"the coordination service found process(es) {names} silent: the launcher saw process(es) "
                f"{', '.join(map(str, hung))} stopped (state T: SIGSTOP or a debugger), alive but not running")
    hb = HEARTBEAT.search(log)
    now = f" (it was {hb.group(1)}s)" if hb else ""
    alive = "every process" if not earlier else f"process(es) {names}"
    return (f"the coordination service declared process(es) {names} dead (stopped sending heartbeats), but the "
            f"launcher saw {alive} of the {n} alive and running until then: busy, not dead (a long compile or "
            f"checkpoint save, an overloaded machine). Raise --heartbeat-timeout{now} on the command and continue "
            f"with --resume")


class LaunchError(ValueError):
    """The launch cannot be done as asked (nothing was started)."""


def plan_gpus(processes: int, per_process: int, env: dict[str, str]) -> tuple[list[list[str]], str]:
    """Every rank's GPUs and a line saying how the host's count was checked; :class:`LaunchError` when
    ``processes`` x ``per_process`` is more than the host has."""
    if per_process < 1:
        raise LaunchError(f"--gpus-per-process must be >= 1, got {per_process}")
    gpus, source = host_gpus(env)
    need = processes * per_process
    if gpus is None:
        note = f"the GPU count could not be checked: {source}; assuming the host has GPUs 0..{need - 1}"
    elif need > len(gpus):
        raise LaunchError(f"--processes {processes} x --gpus-per-process {per_process} = {need} GPUs, but this host "
                          f"has {len(gpus)} ({source})")
    else:
        note = f"{len(gpus)} GPUs on this host ({source})"
    return [rank_gpus(gpus, r, per_process) for r in range(processes)], note


def launch(module: str, args: list[str], *, processes: int, cpu_devices: int | None = None,
           gpus_per_process: int | None = None, port: int | None = None, log_dir: Path | None = None,
           grace_s: float = 10.0) -> int:
    """Run ``python -m module args`` as ``processes`` ranks of one jax.distributed run; the first non-zero exit
    stops the rest (module docstring). Returns 0 when every process exited 0; raises :class:`LaunchError` (before
    starting anything) when the GPUs asked for are not there."""
    if cpu_devices and gpus_per_process is not None:
        raise LaunchError("--cpu-devices and --gpus-per-process exclude each other")
    split: list[list[str] | None] = [None] * processes
    if gpus_per_process is not None:
        split, note = plan_gpus(processes, gpus_per_process, dict(os.environ))
        print(f"[launch] {note}; GPUs per process: "
              + "; ".join(f"{r}: {','.join(g)}" for r, g in enumerate(split)), flush=True)
    coordinator = f"127.0.0.1:{port or free_port()}"
    log_dir = log_dir or ((_out_dir(args) or Path("runs")) / "launch")
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"[launch] {processes} processes of `python -m {module} {' '.join(args)}`; coordinator {coordinator}"
          f"{f'; {cpu_devices} CPU devices each' if cpu_devices else ''}"
          f"{f'; {gpus_per_process} GPUs each' if gpus_per_process else ''}; logs in {log_dir}", flush=True)
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    files = []
    try:
        for rank in range(processes):
            f = open(log_dir / f"process_{rank}.log", "w")
            files.append(f)
            p = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                 env=child_env(os.environ, coordinator=coordinator, n=processes, rank=rank,
                                               cpu_devices=cpu_devices, gpus=split[rank]))
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p, rank, f), daemon=True)
            t.start()
            pumps.append(t)
        exits: dict[int, int] = {}  # rank -> status, in the order the launcher saw them
        stopped: set[int] = set()  # ranks seen alive but stopped (SIGSTOP, a debugger)
        while not any(rc != 0 for rc in exits.values()) and len(exits) < len(procs):
            for rank, p in enumerate(procs):
                if rank in exits:
                    continue
                if p.poll() is not None:
                    exits[rank] = p.returncode
                elif proc_state(p.pid) in ("T", "t"):
                    stopped.add(rank)
            time.sleep(0.2)
        bad = [(r, rc) for r, rc in exits.items() if rc != 0]
        if bad:
            rank, rc = bad[0]
            pumps[rank].join(timeout=5)  # its last lines, in its log before they are read
            files[rank].flush()
            print(f"[launch] process {rank} {_describe(rc)}; stopping the other processes "
                  f"(see {log_dir / f'process_{rank}.log'}; continue with --resume)", file=sys.stderr, flush=True)
            why = heartbeat_diagnosis((log_dir / f"process_{rank}.log").read_text(errors="replace"),
                                      {r: c for r, c in exits.items() if (r, c) != (rank, rc)}, stopped, len(procs))
            if why:
                print(f"[launch] {why}", file=sys.stderr, flush=True)
            _stop(procs, grace_s)
            return rc if rc > 0 else 128 - rc
        return 0
    except KeyboardInterrupt:
        print("[launch] interrupted: stopping every process", file=sys.stderr, flush=True)
        _stop(procs, grace_s)
        return 130
    finally:
        _stop(procs, grace_s)
        for t in pumps:
            t.join(timeout=5)
        for f in files:
            f.close()


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every live process group, SIGKILL what is left after ``grace_s``."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        argv += ["--help"] if not argv else []
    own, cmd = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m scalerl_jax.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s --processes P [options] -- MODULE [ARGS ...]")
    ap.add_argument("--processes", type=int, required=True, metavar="P", help="trainer processes to start")
    ap.add_argument("--cpu-devices", type=int, default=None, metavar="D",
                    help="simulated CPU devices per process (XLA_FLAGS; CPU only)")
    ap.add_argument("--gpus-per-process", type=int, default=None, metavar="G",
                    help="rank r gets GPUs r*G..r*G+G-1 of this host (CUDA_VISIBLE_DEVICES); default: all, to all")
    ap.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--log-dir", type=Path, default=None, help="per-process logs (default: <--out>/launch)")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping")
    a = ap.parse_args(own)
    if not cmd:
        ap.error("give the command after --, e.g. -- experiments.math_8b --preset smoke")
    if a.processes < 1:
        ap.error(f"--processes must be >= 1, got {a.processes}")
    module = cmd[0][len("-m"):].strip() if cmd[0].startswith("-m") else cmd[0]
    try:
        return launch(module, cmd[1:], processes=a.processes, cpu_devices=a.cpu_devices,
                      gpus_per_process=a.gpus_per_process, port=a.port, log_dir=a.log_dir, grace_s=a.grace)
    except LaunchError as e:
        ap.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
