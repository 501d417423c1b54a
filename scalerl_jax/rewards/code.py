"""Code reward: +1 when a completion's program passes its task's tests in a sandbox, else -1.

    python -m scalerl_jax.rewards.code --program FILE --tests FILE [--entry-point NAME] [--timeout S]

runs FILE then its tests and prints one JSON object ``{"passed": bool, "reason": str, "seconds": float,
"isolation": str, "detail": str}``; it exits 0 whether the program passed or not (2 for a usage error). Tests are
plain asserts, or, with ``--entry-point NAME``, HumanEval-style: they define ``check(candidate)``, which is called
with the program's function ``NAME``.

The sandbox (:mod:`scalerl_jax.rewards.sandbox`) is the security boundary of the system: with bubblewrap the
program sees no network, no host file system beyond a read-only interpreter and system libraries, no host
processes, a fresh size-capped scratch directory, and runs under rlimits (CPU seconds, address space, processes,
file size, open files), a wall clock that kills its whole process tree, and capped output. Where bubblewrap cannot
start it falls back to rlimits and a process group with a loud warning; every :class:`CodeResult` names the
isolation it ran under. The verdict is written by a harness after the tests ran, over a pipe carrying a per-run
nonce, never read from the program's output.

Reasons (:data:`REASONS`): ``passed``; ``failed`` (an assert or exception in the program or its tests, with the
message and line in ``detail``); ``timeout`` (wall clock or CPU limit); ``memory`` (a MemoryError under the
address-space limit, or the run's processes together over ``memory_mb``); ``output_limit`` (more than ``max_output_bytes`` on stdout or stderr); ``crash`` (the run
ended before a verdict: ``os._exit``, a signal, a closed harness); ``sandbox_error`` (the machinery failed).

What the sandbox does not stop:

- The rlimits fallback has no namespaces: the program sees the host's file system (as a fresh uid when the
  trainer is root; otherwise as the trainer's own user, whose files and processes it can then reach) and the
  network. It exists so that runs do not stop, and says so in every result and in a warning.
- The rlimits fallback's scratch directory is on the host's disk, and world-writable directories (``/tmp``) are
  writable there; only file size is capped.
- The harness shares an interpreter with the program it judges (HumanEval's ``check`` calls the program's
  functions), so a program that deliberately inspects the harness's frames, returns objects equal to anything or
  monkeypatches modules the tests use can fake a pass. The nonce stops blind forgery (printed lines, closed
  streams, early exits, writes to guessed descriptors), and the tests' ``check`` cannot be swapped through the
  program's globals; the sandbox, not the verdict, protects the host.
- No seccomp filter: inside the namespaces the kernel's whole system-call surface is reachable.
- ``RLIMIT_AS`` binds each process exactly; the run's total is sampled every 0.25 s, so a burst can exceed
  ``memory_mb`` briefly (never ``max_procs * memory_mb``).

Batches go through a bounded pool of workers (:class:`~scalerl_jax.rewards.code_pool.CodePool`), so code rewards
run beside generation and one slow program holds one worker for at most its own timeout.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from scalerl_jax.data.code_tasks import CodeTask
    from scalerl_jax.rewards.code_pool import CodePool

Isolation = Literal["auto", "bwrap", "rlimits", "none"]
ISOLATIONS = ("auto", "bwrap", "rlimits", "none")
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
    ``"bwrap"`` or ``"rlimits"`` (refuse to start without it), ``"none"`` (unsandboxed: only the wall clock and
    the output cap; used only when chosen explicitly). ``workers``: concurrent runs in a
    :class:`~scalerl_jax.rewards.code_pool.CodePool`.
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

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_procs", "max_file_mb", "max_open_files",
                     "max_output_bytes", "workers"):
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


def classify_run(killed: str | None, verdict: tuple[str, str] | None, started: bool, rc: int, isolation: str,
                 cfg: SandboxConfig, seconds: float, stdout: str = "", stderr: str = "") -> CodeResult:
    """What a finished run means, in this order: a limit the trainer enforced (``killed``: ``"timeout"``,
    ``"output"``, ``"memory"`` or ``"flood"``, a program writing into the verdict pipe), else the harness's
    ``(reason, detail)`` verdict, else a sandbox that never started (``sandbox_error``), else how the run ended
    (``rc``: the exit status of bubblewrap or the fallback launcher, ``128 + signal`` for a signal, ``124`` for the
    launcher's own clock)."""

    def result(reason: str, detail: str) -> CodeResult:
        return CodeResult(reason == "passed", reason, seconds, detail, isolation, stdout, stderr)

    limits = {"timeout": ("timeout", f"over the {cfg.timeout_s:g} s wall clock"),
              "output": ("output_limit", f"printed over {cfg.max_output_bytes} bytes on stdout or stderr"),
              "memory": ("memory", f"the run's processes held over {cfg.memory_mb} MB together"),
              "flood": ("crash", "the program wrote into the harness's verdict pipe")}
    if killed is not None:
        return result(*limits[killed])
    if verdict is not None:
        return result(verdict[0] if verdict[0] in REASONS else "crash", verdict[1])
    if not started:
        return result("sandbox_error", "the sandbox did not start: " + stderr[-600:])
    sig = rc - 128 if rc > 128 else -rc if rc < 0 else 0
    if rc == 124 and isolation != "bwrap":
        return result(*limits["timeout"])
    if sig == signal.SIGXCPU:
        return result("timeout", f"over the {math.ceil(cfg.cpu_s)} s CPU limit")
    if sig == signal.SIGXFSZ:
        return result("crash", f"wrote a file over the {cfg.max_file_mb} MB limit")
    if sig:
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return result("crash", f"killed by {name} before the tests finished")
    return result("crash", f"exited with code {rc} before the tests finished")


def run_program(program: str, tests: str, entry_point: str | None = None,
                config: SandboxConfig | None = None) -> CodeResult:
    """Run one program and its tests in a fresh :class:`~scalerl_jax.rewards.sandbox.Sandbox` (the isolation probe
    is cached per process). For many programs use a :class:`~scalerl_jax.rewards.code_pool.CodePool`."""
    from scalerl_jax.rewards.sandbox import Sandbox

    return Sandbox(config).run(program, tests, entry_point)


_default: CodePool | None = None
_default_lock = threading.Lock()


def default_pool() -> CodePool:
    """A process-wide :class:`~scalerl_jax.rewards.code_pool.CodePool` with the default config, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            from scalerl_jax.rewards.code_pool import CodePool

            _default = CodePool(SandboxConfig())
        return _default


def code_results(completions: Sequence[str], tasks: Sequence[CodeTask], pool: CodePool | None = None
                 ) -> list[CodeResult]:
    """One :class:`CodeResult` per completion: the program extracted from it
    (:func:`~scalerl_jax.data.code_tasks.extract_program`) run against its task's tests through ``pool`` (default:
    :func:`default_pool`). A completion without a program fails without a run (``detail`` says so)."""
    from scalerl_jax.data.code_tasks import extract_program

    if len(completions) != len(tasks):
        raise ValueError(f"code_results: {len(completions)} completions for {len(tasks)} tasks")
    pool = pool or default_pool()
    programs = [extract_program(c, t.code_prefix, t.entry_point) for c, t in zip(completions, tasks, strict=True)]
    from scalerl_jax.rewards.code_pool import CodeJob

    runs = [k for k, p in enumerate(programs) if p is not None]
    ran = dict(zip(runs, pool.map([CodeJob(programs[k], tasks[k].tests, tasks[k].entry_point) for k in runs]),
                   strict=True))
    return [ran.get(k) or CodeResult(False, "failed", 0.0, NO_PROGRAM, pool.isolation) for k in range(len(programs))]


def score_code(completions: Sequence[str], tasks: Sequence[CodeTask], pool: CodePool | None = None
               ) -> tuple[np.ndarray, dict[str, int]]:
    """+1/-1 rewards (float32) for paired completions and code tasks, and counts: ``"timeouts"``, ``"no_answer"``
    (no program found) and one count per reason of :data:`REASONS`."""
    results = code_results(completions, tasks, pool)
    rewards = np.array([1.0 if r.passed else -1.0 for r in results], np.float32)
    counts = dict.fromkeys(REASONS, 0)
    for r in results:
        counts[r.reason] = counts.get(r.reason, 0) + 1
    counts["timeouts"] = counts["timeout"]
    counts["no_answer"] = sum(r.detail == NO_PROGRAM for r in results)
    return rewards, counts


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring). Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m scalerl_jax.rewards.code",
                                 description="Run a program and its tests in the code sandbox; print one JSON line.")
    ap.add_argument("--program", required=True, help="the program (Python source file)")
    ap.add_argument("--tests", required=True, help="its tests: plain asserts, or check(candidate) with --entry-point")
    ap.add_argument("--entry-point", default=None, help="function passed to the tests' check(candidate)")
    ap.add_argument("--timeout", type=float, default=SandboxConfig.timeout_s, help="wall clock of the run, seconds")
    ap.add_argument("--memory-mb", type=int, default=SandboxConfig.memory_mb, help="address space per process")
    ap.add_argument("--isolation", choices=ISOLATIONS, default="auto",
                    help="auto: bubblewrap, else rlimits with a warning; none runs the program unsandboxed")
    a = ap.parse_args(argv)
    texts = []
    for flag, path in (("--program", a.program), ("--tests", a.tests)):
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError) as e:
            ap.error(f"{flag} {path}: {e}")
    try:
        cfg = SandboxConfig(timeout_s=a.timeout, cpu_s=a.timeout, memory_mb=a.memory_mb, isolation=a.isolation)
    except ValueError as e:
        ap.error(str(e))
    from scalerl_jax.rewards.sandbox import SandboxError

    try:
        result = run_program(texts[0], texts[1], a.entry_point, cfg)
    except SandboxError as e:
        result = CodeResult(False, "sandbox_error", 0.0, str(e), a.isolation)
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
