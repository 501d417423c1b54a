"""A bounded pool of sandbox workers, so code rewards run beside generation and no program stalls a batch.

Each worker is a thread that drives one sandboxed run at a time (:meth:`Sandbox.run
<scalerl_jax.rewards.sandbox.Sandbox.run>`: the program's and the tests' sandboxed processes); the thread only waits
on pipes, so the GIL is free for the trainer while programs run. At most ``config.workers`` programs run at once,
and each carries its own wall clock, so a program that never ends holds one worker for ``timeout_s`` and the rest
of the batch flows past it. :meth:`CodePool.submit` returns a future right away (score completions as they arrive
from the generators); :meth:`CodePool.map` returns one :class:`~scalerl_jax.rewards.code.CodeResult` per job, in
order, always: a failure of the machinery becomes a ``sandbox_error`` result, never an exception.

    with CodePool(SandboxConfig(workers=8)) as pool:
        results = pool.map([CodeJob(program, tests, entry_point), ...])
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple, Self

from scalerl_jax.rewards.code_types import REASONS, CodeResult, SandboxConfig
from scalerl_jax.rewards.sandbox import Sandbox

# A worker whose run overshoots its own wall clock by this much is considered lost (a bug in the machinery, not a
# slow program: the program was killed at timeout_s); map() then reports sandbox_error for it and moves on.
_LOST_AFTER_S = 30.0


class CodeJob(NamedTuple):
    """One program to run against its tests (``entry_point``: HumanEval's ``check(candidate)`` target;
    ``prompt``: the task's code prefix, whose helper definitions the tests take from the task, not the program)."""

    program: str
    tests: str
    entry_point: str | None = None
    prompt: str = ""


class SandboxUnhealthy(RuntimeError):
    """Too many of the pool's runs failed in the sandbox itself (not in the program): the run stops."""


class CodePool:
    """``config.workers`` concurrent sandboxed runs under one :class:`Sandbox` (isolation chosen once, at
    construction; see :attr:`isolation`). Use as a context manager or call :meth:`close`. Thread-safe, and callers
    may share it (training and evaluation): a job's deadline starts when a worker picks it up, not when it was
    queued behind another caller's jobs."""

    def __init__(self, config: SandboxConfig | None = None, sandbox: Sandbox | None = None, *,
                 max_error_rate: float | None = None, min_runs: int = 32) -> None:
        """``max_error_rate``: once ``min_runs`` programs have run, :meth:`map` raises :class:`SandboxUnhealthy`
        when more than this fraction of them came back as sandbox errors (a broken sandbox would otherwise hand the
        policy -1 for every program it writes); None: never."""
        self.max_error_rate, self.min_runs = max_error_rate, int(min_runs)
        self.sandbox = sandbox or Sandbox(config)
        self.config = self.sandbox.config
        self._ex = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="code-sandbox")
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)
        self._lost = 0
        self._errors: list[str] = []  # the last few sandbox errors' details, for SandboxUnhealthy's message
        self._seconds = 0.0

    @property
    def isolation(self) -> str:
        """The isolation every run of this pool uses: ``"bwrap"``, ``"rlimits"`` or ``"none"``."""
        return self.sandbox.isolation

    def _run(self, job: CodeJob, started: list[float]) -> CodeResult:
        # ``started``: when a worker picked the job up (its deadline starts there), then when it ended or was given up
        started.append(time.monotonic())
        try:
            extra = {"prompt": job.prompt} if job.prompt else {}  # a stand-in sandbox need not take a prompt
            r = self.sandbox.run(job.program, job.tests, job.entry_point, **extra)
        except BaseException as e:  # noqa: BLE001 -- Sandbox.run does not raise; if it ever does, still a result
            r = CodeResult(False, "sandbox_error", time.monotonic() - started[0], f"{type(e).__name__}: {e}",
                           self.isolation)
        with self._lock:
            if len(started) == 1:  # else map() gave up on it and counted it already
                self._counts[r.reason] = self._counts.get(r.reason, 0) + 1
                if r.reason == "sandbox_error":
                    self._errors = [*self._errors[-4:], r.detail[:300]]
                self._seconds += r.seconds
                started.append(time.monotonic())  # done: map() no longer gives up on it
        return r

    def submit(self, program: str, tests: str, entry_point: str | None = None, prompt: str = ""
               ) -> Future[CodeResult]:
        """Queue one run; the future's result is always a :class:`CodeResult`."""
        return self._ex.submit(self._run, CodeJob(program, tests, entry_point, prompt), [])

    def map(self, jobs: Iterable[CodeJob]) -> list[CodeResult]:
        """Run every job (at most ``workers`` at once) and return one result per job, in order. A job waits in the
        queue as long as it must; once a worker has picked it up it has ``timeout_s`` plus :data:`_LOST_AFTER_S` to
        come back, else it is reported, and counted, as a ``sandbox_error``."""
        pending = []
        for j in jobs:
            started: list[float] = []
            pending.append((started, self._ex.submit(self._run, CodeJob(*j), started)))
        out = [self._wait(started, f) for started, f in pending]
        self.check_health()
        return out

    def check_health(self) -> None:
        """Raise :class:`SandboxUnhealthy` when the sandbox error rate is over ``max_error_rate`` (see __init__)."""
        s = self.stats()
        if self.max_error_rate is not None and s["runs"] >= self.min_runs and s["error_rate"] > self.max_error_rate:
            raise SandboxUnhealthy(
                f"{s['sandbox_error']} of {s['runs']} sandboxed programs came back as sandbox errors "
                f"({s['error_rate']:.0%} > sandbox.max_error_rate {self.max_error_rate:.0%}; {s['lost']} lost, "
                f"{s['timeout']} timeouts) under {self.sandbox.describe()}: stopping rather than training on -1 "
                "rewards the policy did not earn; check the sandbox (bubblewrap, limits, sandbox.workers). A sandbox "
                "error is a failure of the machinery (it did not start, a worker never came back), never how a "
                f"program ended; the last ones: {' | '.join(self._errors) or 'none recorded'}")

    def _wait(self, started: list[float], f: Future) -> CodeResult:
        allowed = self.config.timeout_s + _LOST_AFTER_S
        while True:
            left = started[0] + allowed - time.monotonic() if started else allowed
            try:
                return f.result(timeout=max(0.01, min(left, 1.0)))
            except FutureTimeout:
                if started and time.monotonic() - started[0] > allowed:
                    r = CodeResult(False, "sandbox_error", time.monotonic() - started[0],
                                   f"no result from the sandbox worker {allowed:g} s after it started the job",
                                   self.isolation)
                    with self._lock:
                        if len(started) > 1:  # it came back just now
                            continue
                        self._lost += 1
                        started.append(time.monotonic())
                        self._counts["sandbox_error"] += 1
                        self._errors = [*self._errors[-4:], r.detail[:300]]
                        self._seconds += r.seconds
                    return r

    def stats(self) -> dict[str, float]:
        """Runs so far: one count per reason (``timeout`` and ``sandbox_error`` included; a job whose worker never
        came back counts as a ``sandbox_error`` and in ``lost``), ``runs``, ``error_rate`` (sandbox errors per run)
        and ``mean_seconds``."""
        with self._lock:
            runs = sum(self._counts.values())
            return {**self._counts, "lost": self._lost, "runs": runs,
                    "error_rate": self._counts["sandbox_error"] / runs if runs else 0.0,
                    "mean_seconds": self._seconds / runs if runs else 0.0}

    def close(self) -> None:
        """Wait for queued runs, then stop the workers."""
        self._ex.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
