"""A bounded pool of sandbox workers, so code rewards run beside generation and no program stalls a batch.

Each worker is a thread that drives one sandboxed run at a time (:meth:`Sandbox.run
<scalerl_jax.rewards.sandbox.Sandbox.run>`: a launcher process, bubblewrap, the harness); the thread only waits
on pipes, so the GIL is free for the trainer while programs run. At most ``config.workers`` programs run at once,
and each carries its own wall clock, so a program that never ends holds one worker for ``timeout_s`` and the rest
of the batch flows past it. :meth:`CodePool.submit` returns a future right away (score completions as they arrive
from the generators); :meth:`CodePool.map` returns one :class:`~scalerl_jax.rewards.code.CodeResult` per job, in
order, always: a failure of the machinery becomes a ``sandbox_error`` result, never an exception.

    with CodePool(SandboxConfig(workers=8)) as pool:
        results = pool.map([CodeJob(program, tests, entry_point), ...])
"""

from __future__ import annotations

import math
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
    """One program to run against its tests (``entry_point``: HumanEval's ``check(candidate)`` target)."""

    program: str
    tests: str
    entry_point: str | None = None


class CodePool:
    """``config.workers`` concurrent sandboxed runs under one :class:`Sandbox` (isolation chosen once, at
    construction; see :attr:`isolation`). Use as a context manager or call :meth:`close`. Thread-safe."""

    def __init__(self, config: SandboxConfig | None = None, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox or Sandbox(config)
        self.config = self.sandbox.config
        self._ex = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="code-sandbox")
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)
        self._seconds = 0.0

    @property
    def isolation(self) -> str:
        """The isolation every run of this pool uses: ``"bwrap"``, ``"rlimits"`` or ``"none"``."""
        return self.sandbox.isolation

    def _run(self, job: CodeJob) -> CodeResult:
        t0 = time.monotonic()
        try:
            r = self.sandbox.run(job.program, job.tests, job.entry_point)
        except BaseException as e:  # noqa: BLE001 -- Sandbox.run does not raise; if it ever does, still a result
            r = CodeResult(False, "sandbox_error", time.monotonic() - t0, f"{type(e).__name__}: {e}", self.isolation)
        with self._lock:
            self._counts[r.reason] = self._counts.get(r.reason, 0) + 1
            self._seconds += r.seconds
        return r

    def submit(self, program: str, tests: str, entry_point: str | None = None) -> Future[CodeResult]:
        """Queue one run; the future's result is always a :class:`CodeResult`."""
        return self._ex.submit(self._run, CodeJob(program, tests, entry_point))

    def map(self, jobs: Iterable[CodeJob]) -> list[CodeResult]:
        """Run every job (at most ``workers`` at once) and return one result per job, in order."""
        futures = [self._ex.submit(self._run, CodeJob(*j)) for j in jobs]
        rounds = math.ceil(len(futures) / self.config.workers) if futures else 0
        deadline = time.monotonic() + rounds * (self.config.timeout_s + 2.0) + _LOST_AFTER_S
        out = []
        for f in futures:
            try:
                out.append(f.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                out.append(CodeResult(False, "sandbox_error", 0.0, "no result from the sandbox worker in time",
                                      self.isolation))
        return out

    def stats(self) -> dict[str, float]:
        """Runs so far: one count per reason, ``runs`` and ``mean_seconds``."""
        with self._lock:
            runs = sum(self._counts.values())
            return {**self._counts, "runs": runs, "mean_seconds": self._seconds / runs if runs else 0.0}

    def close(self) -> None:
        """Wait for queued runs, then stop the workers."""
        self._ex.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
