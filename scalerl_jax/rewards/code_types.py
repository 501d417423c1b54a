"""What the code reward's pieces share: :class:`SandboxConfig`, :class:`CodeResult`, the reasons a run ends with,
and :func:`classify_run`, which turns how a sandboxed run ended into a result. A leaf module: the sandbox
(:mod:`~scalerl_jax.rewards.sandbox`), the pool (:mod:`~scalerl_jax.rewards.code_pool`) and the reward and command
line (:mod:`~scalerl_jax.rewards.code`) import it, and it imports none of them."""

from __future__ import annotations

import math
import signal
from dataclasses import asdict, dataclass
from typing import Literal

Isolation = Literal["auto", "bwrap", "rlimits", "rlimits-weak", "none"]
ISOLATIONS = ("auto", "bwrap", "rlimits", "rlimits-weak", "none")
REASONS = ("passed", "failed", "timeout", "memory", "output_limit", "crash", "sandbox_error")
NO_PROGRAM = "no program in the completion"  # the detail of a completion that had nothing to run
HEAD_BYTES = 4096  # stdout / stderr kept in a result


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of the code sandbox (one run = one program plus its tests).

    ``timeout_s`` is the wall clock of a whole run (start-up included); ``cpu_s`` the CPU seconds of each process
    (``RLIMIT_CPU``, rounded up); ``memory_mb`` each process's address space; ``max_procs`` the processes and
    threads a run may add; ``max_file_mb`` the largest file it may write and the size of each of its two tmpfs
    (``/sandbox``, ``/tmp``); ``max_open_files`` its descriptors; ``max_output_bytes`` the most it may print on
    stdout or on stderr before it is killed. ``isolation``: ``"auto"`` (bubblewrap, else rlimits with a warning),
    ``"bwrap"`` or ``"rlimits"`` (refuse to start without it; ``"rlimits"`` also refuses on a kernel without
    Landlock), ``"rlimits-weak"`` (the rlimits mode where the kernel has no Landlock: the host's files are
    readable and writable by the run's uid; never chosen by ``"auto"``), ``"none"`` (unsandboxed: only the wall
    clock and the output cap; used only when chosen explicitly). ``workers``: concurrent runs in a
    :class:`~scalerl_jax.rewards.code_pool.CodePool`. ``cgroups``: give each interpreter a cgroup of its own where
    the host allows it (root with writable cgroup v1 hierarchies, :mod:`scalerl_jax.rewards.cgroups`): ``memory_mb``
    then also bounds what the address space does not count (tmpfs files, shared memory, page cache), the whole tree
    gets ``cpu_cores`` cores at most and ``cpu_s`` CPU seconds in all, and ``max_procs`` binds across uids.
    """

    timeout_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 1024
    max_procs: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20
    isolation: Isolation = "auto"
    workers: int = 4
    cgroups: bool = True
    cpu_cores: float = 1.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_procs", "max_file_mb", "max_open_files",
                     "max_output_bytes", "workers", "cpu_cores"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_open_files < 16:
            raise ValueError(f"SandboxConfig.max_open_files must be >= 16 (the interpreter needs some), got "
                             f"{self.max_open_files}")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxConfig.memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"SandboxConfig.isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.workers > 1024:
            raise ValueError(f"SandboxConfig.workers must be <= 1024, got {self.workers}")


@dataclass(frozen=True)
class CodeResult:
    """The outcome of one run. ``reason`` is one of :data:`REASONS`; ``detail`` says more (the failing assert and
    its line, the signal, the limit); ``isolation`` is what the run actually ran under (``"bwrap"``, ``"rlimits"``,
    ``"none"``); ``stdout`` / ``stderr`` are the first :data:`HEAD_BYTES` of each, kept for reading, never used to
    judge."""

    passed: bool
    reason: str
    seconds: float
    detail: str = ""
    isolation: str = ""
    stdout: str = ""
    stderr: str = ""

    def to_json(self) -> dict:
        """The result as a JSON-ready dict."""
        return asdict(self)

    def summary(self) -> dict:
        """What the command line prints: passed, reason, seconds, isolation, detail."""
        return {"passed": self.passed, "reason": self.reason, "seconds": round(self.seconds, 4),
                "isolation": self.isolation, "detail": self.detail}


def tree_cpu_limit_s(cfg: SandboxConfig) -> float:
    """The CPU seconds an interpreter's whole process tree may use together where a cgroup counts them: what one
    process may use (``RLIMIT_CPU``'s hard limit, one second past ``cpu_s`` rounded up: a pid namespace's init
    ignores the soft limit's signal), so a lone process still ends by its own limit, and half a second for the
    launcher's start-up."""
    return math.ceil(cfg.cpu_s) + 1.5


def signal_name(sig: int) -> str:
    """``SIGSEGV`` for 11; ``signal 40`` for a number without a name (real-time signals, or none at all)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def classify_run(killed: str | None, verdict: tuple[str, str] | None, started: bool, ended: dict | None,
                 isolation: str, cfg: SandboxConfig, seconds: float, stdout: str = "", stderr: str = "") -> CodeResult:
    """What a finished run means, in this order: a limit the trainer or the kernel enforced (``killed``:
    ``"timeout"``, ``"output"``, ``"memory"``, ``"cpu"`` (the tree's CPU time in its cgroup) or ``"oom"`` (the
    cgroup's OOM kill count)), else the tests process's ``(reason, detail)`` verdict, else a sandbox that never
    started (``sandbox_error``), else how the interpreter ended as observed outside it (``ended``: see
    :func:`scalerl_jax.rewards.sandbox_procs._ended`). Only observations make a reason: the launcher's own clock and a
    CPU time at the limit are a ``timeout``; anything else that ended a started run (an exit status, a signal,
    however unusual) is a ``crash`` of the program, whatever number the program chose, never a ``sandbox_error``."""

    def result(reason: str, detail: str) -> CodeResult:
        return CodeResult(reason == "passed", reason, seconds, detail, isolation, stdout, stderr)

    limits = {"timeout": ("timeout", f"over the {cfg.timeout_s:g} s wall clock"),
              "output": ("output_limit", f"printed over {cfg.max_output_bytes} bytes on stdout or stderr"),
              "memory": ("memory", f"the run's processes held over {cfg.memory_mb} MB together"),
              "oom": ("memory", f"the kernel ended a process over the {cfg.memory_mb} MB limit of its cgroup "
                                "(every page it held counted)"),
              "cpu": ("timeout", f"the run's processes used over {tree_cpu_limit_s(cfg):g} CPU seconds together")}
    if killed is not None:
        return result(*limits[killed])
    if verdict is not None:
        return result(verdict[0] if verdict[0] in REASONS else "crash", verdict[1])
    if not started:
        return result("sandbox_error", "the sandbox did not start: " + stderr[-600:])
    ended = ended or {}
    how, sig, code = ended.get("how", "gone"), int(ended.get("signal", 0)), int(ended.get("code", 0))
    cpu_limit = math.ceil(cfg.cpu_s)
    if how == "timeout":
        return result(*limits["timeout"])
    # rusage reads a little under the limit when RLIMIT_CPU fires (1.95 s at 2 s): a margin, not the exit status
    if float(ended.get("cpu", 0.0)) >= cpu_limit - 0.25:
        return result("timeout", f"over the {cpu_limit} s CPU limit")
    # The kernel's CPU-limit signal, as the launcher's wait4 saw it: on a loaded (virtual) machine the tick-sampled
    # CPU time that RLIMIT_CPU checks can run ahead of the rusage read after it, so the CPU reading alone misses
    # some. A program that sends itself SIGXCPU gains nothing by it: it fails either way, never as sandbox_error.
    if how == "signal" and sig == signal.SIGXCPU:
        return result("timeout", f"over the {cpu_limit} s CPU limit")
    if how == "signal" and sig == signal.SIGXFSZ:
        return result("crash", f"wrote a file over the {cfg.max_file_mb} MB limit")
    if how == "signal":
        return result("crash", f"killed by {signal_name(sig)} before the tests finished")
    if how == "exit":
        return result("crash", f"exited with code {code} before the tests finished")
    if how == "status":  # bubblewrap's: 128 + N for a signal N, and the same for an exit code the program chose
        return result("crash", f"ended with status {code} before the tests finished")
    return result("crash", "ended before the tests finished")
