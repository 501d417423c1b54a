"""Per-interpreter control groups for the code sandbox: the kernel's own accounting of everything a process tree
holds, where the host lets the trainer make groups (root, with writable cgroup v1 ``memory``, ``cpu``,
``cpuacct`` and ``pids`` hierarchies).

Each sandboxed interpreter (a launcher and all it starts) joins a fresh group of its own, under the trainer's own
group in each hierarchy, before it drops root or forks:

- ``memory``: ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap is accounted) at the run's
  ``memory_mb``. The kernel charges the group for what ``RLIMIT_AS`` does not see: pages of tmpfs files (the
  scratch directory, ``/tmp``, ``/dev/shm``), shared memory, page cache, kernel memory of its pipes and sockets. Over
  the limit its OOM killer ends a process of the group, and the group's ``oom_kill`` count says so: the run fails
  as ``memory``, from the kernel's count, never from an exit status.
- ``cpu``: a CFS quota of ``cpu_cores`` cores for the whole tree, so a program's children (in their own sessions,
  spinning) slow only their own run, never another sample's.
- ``cpuacct``: the CPU time of the whole tree, which the trainer holds against the run's ``cpu_s`` (each process's
  ``RLIMIT_CPU`` alone lets a tree of N processes use N times it).
- ``pids``: ``pids.max`` at the run's ``max_procs`` plus the launcher's own, for the whole tree across uids and pid
  namespaces.

At the end every process left in the group is killed and the group removed.

Not here: cgroup v2. There a group can be given controllers only below a group without processes, which means
moving the trainer itself into a leaf first; that layout could not be built or tested on the machines this project
runs its suite on (cgroup v1 with writable hierarchies, and an empty v2 hierarchy). Where no usable v1 hierarchy is
found the sandbox runs as before (rlimits, seccomp refusing memfd and System V IPC, size-capped tmpfs) and
:meth:`~scalerl_jax.rewards.sandbox.Sandbox.describe` says so.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time

_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids")


def _v1_mounts() -> dict[str, str]:
    """``{controller: mount point}`` of the cgroup v1 hierarchies holding :data:`_CONTROLLERS`."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "cgroup":
                for opt in parts[3].split(","):
                    if opt in _CONTROLLERS:
                        out.setdefault(opt, parts[1])
    return out


def _own_paths() -> dict[str, str]:
    """``{controller: this process's group path}`` from ``/proc/self/cgroup`` (v1 lines only)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for n in names.split(","):
                if n in _CONTROLLERS:
                    out[n] = path
    return out


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


class RunGroup:
    """One interpreter's groups: a directory in each hierarchy (``dirs``: controller -> path)."""

    def __init__(self, dirs: dict[str, str]) -> None:
        self.dirs = dirs
        self.owner: set | None = None  # the live set of the Cgroups that made it

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` file of each distinct directory: the launcher writes its pid into each."""
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def cpu_s(self) -> float:
        """CPU seconds the whole tree has used (``cpuacct.usage``)."""
        try:
            return int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))) / 1e9
        except (OSError, ValueError):
            return 0.0

    def oom_kills(self) -> int:
        """Processes of the group the kernel's OOM killer ended (``oom_kill`` of ``memory.oom_control``); kernels
        without that line: 1 if the limit was ever hit and the group is at it (``under_oom``), else 0."""
        try:
            fields = dict(line.split() for line in _read(os.path.join(self.dirs["memory"], "memory.oom_control"))
                          .splitlines() if len(line.split()) == 2)
        except (OSError, ValueError):
            return 0
        return int(fields.get("oom_kill", fields.get("under_oom", 0)))

    def peak_mb(self) -> float:
        """The most memory the group has been charged for at once (``memory.max_usage_in_bytes``), MB."""
        try:
            return int(_read(os.path.join(self.dirs["memory"], "memory.max_usage_in_bytes"))) / 2**20
        except (OSError, ValueError):
            return 0.0

    def pids(self) -> list[int]:
        """The processes in the group now."""
        for d in self.dirs.values():
            with contextlib.suppress(OSError, ValueError):
                return [int(p) for p in _read(os.path.join(d, "cgroup.procs")).split()]
        return []

    def close(self, rounds: int = 400) -> bool:
        """Kill every process left in the group (until none is left), then remove its directories; True when all
        were removed."""
        for _ in range(rounds):
            left = self.pids()
            if not left:
                break
            for p in left:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.005)
        removed = True
        for d in self.dirs.values():
            for _ in range(100):  # the last processes may take a moment to leave once reaped
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                removed = False
        if removed and self.owner is not None:
            self.owner.discard(self)
        return removed


class Cgroups:
    """The trainer's parent groups (``scalerl-<host>-<pid>`` under its own group in each hierarchy) and a factory of
    :class:`RunGroup`; :func:`find` returns one where the host allows it."""

    def __init__(self, parents: dict[str, str]) -> None:
        self.parents = parents
        self._n = itertools.count(1)  # thread-safe: the pool's workers make groups at once
        self._live: set[RunGroup] = set()  # closed at exit too: runs still in flight when the trainer ends

    def describe(self) -> str:
        return "cgroup v1 (memory, CPU quota and CPU time, pids per interpreter)"

    def new(self, memory_bytes: int, cpu_cores: float, max_procs: int) -> RunGroup:
        """A fresh group in every hierarchy with its limits set; raises OSError if one cannot be made."""
        name = f"run-{os.getpid()}-{next(self._n)}"
        dirs: dict[str, str] = {}
        try:
            for ctl, parent in self.parents.items():
                d = os.path.join(parent, name)
                if d not in dirs.values():
                    os.mkdir(d)
                dirs[ctl] = d
            mem = dirs["memory"]
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
            with contextlib.suppress(OSError):  # swap accounting (not on every kernel)
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            with contextlib.suppress(OSError):  # a shared hierarchy may refuse; the limit still binds
                _write(os.path.join(mem, "memory.swappiness"), "0")
            cpu = dirs["cpu"]
            period = int(_read(os.path.join(cpu, "cpu.cfs_period_us")))
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(max(1000, int(cpu_cores * period))))
            # the launcher (or bubblewrap and its pid 1) and the interpreter come on top of what it may add
            _write(os.path.join(dirs["pids"], "pids.max"), str(max_procs + 4))
        except BaseException:
            RunGroup(dirs).close()
            raise
        group = RunGroup(dirs)
        group.owner = self._live
        self._live.add(group)
        return group

    def close(self) -> None:
        """Close the runs' groups still open (their processes killed), then remove the parent groups."""
        for group in list(self._live):
            group.close()
        for d in dict.fromkeys(self.parents.values()):
            with contextlib.suppress(OSError):
                os.rmdir(d)


def _prefix() -> str:
    """``scalerl-<host name>-``: the parent groups' names start with it, so that a sweep on one machine (or
    container: a pid is only this host's) never takes another's groups in a hierarchy they share."""
    return "scalerl-" + "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in os.uname().nodename) + "-"


def _sweep_stale(base: str) -> None:
    """Remove the groups a trainer of this host that died without cleaning up left under ``base``
    (``scalerl-<host>-<pid>`` of a pid that no longer runs), killing anything still in them."""
    prefix = _prefix()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = name.removeprefix(prefix)
            if name.startswith(prefix) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                d = os.path.join(base, name)
                with contextlib.suppress(OSError):
                    for run in os.listdir(d):
                        if os.path.isdir(os.path.join(d, run)):
                            RunGroup({"any": os.path.join(d, run)}).close(rounds=50)
                    os.rmdir(d)


@functools.cache
def find() -> Cgroups | None:
    """The trainer's :class:`Cgroups` where it is root and can make groups in writable v1 ``memory``, ``cpu``,
    ``cpuacct`` and ``pids`` hierarchies (checked by making one), else None. Cached per process."""
    if os.geteuid() != 0:
        return None
    mounts, own = _v1_mounts(), _own_paths()
    if set(_CONTROLLERS) - set(mounts):
        return None
    parents: dict[str, str] = {}
    try:
        for ctl in _CONTROLLERS:
            base = os.path.join(mounts[ctl], own.get(ctl, "/").lstrip("/"))
            if not os.path.isdir(base):  # a cgroup namespace: the mount is this process's own group
                base = mounts[ctl]
            _sweep_stale(base)
            d = os.path.join(base, f"{_prefix()}{os.getpid()}")
            if d not in parents.values():
                os.makedirs(d, exist_ok=True)
            parents[ctl] = d
        groups = Cgroups(parents)
        groups.new(64 << 20, 1.0, 4).close()
    except (OSError, ValueError, KeyError):
        for d in dict.fromkeys(parents.values()):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        return None
    import atexit

    atexit.register(groups.close)
    return groups
