"""A local generator fleet: N ``python -m scalerl_jax.serve`` processes behind a real ``sglang-router``.

:class:`LocalFleet` is what ``--generators N`` starts: the experiment launches the servers itself on free
loopback ports, waits for them, puts ``sglang-router`` in front, and always stops them again::

    with LocalFleet("runs/x/hf/step_0", 2, log_dir="runs/x/fleet") as fleet:
        gen = SGLangGenerator(fleet.url)
        ...
        fleet.set_current_weights("runs/x/hf/step_100", 100)  # after each weight push

Lifetime. Every child (each server, and the router's guard) runs in its own session and process group, so a
Ctrl-C typed at the terminal reaches only the experiment, which then stops the fleet in order. :meth:`stop`
sends SIGTERM to each whole group, SIGKILL after a grace period, and reaps. It runs on normal exit, on an
exception (context manager), on SIGINT and SIGTERM (handlers installed on first start from the main thread
stop every live fleet and then chain to the previous handler, or die of the signal as the default would),
and at interpreter exit (atexit). A parent that is SIGKILLed runs none of these, so the children watch their
parent themselves: servers get ``--parent-pid`` (a watchdog thread in :mod:`scalerl_jax.serve`), and the
router, a separate binary, runs under a small guard process (``python -m scalerl_jax.rollout.fleet.guard --guard
PPID -- CMD``) that kills it once the experiment is gone. Both poll ``os.getppid()`` every 0.5 s instead
of using ``prctl(PR_SET_PDEATHSIG)``: that signal fires when the *thread* that forked the child exits, which
would kill servers started from a short-lived thread. The process plumbing (spawning, process groups, the
signal and atexit hooks) is in :mod:`scalerl_jax.rollout.fleet.processes`, the guard in
:mod:`scalerl_jax.rollout.fleet.guard`.

Faults. With ``restart_dead=True`` a monitor thread notices a server process that died and restarts it on
the same port with the newest weights given to :meth:`set_current_weights`; if newer weights arrive while it
starts, they are pushed to it once it is healthy. The router drops a dead worker through its 1 s health
checks and its circuit breaker (its retries resend the requests that failed), and re-admits the restarted
one within seconds (the breaker is set to probe again after 2 s instead of its default 60 s). A dead router
(or its guard) is restarted likewise, after its whole process group is killed.

Compilation and threads. All servers share one JAX persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``,
every compile cached), so a restarted server, later servers and later runs load executables instead of
compiling them; servers that start together still compile their first shapes concurrently (the engine
compiles lazily, on the first requests). ``JAX_PLATFORMS=cpu`` is set for the servers only when the
experiment itself has no accelerator; on an accelerator they do not preallocate device memory
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``) and ``env=`` can give each its own devices. On CPU, when the cores
are not more than the N servers plus the trainer, each server runs XLA single-threaded
(``--xla_cpu_multi_thread_eigen=false``): otherwise each of the N + 1 processes starts a thread pool as wide
as the machine and they preempt one another mid-op, while with one thread each the OS spreads the processes
over the cores (the small models run on CPU gain little from intra-op threads anyway).

``device_count()`` sums what the servers report in ``/get_server_info``, by the client's rule
(:func:`~scalerl_jax.rollout.wire_schema.devices_from_server_info`); a server that reports nothing usable counts as
one device.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx

from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.fleet.processes import (
    PACKAGE_PARENT,
    WATCH_INTERVAL_S,
    Child,
    free_port,
    guarded,
    install_hooks,
    killpg,
    log_tail,
    parent_has_accelerator,
    popen_logged,
    signals_deferred,
    track,
    untrack,
)

ROUTER_POLICIES = ("round_robin", "cache_aware", "random", "power_of_two")


class FleetError(RuntimeError):
    """A fleet process failed to start or to become healthy."""


class LocalFleet:
    """N local SGLang-API servers over one HF checkpoint, optionally behind ``sglang-router``.

    Args:
      model_dir: HF checkpoint directory every server loads (``--model``).
      n_servers: number of servers (>= 1).
      log_dir: where each server's log (``server{i}.log``), the router's log and, by default, the shared
        XLA compilation cache go.
      max_batch, max_len, decode_chunk: the servers' engine settings (``--max-batch`` ...).
      seed: server ``i`` samples with ``--seed seed + i``.
      router: put ``sglang-router`` in front (needed for a single URL over N > 1 servers).
      router_policy: the router's ``--policy`` (``round_robin`` or ``cache_aware``, ...).
      host: the loopback address everything binds to.
      weight_version: version tag of ``model_dir``'s weights.
      startup_timeout_s: how long each server (and then the router) may take to become healthy.
      restart_dead: restart servers (and the router) that die, with the newest weights.
      extra_server_args: more ``python -m scalerl_jax.serve`` arguments.
      extra_router_args: more ``sglang_router.launch_router`` arguments.
      env: extra environment for the servers, a mapping or a function of the server index (e.g. to give
        each its own ``CUDA_VISIBLE_DEVICES``).
      compile_cache_dir: the shared JAX compilation cache; default ``$JAX_COMPILATION_CACHE_DIR`` if set,
        else ``log_dir/xla_cache``.
      single_threaded_cpu: run each CPU server's XLA single-threaded; ``None`` decides (see the module
        docstring): yes on CPU when the cores are not more than ``n_servers + 1``.
      stop_grace_s: seconds between SIGTERM and SIGKILL in :meth:`stop`.
      log: where progress lines go.
    """

    def __init__(self, model_dir: str | os.PathLike, n_servers: int, *, log_dir: str | os.PathLike,
                 max_batch: int = 64, max_len: int | None = None, decode_chunk: int = 8, seed: int = 0,
                 router: bool = True, router_policy: str = "round_robin", host: str = "127.0.0.1",
                 weight_version: int = 0, startup_timeout_s: float = 180.0, restart_dead: bool = True,
                 extra_server_args: Sequence[str] = (), extra_router_args: Sequence[str] = (),
                 env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
                 compile_cache_dir: str | os.PathLike | None = None, single_threaded_cpu: bool | None = None,
                 stop_grace_s: float = 5.0, log: Callable[[str], Any] = print):
        if n_servers < 1:
            raise ValueError(f"LocalFleet: n_servers must be >= 1, got {n_servers} (0 means: no fleet, use the "
                             "embedded engine)")
        if router_policy not in ROUTER_POLICIES:
            raise ValueError(f"LocalFleet: router_policy must be one of {ROUTER_POLICIES}, got {router_policy!r}")
        self.model_dir = str(Path(model_dir).resolve())
        self.n_servers = int(n_servers)
        self.log_dir = Path(log_dir)
        self.max_batch, self.max_len, self.decode_chunk, self.seed = max_batch, max_len, decode_chunk, seed
        self.use_router, self.router_policy, self.host = router, router_policy, host
        self.startup_timeout_s, self.restart_dead, self.stop_grace_s = startup_timeout_s, restart_dead, stop_grace_s
        self.extra_server_args, self.extra_router_args = tuple(extra_server_args), tuple(extra_router_args)
        self._env = env
        self.compile_cache_dir = str(Path(compile_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
                                          or self.log_dir / "xla_cache").resolve())
        self.single_threaded_cpu = single_threaded_cpu
        self.log = log
        self._current = (self.model_dir, int(weight_version))
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._stop_done = threading.Event()
        self._started = self._stopped = False
        self._monitor: threading.Thread | None = None
        self._servers: list[Child] = []
        self._router: Child | None = None
        self.restarts = 0  # server restarts done by the monitor
        self.router_restarts = 0

    # ---- public API ----

    @property
    def url(self) -> str:
        """The URL to send generation to: the router's, or the only server's when there is no router."""
        if self._router is not None:
            return self._router.url
        if len(self._servers) == 1:
            return self._servers[0].url
        raise RuntimeError("LocalFleet.url: no router in front of several servers (or not started): use "
                           "worker_urls")

    @property
    def worker_urls(self) -> list[str]:
        """The servers' URLs (control calls such as weight updates go to each)."""
        return [s.url for s in self._servers]

    @property
    def log_files(self) -> dict[str, Path]:
        """Log file per process: ``"server 0"``, ..., and ``"router"``."""
        out = {s.name: s.log_path for s in self._servers}
        if self._router is not None:
            out[self._router.name] = self._router.log_path
        return out

    @property
    def pids(self) -> dict[str, int]:
        """Pid (also the process-group id) of each live child; the router's is its guard's."""
        with self._lock:
            kids = [*self._servers, *([self._router] if self._router else [])]
            return {c.name: c.proc.pid for c in kids if c.proc is not None and c.proc.poll() is None}

    @property
    def current_weights(self) -> tuple[str, int]:
        """(checkpoint directory, version) a restarted server loads."""
        with self._lock:
            return self._current

    def set_current_weights(self, path: str | os.PathLike, version: int) -> None:
        """Record the newest exported HF checkpoint directory and its version (call after each weight push)."""
        with self._lock:
            self._current = (str(Path(path).resolve()), int(version))

    def device_count(self) -> int:
        """Generator devices the fleet uses: the sum of what each server reports, 1 for a server that does not.

        Reads ``/get_server_info`` by the client's rule (:func:`.wire_schema.devices_from_server_info`: our
        ``device_count``, else SGLang's ``tp_size * pp_size * dp_size``); a server that reports neither, or cannot
        be asked, counts as one device.
        """
        total = 0
        with httpx.Client(trust_env=False, timeout=5.0) as http:
            for url in self.worker_urls:
                n = None
                try:
                    r = http.get(url + ws.SERVER_INFO)
                    if r.status_code == 200:
                        n = ws.devices_from_server_info(r.json())
                except (httpx.HTTPError, ValueError):
                    pass
                total += n or 1
        return total

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start the servers and the router and wait until all are healthy; on any failure stop and raise."""
        with self._lock:
            if self._stopped:
                raise FleetError("LocalFleet: a stopped fleet cannot be started again")
            if self._started:
                return self
            self._started = True
        track(self)
        install_hooks()
        t0 = time.monotonic()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            Path(self.compile_cache_dir).mkdir(parents=True, exist_ok=True)
            self._server_env_base = self._make_server_env()
            ports = self._free_ports(self.n_servers + 2 * int(self.use_router))
            self._metrics_port = ports[-1] if self.use_router else 0
            self._servers = [Child(f"server {i}", ports[i], self.log_dir / f"server{i}.log", self.host,
                                   version=self._current[1]) for i in range(self.n_servers)]
            self._say(f"[fleet] starting {self.n_servers} server{'s' * (self.n_servers > 1)} on ports "
                      f"{', '.join(str(p) for p in ports[:self.n_servers])} ({self.model_dir}; logs in {self.log_dir})")
            for s in self._servers:
                self._spawn_server(s)
            self._wait_servers_up()
            if self.use_router:
                self._router = Child("router", ports[self.n_servers], self.log_dir / "router.log", self.host)
                self._spawn_router(self._router)
                self._wait_router_up(self._router)
        except BaseException:
            self.stop()
            raise
        if self.restart_dead:
            self._monitor = threading.Thread(target=self._monitor_loop, name="fleet-monitor", daemon=True)
            self._monitor.start()
        where = self.url if self.use_router or self.n_servers == 1 else ", ".join(self.worker_urls)
        self._say(f"[fleet] ready in {time.monotonic() - t0:.0f} s: {where}")
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Stop every child's process group (SIGTERM, SIGKILL after ``grace_s``) and reap them; idempotent."""
        grace = self.stop_grace_s if grace_s is None else grace_s
        with signals_deferred():
            with self._lock:
                first = not self._stopped
                self._stopped = True
                self._stopping.set()
            if not first:  # another thread is stopping it: return once it is done, as the first call does
                self._stop_done.wait(timeout=grace + 60.0)
                return
            if self._monitor is not None and self._monitor is not threading.current_thread():
                self._monitor.join(timeout=10.0)  # it spawns only under the lock after checking _stopping
            with self._lock:
                kids = [c for c in [*self._servers, *([self._router] if self._router else [])] if c.proc]
                procs = [c.proc for c in kids]
                for p in procs:
                    killpg(p, signal.SIGTERM)
                deadline = time.monotonic() + grace
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=max(0.0, deadline - time.monotonic()))
                for p in procs:
                    killpg(p, signal.SIGKILL)  # also strays left in a group whose leader already exited
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=10.0)
                for c in kids:
                    c.state = "stopped"
            untrack(self)
            self._stop_done.set()
            if self._started and kids:
                self._say(f"[fleet] stopped {len(kids)} process{'es' * (len(kids) > 1)}")

    # ---- processes ----

    def _say(self, msg: str) -> None:
        # stop() may run inside a signal handler that interrupted a print: never let logging break a stop
        with contextlib.suppress(Exception):
            self.log(msg)

    def _free_ports(self, k: int) -> list[int]:
        ports: list[int] = []
        while len(ports) < k:
            p = free_port(self.host)
            if p not in ports:
                ports.append(p)
        return ports

    def _make_server_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT), *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONUNBUFFERED"] = "1"  # so that a crash's last lines are in the log we quote
        env["JAX_COMPILATION_CACHE_DIR"] = self.compile_cache_dir
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        platforms = env.get("JAX_PLATFORMS", "").strip().lower()
        if not platforms and not parent_has_accelerator():
            env["JAX_PLATFORMS"] = platforms = "cpu"
        on_cpu = platforms == "cpu"
        if not on_cpu:
            # N servers and the trainer share the accelerators unless env= splits them: each grabbing 75% of
            # a device's memory up front would fail the second one
            env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        single = self.single_threaded_cpu
        if single is None:
            single = on_cpu and (os.cpu_count() or 1) <= self.n_servers + 1
        if single and on_cpu and "xla_cpu_multi_thread_eigen" not in env.get("XLA_FLAGS", ""):
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
        return env

    def _server_env(self, i: int) -> dict[str, str]:
        env = dict(self._server_env_base)
        extra = self._env(i) if callable(self._env) else self._env
        env.update(extra or {})
        return env

    def _server_cmd(self, i: int, port: int, model: str, version: int) -> list[str]:
        cmd = [sys.executable, "-m", "scalerl_jax.serve", "--model", model, "--weight-version", str(version),
               "--host", self.host, "--port", str(port), "--max-batch", str(self.max_batch),
               "--decode-chunk", str(self.decode_chunk), "--seed", str(self.seed + i),
               "--parent-pid", str(os.getpid())]
        if self.max_len is not None:
            cmd += ["--max-len", str(self.max_len)]
        return cmd + list(self.extra_server_args)

    def _spawn_server(self, s: Child) -> None:
        i = self._servers.index(s)
        model, version = self._current
        with self._lock:
            if self._stopping.is_set():
                return
            s.proc = popen_logged(self._server_cmd(i, s.port, model, version), s.log_path, self._server_env(i),
                                  f"{s.name} (weights v{version})")
            s.version, s.state, s.started_at = version, "starting", time.monotonic()

    def _router_cmd(self, port: int) -> list[str]:
        router = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *self.worker_urls,
                  "--policy", self.router_policy, "--host", self.host, "--port", str(port),
                  # a dead worker is dropped within ~2 s, a restarted one re-admitted at its first good check;
                  # two failures (not one) so that a check slowed by a busy CPU does not drop a live worker
                  "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
                  "--health-success-threshold", "1", "--health-check-timeout-secs", "5",
                  "--retry-max-retries", "5", "--retry-initial-backoff-ms", "50", "--retry-max-backoff-ms", "2000",
                  # a worker's circuit opens after failed sends (a kill mid-batch fails all its requests at once)
                  # and by default stays open 60 s, long after the worker is back and reported healthy: probe
                  # it again after 2 s and close on the first success
                  "--cb-failure-threshold", "5", "--cb-success-threshold", "1", "--cb-timeout-duration-secs", "2",
                  "--cb-window-duration-secs", "10",
                  "--request-timeout-secs", "3600", "--log-level", "warn",
                  # its metrics exporter binds a fixed default port: a second router on the machine would die
                  "--prometheus-host", self.host, "--prometheus-port", str(self._metrics_port),
                  *self.extra_router_args]
        return guarded(router)

    def _spawn_router(self, r: Child) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT), *filter(None, [env.get("PYTHONPATH")])])
        # the router's HTTP client honours proxy variables; its workers are local
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY") or env.get("no_proxy"), self.host, "localhost",
                                          "127.0.0.1"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        with self._lock:
            if self._stopping.is_set():
                return
            r.proc = popen_logged(self._router_cmd(r.port), r.log_path, env, "router")
            r.state, r.started_at = "starting", time.monotonic()

    # ---- health ----

    def _startup_error(self, c: Child, what: str) -> FleetError:
        return FleetError(f"LocalFleet: {c.name} ({c.url}) {what}; last lines of {c.log_path}:\n"
                          f"{log_tail(c.log_path).rstrip()}")

    def _wait_servers_up(self) -> None:
        pending = list(self._servers)
        port_retries = 3
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while pending:
                for s in list(pending):
                    rc = s.proc.poll() if s.proc else None
                    if rc is not None:
                        tail = log_tail(s.log_path, 1000).lower()
                        if "address already in use" in tail and port_retries > 0:  # lost a race for the port
                            port_retries -= 1
                            s.port = self._free_ports(1)[0]
                            self._spawn_server(s)
                            continue
                        raise self._startup_error(s, f"exited with code {rc} during start-up")
                    if _ok(http, s.url + ws.HEALTH):
                        s.state = "up"
                        pending.remove(s)
                        self._say(f"[fleet] {s.name} up on port {s.port} after "
                                  f"{time.monotonic() - s.started_at:.0f} s")
                    elif time.monotonic() - s.started_at > self.startup_timeout_s:
                        raise self._startup_error(s, f"not healthy after {self.startup_timeout_s:.0f} s")
                if pending:
                    time.sleep(0.2)

    def _wait_router_up(self, r: Child) -> None:
        want = {u.rstrip("/") for u in self.worker_urls}
        healthy: set[str] = set()
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while True:
                rc = r.proc.poll() if r.proc else None
                if rc is not None:
                    raise self._startup_error(r, f"exited with code {rc} during start-up")
                if _ok(http, r.url + ws.HEALTH):
                    healthy = self._router_healthy_workers(http)
                    if want <= healthy:
                        break
                if time.monotonic() - r.started_at > self.startup_timeout_s:
                    raise self._startup_error(r, f"not ready after {self.startup_timeout_s:.0f} s (healthy "
                                                 f"workers: {sorted(healthy)} of {sorted(want)})")
                time.sleep(0.2)
        r.state = "up"
        self._say(f"[fleet] router up on {r.url} over {len(want)} worker{'s' * (len(want) > 1)} after "
                  f"{time.monotonic() - r.started_at:.0f} s")

    def router_workers(self) -> list[dict[str, Any]]:
        """The router's ``GET /workers`` list (``[]`` without a router or when it does not answer)."""
        if self._router is None:
            return []
        try:
            with httpx.Client(trust_env=False, timeout=5.0) as http:
                body = http.get(self._router.url + ws.ROUTER_WORKERS[0]).json()
            return list(body.get("workers", [])) if isinstance(body, dict) else []
        except (httpx.HTTPError, ValueError):
            return []

    def _router_healthy_workers(self, http: httpx.Client) -> set[str]:
        try:
            body = http.get(self._router.url + ws.ROUTER_WORKERS[0]).json()
        except (httpx.HTTPError, ValueError):
            return set()
        workers = body.get("workers", []) if isinstance(body, dict) else []
        return {str(w.get("url", "")).rstrip("/") for w in workers if isinstance(w, dict) and w.get("is_healthy")}

    # ---- the monitor (restarts) ----

    def _monitor_loop(self) -> None:
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while not self._stopping.wait(WATCH_INTERVAL_S):
                for c in [*self._servers, *([self._router] if self._router else [])]:
                    if self._stopping.is_set():
                        return
                    try:
                        self._check(c, http)
                    except Exception as e:  # noqa: BLE001 - the monitor must outlive one bad check
                        self._say(f"[fleet] monitor: {c.name}: {type(e).__name__}: {e}")

    def _respawn(self, c: Child) -> None:
        if c is self._router:
            self._spawn_router(c)
        else:
            self._spawn_server(c)

    def _check(self, c: Child, http: httpx.Client) -> None:
        now = time.monotonic()
        with self._lock:
            if self._stopping.is_set() or c.proc is None:
                return
            rc = c.proc.poll()
        is_router = c is self._router
        if c.state == "up" and rc is not None:
            what = "" if is_router else f" with weights v{self._current[1]}"
            self._say(f"[fleet] {c.name} (port {c.port}) died (exit {rc}); restarting{what}")
            with self._lock:
                killpg(c.proc, signal.SIGKILL)  # strays of its group: the router, if only its guard died
            if is_router:
                self.router_restarts += 1
            else:
                self.restarts += 1
            self._respawn(c)
        elif c.state == "starting" and (rc is not None or now - c.started_at > self.startup_timeout_s):
            if rc is None:
                with self._lock:
                    killpg(c.proc, signal.SIGKILL)
                c.proc.wait(timeout=10.0)
            c.failures += 1
            delay = min(30.0, 2.0 ** c.failures)
            reason = f"exited with code {rc}" if rc is not None else f"not healthy after {self.startup_timeout_s:.0f} s"
            self._say(f"[fleet] {c.name} (port {c.port}) {reason} while restarting; retrying in {delay:.0f} s; "
                      f"last lines of {c.log_path}:\n{log_tail(c.log_path, 1500).rstrip()}")
            c.state, c.restart_at = "waiting", now + delay
        elif c.state == "waiting" and now >= c.restart_at:
            if is_router:
                self.router_restarts += 1
            else:
                self.restarts += 1
            self._respawn(c)
        elif c.state == "starting" and _ok(http, c.url + ws.HEALTH):
            c.state, c.failures = "up", 0
            if not is_router:
                self._catch_up_weights(c)
            self._say(f"[fleet] {c.name} (port {c.port}) is back after {now - c.started_at:.0f} s"
                      + ("" if is_router else f" with weights v{c.version}"))

    def _catch_up_weights(self, s: Child) -> None:
        """Weights newer than those it started with arrived while it was starting: push them to it."""
        path, version = self._current
        if version <= s.version:
            return
        try:
            r = httpx.post(s.url + ws.UPDATE_WEIGHTS, json={"model_path": path,
                           "weight_version": str(version)}, timeout=600.0, trust_env=False)
            if r.status_code == 200:
                s.version = version
            else:
                self._say(f"[fleet] {s.name}: pushing weights v{version} failed: {r.text[:300]}")
        except httpx.HTTPError as e:
            self._say(f"[fleet] {s.name}: pushing weights v{version} failed: {e}")


def _ok(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url).status_code == 200
    except httpx.HTTPError:
        return False
