"""The engine driver: the thread that runs the embedded engine's continuous-batching scheduler for a server.

:class:`EngineDriver` calls :meth:`JaxEngine.step <scalerl_jax.rollout.engine.scheduler.JaxEngine.step>` on a
background thread while the engine has work, collects a burst of concurrent requests into one batch, and
implements pause (in place, retract, abort) and continue. The SGLang-API server
(:mod:`scalerl_jax.rollout.server`) makes one at start-up and hands every ``/generate`` job to it; each job's
future resolves on the server's event loop when the engine finishes its rows.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scalerl_jax.rollout.engine.scheduler import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    requests: list[GenerationRequest]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    t_submit: float = field(default_factory=time.time)


class EngineDriver:
    """Runs the engine's continuous-batching scheduler on a background thread; implements pause and continue.

    Every HTTP job goes straight to :meth:`JaxEngine.submit`; the driver thread calls :meth:`JaxEngine.step`
    while the engine has work, so a job arriving while others run joins their batch at the next decode-chunk
    boundary (up to ``max_batch`` rows; beyond that its rows wait for free slots). When the engine is idle the
    first step waits until requests have stopped arriving for ``batch_wait_s`` (at most ``10 * batch_wait_s``),
    so that a burst of concurrent requests starts as one batch.

    Pause in place (and retract) parks the driver thread in the engine's ``chunk_hook`` (called between decode
    chunks), so running rows keep their KV cache and resume where they stopped; weights installed meanwhile are
    picked up at the next chunk; new jobs wait. Pause abort finishes every running and queued job at once with
    finish reason abort (running rows keep the tokens they already generated, as SGLang does).
    """

    def __init__(self, engine: JaxEngine, *, batch_wait_s: float = 0.02, chunk_delay_s: float = 0.0):
        self.engine = engine
        self.batch_wait_s = batch_wait_s
        self.chunk_delay_s = chunk_delay_s  # testing aid: slows generation down so that tests can act mid-batch
        self._cond = threading.Condition()
        self._paused = False
        self._aborting = False  # pause(abort) in progress: the chunk hook must not park
        self._halted = False  # the driver thread is parked in the chunk hook
        self._in_step = False  # the driver thread is inside engine.step()
        self._jobs: dict[int, _Job] = {}  # unfinished jobs (running or waiting for slots)
        self._last_submit = 0.0  # time.monotonic() of the newest job
        self._stop = False
        # engine_batches: jobs the engine finished (each HTTP job is one engine submission that joins the running
        # batch); aborted_requests: prompts answered with abort; the rest are the engine's scheduler counters
        self.stats = {"generate_requests": 0, "prompts": 0, "samples": 0, "engine_batches": 0, "completion_tokens": 0,
                      "aborted_requests": 0, "bad_requests": 0}
        self._sync_stats()
        self.events: deque[dict[str, Any]] = deque(maxlen=200)
        engine.chunk_hook = self._chunk_hook
        self._thread = threading.Thread(target=self._loop, name="engine-driver", daemon=True)
        self._thread.start()

    # -- called from the event loop --

    def submit(self, requests: list[GenerationRequest], loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Hand ``requests`` to the engine; the future resolves to ``n`` completions per request.

        Raises ``ValueError`` (and counts nothing as running) when the engine refuses them; the server answers that
        with HTTP 400."""
        fut = loop.create_future()
        job = _Job(requests, fut, loop)
        with self._cond:
            self.stats["generate_requests"] += 1
            self.stats["prompts"] += len(requests)
            self.stats["samples"] += sum(r.params.n for r in requests)
            self._jobs[id(job)] = job
            self._last_submit = time.monotonic()
        try:
            # the caller checked them against the engine's vocabulary and max_len
            self.engine.submit(requests, on_done=lambda sub: self._job_done(job, sub), checked=True)
        except ValueError:
            with self._cond:
                self._jobs.pop(id(job), None)
            raise
        with self._cond:
            self._cond.notify_all()
        return fut

    def event(self, name: str, **kw: Any) -> None:
        with self._cond:
            self.events.append({"t": time.time(), "event": name, "in_flight": len(self._jobs),
                                "halted": self._halted, **kw})

    def pause(self, mode: str, timeout_s: float = 60.0) -> int:
        """Pause; returns the number of requests (prompts) held (in place) or aborted."""
        with self._cond:
            self._paused = True
            n = sum(len(j.requests) for j in self._jobs.values())
            if mode == "abort":
                self._aborting = True
                self._cond.notify_all()
            else:
                deadline = time.monotonic() + timeout_s
                while self._in_step and not self._halted and time.monotonic() < deadline:
                    self._cond.wait(0.05)
        if mode == "abort":
            try:
                self.engine.abort()  # at once, or after the chunk in flight; the on_done callbacks answer the jobs
            finally:
                with self._cond:
                    self._aborting = False
        return n

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._paused = False
            self._cond.notify_all()

    # -- driver thread --

    def _sync_stats(self) -> None:
        """Copy the engine's scheduler counters into ``stats`` (caller holds ``_cond``)."""
        c = self.engine.counters()
        for k in ("decode_chunks", "admitted_rows", "admitted_mid_batch", "max_running_rows", "running_rows",
                  "waiting_rows", "batch_slots", "busy_periods"):
            self.stats[k] = c[k]

    def _job_done(self, job: _Job, sub: Any) -> None:
        """Engine callback (on the stepping or aborting thread): answer the job's HTTP call."""
        with self._cond:
            self._jobs.pop(id(job), None)
            if sub.error is None:
                comps = [c for cs in sub.results for c in cs]
                self.stats["completion_tokens"] += sum(len(c.token_ids) for c in comps)
                if any(c.finish_reason == "abort" for c in comps):
                    self.stats["aborted_requests"] += len(job.requests)
                else:
                    self.stats["engine_batches"] += 1
            self._sync_stats()
            self._cond.notify_all()
        try:
            if sub.error is not None:
                job.loop.call_soon_threadsafe(_set_exc, job.future, sub.error)
            else:
                job.loop.call_soon_threadsafe(_set_result, job.future, sub.results)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def _chunk_hook(self, chunk_index: int) -> None:
        if self.chunk_delay_s:
            time.sleep(self.chunk_delay_s)
        with self._cond:
            self._sync_stats()
            while self._paused and not self._aborting and not self._stop:
                self._halted = True
                self._cond.notify_all()
                self._cond.wait(0.1)
            self._halted = False

    def _collect_burst(self) -> None:
        """Idle engine: wait until no request has arrived for ``batch_wait_s`` (at most 10 x that), so that a burst
        of concurrent requests starts as one batch instead of trickling in one decode chunk at a time."""
        deadline = time.monotonic() + 10 * self.batch_wait_s
        while True:
            with self._cond:
                quiet_at = self._last_submit + self.batch_wait_s
            now = time.monotonic()
            if now >= quiet_at or now >= deadline:
                return
            time.sleep(min(quiet_at, deadline) - now)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self._paused or not self.engine.has_work()):
                    self._cond.wait(0.05)
                if self._stop:
                    return
                self._in_step = True
            if self.batch_wait_s and self.engine.running_rows == 0:
                self._collect_burst()
            try:
                self.engine.step()
            except Exception:  # the engine failed its submissions (they answer HTTP 500): keep serving
                log.exception("engine step failed")
            finally:
                with self._cond:
                    self._in_step = False
                    self._sync_stats()
                    self._cond.notify_all()


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future, e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(e)
