"""The launcher: the process between the trainer and one sandboxed interpreter, shipped as source to
``python -I -S -c`` by :func:`scalerl_jax.rewards.harness.source` (every function self-contained, imports inside).

It joins the run's cgroups where the trainer made them (before anything else, so all it starts is counted
there), drops root to the interpreter's fresh uid (making paths that uid cannot reach visible in a private mount
namespace), then either execs bubblewrap, or, in the rlimits mode, starts the interpreter itself:

- as the init of new pid, network, IPC and mount namespaces, where the kernel allows them (root makes them;
  anyone else needs unprivileged user namespaces), its scratch directory a size-capped tmpfs;
- confined by Landlock (:func:`_landlock`) and by a seccomp filter without sockets, memfd or System V IPC
  (:func:`_no_sockets`); without a network namespace or that filter it refuses to start, and without Landlock
  unless the trainer named the weaker mode;
- it reports how the interpreter ended (its own clock, the kernel's signal, the CPU time) on its status pipe, which
  the interpreter does not hold;
- under its wall clock, then its whole process tree is killed: reaping the pid namespace's init empties the
  namespace, else a sweep of the launcher's descendants (it is their child subreaper). SIGTERM from the trainer,
  or the trainer's death, ends the run the same way.
"""

from __future__ import annotations


def _launcher_main() -> None:
    """Between the trainer and one sandboxed interpreter (argv: JSON config). Drops root to the run's uid, then
    execs bubblewrap, or (rlimits) confines and supervises the interpreter: a pid and a network namespace where the
    kernel allows one, Landlock, the wall clock, then kill its whole tree (SIGTERM from the trainer does the same)."""
    import contextlib
    import ctypes
    import os
    import select
    import signal
    import sys
    import time

    c = eval(sys.argv[1], {"__builtins__": {}})  # noqa: S307 -- the trainer's own repr() of plain values

    def status_line(**kw) -> bytes:  # one JSON line (bools, ints, plain strings), without importing json
        def js(v):
            return ("true" if v else "false") if type(v) is bool else str(v) if type(v) is int else \
                '"' + str(v).replace("\\", "/").replace('"', "'") + '"'
        return ("{" + ", ".join(f'"{k}": {js(v)}' for k, v in kw.items()) + "}\n").encode()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ms_bind, ms_rec, ms_private, ms_nosuid, ms_nodev = 4096, 16384, 1 << 18, 2, 4

    def ok(ret: int, what: str) -> None:
        if ret != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    uid, status_fd = c["uid"], c["status_fd"]
    for procs in c.get("cgroup_procs", []):  # our cgroups, before anything else: all we start is counted there
        if not _write(procs, str(os.getpid())):
            os.write(status_fd, status_line(refused=f"could not join the run's cgroup ({procs})"))
            os._exit(126)
    if uid is not None and c["mode"] == "rlimits":
        c["env"]["SANDBOX_ONLY_TASK"] = "1"  # a fresh uid: the interpreter is its only task
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
        argv = c["argv"]
        if os.uname().machine in ("x86_64", "aarch64"):  # bubblewrap installs it just before the interpreter starts
            import struct

            sfd = os.memfd_create("scalerl-seccomp", 0)
            os.write(sfd, b"".join(struct.pack("<HBBI", *i) for i in _seccomp_program(False)))
            os.lseek(sfd, 0, os.SEEK_SET)
            argv = [argv[0], "--seccomp", str(sfd), *argv[1:]]
        drop()
        os.execv(argv[0], argv)

    confined = {"pidns": False, "netns": False, "ipcns": False, "scratch_tmpfs": False, "landlock": 0,
                "seccomp": False}
    if c["mode"] == "rlimits":
        # A pid namespace: the interpreter is its init, and when it ends the kernel kills everything it left. A
        # network namespace: no network at all. An IPC namespace: no System V object outlives the run. A mount
        # namespace: the scratch directory is a size-capped tmpfs. Root may make them all; anyone else needs a user
        # namespace as well.
        me, gid = os.getuid(), os.getgid()
        pid_net, ipc_mnt = 0x20000000 | 0x40000000, 0x08000000 | 0x00020000
        if c["namespaces"] and me == 0 and libc.unshare(pid_net | ipc_mnt) == 0 or c["namespaces"] and (
                me != 0 and libc.unshare(0x10000000 | pid_net | ipc_mnt) == 0
                and all(_write(f"/proc/self/{f}", t) for f, t in (("setgroups", "deny"), ("uid_map", f"{me} {me} 1"),
                                                                 ("gid_map", f"{gid} {gid} 1")))):
            confined.update(pidns=True, netns=True, ipcns=True)
            c["env"]["SANDBOX_ONLY_TASK"] = "1"  # the interpreter is the only task of its user in its namespaces
        elif me == 0 and libc.unshare(ipc_mnt) == 0:  # root without the pid and network namespaces (the tests' path)
            confined["ipcns"] = True
        if confined["ipcns"]:  # a mount namespace of our own came with it: cap the scratch directory's size
            ok(libc.mount(b"none", b"/", None, ms_rec | ms_private, None), "make / private")
            owner = uid if uid is not None else me
            opts = f"size={c['scratch_bytes']},nr_inodes=4096,mode=700,uid={owner},gid={owner if uid else gid}"
            ok(libc.mount(b"tmpfs", c["scratch"].encode(), b"tmpfs", ms_nosuid | ms_nodev, opts.encode()),
               "tmpfs on the scratch directory")
            confined["scratch_tmpfs"] = True
        # the kernel's Landlock ABI, 0 if none (or if the trainer's tests ask to run as on such a kernel)
        confined["landlock"] = max(0, libc.syscall(444, None, 0, 1)) if c["landlock"] else 0
        confined["seccomp"] = os.uname().machine in ("x86_64", "aarch64")  # the socket filter knows these
        if not confined["netns"] and not confined["seccomp"]:
            os.write(status_fd, status_line(refused="no network namespace (neither root nor unprivileged user "
                                              f"namespaces) and no socket filter for {os.uname().machine}: the "
                                              "rlimits mode would have network"))
            os._exit(126)
        if not confined["landlock"] and not c["weak"]:
            os.write(status_fd, status_line(refused="no Landlock in this kernel: the rlimits mode would read and "
                                              "write the host's files; name isolation='rlimits-weak' to run without"))
            os._exit(126)

    class Stop(Exception):  # noqa: N818 -- the trainer asks for an end (SIGTERM, or our parent died)
        pass

    def stop(*_):
        raise Stop

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # delivered only once the child is watched
    signal.signal(signal.SIGTERM, stop)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: if the trainer goes, clean up as on SIGTERM
    libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the run come back to us to be killed
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            os.setsid()
            os.close(status_fd)
            drop()
            os.chdir(c["scratch"])
            if c["mode"] == "rlimits":
                libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: needed to confine oneself without privileges
                if confined["landlock"]:
                    _landlock(libc, confined["landlock"], c["read"], c["scratch"])
                if confined["seccomp"]:
                    _no_sockets(libc)
            os.execve(c["argv"][0], c["argv"], c["env"])
        except BaseException as e:  # noqa: BLE001 -- reported, then the distinct exit code below
            os.write(2, f"sandbox launcher: {e!r}\n".encode())
        os._exit(125)
    os.write(status_fd, status_line(started=True, **confined))
    for fd in c["close"]:
        os.close(fd)

    def sweep() -> None:  # kill our descendants (orphans included: we are their subreaper) until none is left
        if confined["pidns"]:  # the namespace's init was our child: once reaped, the kernel has emptied it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return
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

    status, timed_out, cpu = None, False, 0.0
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        pidfd = os.pidfd_open(pid)
        timed_out = not select.select([pidfd], [], [], c["timeout"])[0]
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
    except Stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        sweep()
        os._exit(143)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sweep()
    # What this launcher observed, on the status pipe the interpreter does not hold: its own clock, the kernel's
    # signal, the interpreter's CPU time. The trainer classifies by this, never by an exit status the program chose.
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0
    ended = "timeout" if timed_out else "signal" if sig else "exit"
    with contextlib.suppress(OSError):
        os.write(status_fd, status_line(ended=ended, signal=sig, code=code, cpu_ms=int(cpu * 1000)))
    if timed_out:
        os._exit(124)
    os._exit(128 + sig if sig else code)


def _write(path: str, text: str) -> bool:
    """Write ``text`` to ``path``; False on any OSError."""
    import os

    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def _landlock(libc, abi: int, read: list, scratch: str) -> None:
    """Confine this process and its descendants with Landlock: read and execute only ``read`` (``[path, full]``:
    the interpreter, the system libraries and ``/proc``; a directory that holds a hidden one (``site-packages``)
    may only be listed), a few devices, write only inside ``scratch`` and
    to ``/dev/null``; no TCP bind or connect (ABI >= 4); no signals to, and no abstract unix sockets of, processes
    outside this domain (ABI >= 6). Landlock also denies ptrace (and so ``/proc/PID/mem``) outside the domain."""
    import ctypes
    import os

    fs = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    net = 3 if abi >= 4 else 0
    scoped = 3 if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(444, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = (("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32))

    def allow(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not os.path.isdir(path):
                access &= 1 | 2 | 4 | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)  # file rights only
            rule = Beneath(access & fs, fd)
            if libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        finally:
            os.close(fd)

    for p, full in read:
        allow(p, 1 | 4 | 8 if full else 8)  # execute, read file, read dir; or list only (it holds a hidden dir)
    for p in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"):
        allow(p, 2 | 4)
    allow(scratch, fs)
    if libc.syscall(446, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def _seccomp_program(sockets: bool) -> list:
    """A seccomp filter as ``(code, jt, jf, k)`` instructions: the calls that hold memory outside the address-space
    limit and the run's accounting (``memfd_create``, ``memfd_secret``, System V ``shmget`` / ``semget`` /
    ``msgget``) fail with EACCES, and with ``sockets`` also ``socket()`` and ``io_uring_setup()`` (``socketpair``
    and pipes still work; no network without a network namespace); every call of another ABI (x32, 32-bit compat)
    fails too. x86_64 and aarch64 only (KeyError elsewhere)."""
    import os

    arch, nrs = {"x86_64": (0xC000003E, (319, 447, 29, 64, 68) + ((41, 425) if sockets else ())),
                 "aarch64": (0xC00000B7, (279, 447, 194, 190, 186) + ((198, 425) if sockets else ()))}[
        os.uname().machine]
    deny, allow = 0x00050000 | 13, 0x7FFF0000  # SECCOMP_RET_ERRNO | EACCES, SECCOMP_RET_ALLOW
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    n = len(nrs)  # each denied number jumps over the rest to the deny at the end
    return [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (ld, 0, 0, 0), (jge, n + 1, 0, 0x40000000),
            *((jeq, n - i, 0, nr) for i, nr in enumerate(nrs)), (ret, 0, 0, allow), (ret, 0, 0, deny)]


def _no_sockets(libc) -> None:
    """Install :func:`_seccomp_program` with sockets denied on this process (and its descendants)."""
    import ctypes

    code = _seccomp_program(True)

    class Insn(ctypes.Structure):
        _fields_ = (("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32))

    class Prog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn)))

    insns = (Insn * len(code))(*(Insn(*i) for i in code))
    prog = Prog(len(code), insns)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter")
