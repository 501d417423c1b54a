"""The live forecast beside a training run: a low-priority background process refits the law after each eval.

The trainer holds a :class:`LiveForecast`. After each eval it calls :meth:`LiveForecast.after_eval`, which asks the
refit process (``python -m scalerl_jax.scaling.live``, one per run, started with the run) for a forecast without
waiting for it; each step it calls :meth:`LiveForecast.poll` for the rows that have come back and writes them to
metrics.jsonl. Why a process and not a thread: the refit is JAX (NumPyro's NUTS), and in the trainer's process it
would share the trainer's JAX runtime (its devices: on a GPU machine it would allocate accelerator memory), its
XLA thread pool and the GIL. The process runs JAX on the CPU only, on one thread, at a lower scheduling priority
(``forecast.nice``), so training keeps the machine; it compiles its sampler as it starts (on a synthetic curve of
the same shape, while the first evals are made), keeps it across refits and caches the compiled code on disk for
the next run (``JAX_COMPILATION_CACHE_DIR``, default ``~/.cache/scalerl_jax/xla``); each refit starts from the
previous one's medians and, where that refit was healthy, from its adapted step sizes and mass matrices with a
short warm-up (``forecast.warm_warmup``). Its log is ``RUN_DIR/forecast.log``. (At the lowest priority, 19, on a
machine already busy with the trainer and its generators, the process got so little CPU that its import and
compilation outlasted a whole smoke run: hence a middle value.)

Protocol: one JSON object per line. The trainer sends ``{"total_steps": N}``; the process answers
``{"row": {...} | null, "seconds": s, "cpu_seconds": c}`` (row null while there are fewer evals than ``min_evals``;
the refit's wall time and the process's own CPU time) or ``{"error": "..."}``. It exits when its stdin closes.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["LiveForecast", "main"]

# the refit process runs JAX on one CPU thread: the trainer's cores stay the trainer's
WORKER_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
FINAL_WAIT_S = 180.0  # how long the end of a run waits for the forecast of its last eval


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES",
                                                                     "JAX_PROCESS_ID"))}
    env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", XLA_FLAGS=WORKER_XLA_FLAGS, PYTHONUNBUFFERED="1")
    if not env.get("JAX_COMPILATION_CACHE_DIR"):
        from scalerl_jax.compile_cache import cache_dir

        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir())
    return env


class LiveForecast:
    """The trainer's side of the live forecast (see the module docstring).

    Args:
        run_dir: the run directory (metrics.jsonl is read by the refit process as it grows).
        cfg: a :class:`scalerl_jax.config.ForecastConfig`.
        total_steps: the run's planned steps (the forecast predicts the reward at their extrapolated compute).
        seed: the NUTS seed of the refits.
        log: where one-line notices go.
    """

    def __init__(self, run_dir, cfg, *, total_steps: int, seed: int = 0, log: Callable[[str], None] = print) -> None:
        self.run_dir, self.cfg, self.total_steps, self.log = Path(run_dir), cfg, int(total_steps), log
        self.t0 = time.monotonic()
        self.fit_seconds = 0.0  # wall time the refit process spent on the refits so far (not its start-up)
        self.fit_cpu_seconds = 0.0  # CPU time the refit process's own threads spent on them (what the budget counts)
        self._started = False  # the first reply came back (the process had imported JAX and compiled)
        self.busy_since: float | None = None
        self.pending = False  # an eval arrived while a refit ran (or was skipped for the budget)
        self.skipped = 0  # evals whose refit was skipped for the time budget
        self.dead: str | None = None
        self.rows: list[dict] = []  # every forecast row returned so far
        self._evals: int | None = None  # eval rows in metrics.jsonl (counted at the first after_eval)
        self._replies: queue.Queue = queue.Queue()
        args = [sys.executable, "-m", "scalerl_jax.scaling.live", str(self.run_dir),
                "--compute-key", cfg.compute_key, "--min-evals", str(cfg.min_evals),
                "--num-samples", str(cfg.num_samples), "--num-chains", str(cfg.num_chains),
                "--num-warmup", str(cfg.num_warmup), "--warm-warmup", str(cfg.warm_warmup), "--seed", str(seed),
                "--nice", str(cfg.nice)]
        if cfg.baseline:
            args += ["--baseline", str(cfg.baseline)]
        self.log_path = self.run_dir / "forecast.log"
        self._log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log_file,
                                     env=worker_env())
        self._reader = threading.Thread(target=self._read, name="forecast-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self._replies.put(json.loads(line))
            except json.JSONDecodeError:
                continue
        self._replies.put(None)  # end of stream: the process exited

    @property
    def busy(self) -> bool:
        return self.busy_since is not None

    def share(self) -> float:
        """The CPU time the refits took so far over the run's wall time. CPU, not wall: the refit process runs at a
        lower priority, so on a loaded machine a refit waits longer for its core but takes no more from training;
        counting its wall time would starve the forecast exactly when the machine is busy."""
        return self.fit_cpu_seconds / max(time.monotonic() - self.t0, 1e-9)

    def _within_budget(self) -> bool:
        """Whether a refit may be asked for now: always under ``--stop-if-worse`` (the stop rule acts only on
        forecasts, and a busy machine that slows the refits must not also starve the rule of them: a run that
        should stop would then train to its end), otherwise while the refits so far took at most
        ``cfg.max_share`` of the run's wall time in CPU time. Either way one refit at a time, never waited for."""
        return self.cfg.stop_if_worse is not None or self.share() <= self.cfg.max_share

    def _send(self) -> None:
        try:
            self.proc.stdin.write((json.dumps({"total_steps": self.total_steps}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:
            self._died(f"could not reach it ({e})")
            return
        self.busy_since, self.pending = time.monotonic(), False

    def _died(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
            self.log(f"[forecast] the refit process stopped: {why}; the run goes on without the live forecast "
                     f"(see {self.log_path})")
        self.busy_since = None

    def after_eval(self, force: bool = False) -> None:
        """An eval row was written: ask for a refit, unless one is running (then it is asked for when that one
        returns) or the refits so far took more CPU time than ``cfg.max_share`` of the run's wall time without a stop
        rule (:meth:`_within_budget`; ``force``: ask anyway, for the last eval)."""
        if self.dead is not None:
            return
        if self._evals is None:  # the first call: count the evals on file (a resumed run has earlier ones)
            from scalerl_jax.metrics import read_metrics

            try:
                self._evals = len(read_metrics(self.run_dir, "eval"))
            except (OSError, ValueError):
                self._evals = 1
        else:
            self._evals += 1
        if self._evals < self.cfg.min_evals:
            return  # nothing to fit yet: a short run never waits for the refit process's start-up
        if self.busy:
            self.pending = True
        elif force or self._within_budget():
            self._send()
        else:
            self.pending = True
            self.skipped += 1

    def poll(self, wait_s: float = 0.0) -> list[dict]:
        """The forecast rows that came back since the last call (waiting up to ``wait_s`` for one in flight)."""
        out = []
        deadline = time.monotonic() + wait_s
        while True:
            timeout = max(deadline - time.monotonic(), 0.0)
            try:
                reply = self._replies.get(timeout=timeout) if (self.busy and timeout > 0) else \
                    self._replies.get_nowait()
            except queue.Empty:
                break
            if reply is None:
                self._died(f"it exited with status {self.proc.wait()}")
                break
            if self.busy and self._started:  # the first request waited for the start-up: not a refit's cost
                self.fit_seconds += time.monotonic() - self.busy_since
            self.fit_cpu_seconds += float(reply.get("cpu_seconds", 0.0))  # measured by the refit itself
            self._started = True
            self.busy_since = None
            if "error" in reply:
                self.log(f"[forecast] refit failed: {reply['error']}")
            elif reply.get("row") is not None:
                row = {**reply["row"], "worker_pid": self.proc.pid, "forecast_share": self.share()}
                self.rows.append(row)
                out.append(row)
            if self.pending and self._within_budget():
                self._send()
            if not self.busy:
                break
        return out

    def finish(self) -> list[dict]:
        """At the run's end: make sure the last eval is refitted (waiting up to FINAL_WAIT_S), then stop the
        process. Returns the rows that came back meanwhile."""
        out = []
        if self.dead is None:
            if self.busy:
                out += self.poll(wait_s=FINAL_WAIT_S)
            if self.pending and not self.busy and self.dead is None:
                self._send()
            if self.busy:
                out += self.poll(wait_s=FINAL_WAIT_S)
        self.close()
        return out

    def close(self) -> None:
        """Stop the refit process (it exits when its stdin closes; killed after 10 s). Safe to call again."""
        if self._log_file.closed:
            return
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except OSError:
            pass
        if not self._started and not self.busy and self.proc.poll() is None:
            self.proc.kill()  # asked for nothing: its start-up (JAX import, compiling) has no use, don't wait for it
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


def _lower_priority(nice: int) -> None:
    try:
        os.nice(nice)  # the trainer's processes come first
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """The refit process: answer each request line on stdin with one forecast line on stdout."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m scalerl_jax.scaling.live",
                                 description="The live forecast's refit process (started by a training run; reads "
                                 "requests on stdin, see scalerl_jax/scaling/live.py).")
    ap.add_argument("run_dir")
    ap.add_argument("--compute-key", default="device_hours", choices=("device_hours", "flops"))
    ap.add_argument("--min-evals", type=int, default=5)
    ap.add_argument("--num-samples", type=int, default=300)
    ap.add_argument("--num-chains", type=int, default=4)
    ap.add_argument("--num-warmup", type=int, default=200)
    ap.add_argument("--warm-warmup", type=int, default=15, help="warm-up steps of a refit that reuses the previous "
                    "one's adaptation (0: always the full --num-warmup)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--nice", type=int, default=10)
    a = ap.parse_args(argv)
    _lower_priority(a.nice)
    t0 = time.perf_counter()
    from scalerl_jax.scaling.forecast import Forecaster

    fc = Forecaster(a.run_dir, compute_key=a.compute_key, min_evals=a.min_evals, baseline=a.baseline,
                    num_samples=a.num_samples, num_chains=a.num_chains, num_warmup=a.num_warmup, seed=a.seed,
                    warm_warmup=a.warm_warmup)
    fc.warm_up()
    print(f"[forecast] refit process {os.getpid()} ready for {a.run_dir} (started and compiled in "
          f"{time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)
    for line in sys.stdin:
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            req = json.loads(line)
            row = fc.refit(total_steps=req.get("total_steps"))
            reply = {"row": row, "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0}
        except Exception as e:  # noqa: BLE001 -- one failed refit is reported, the next eval tries again
            reply = {"error": f"{type(e).__name__}: {e}"}
        if reply.get("row") is not None:
            r = reply["row"]
            print(f"[forecast] step {r['step']}: A {r['A_mean']:.3f} [{r['A_lo']:.3f}, {r['A_hi']:.3f}] in "
                  f"{reply['seconds']:.1f}s ({reply['cpu_seconds']:.1f}s CPU)", file=sys.stderr, flush=True)
        sys.stdout.write(json.dumps(reply, default=float) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
