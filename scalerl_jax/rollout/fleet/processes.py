"""Child-process plumbing of the local fleet (:mod:`scalerl_jax.rollout.fleet`): free ports, log tails,
accelerator detection, one child's bookkeeping, the signal and atexit hooks that stop every live fleet, and the
guard that kills a command once its parent is gone.

Every child is started by :func:`popen_logged` in its own session and process group (so a Ctrl-C typed at the
terminal reaches only the experiment) and is stopped through its whole group (:func:`killpg`). A fleet that is
:func:`track` ed is stopped on SIGINT and SIGTERM (:func:`install_hooks`, run from the main thread, installs
handlers that stop every live fleet and then chain to the previous handler, or die of the signal as the default
would) and at interpreter exit (atexit). A stop on the main thread runs under :func:`signals_deferred`: a signal
arriving meanwhile (a second Ctrl-C) is acted on after it, not half-way through it.

A parent that is SIGKILLed runs none of these hooks. A command that cannot watch its parent itself (the router, a
separate binary) therefore runs under the guard, ``python -m scalerl_jax.rollout.fleet.guard --guard PPID -- CMD``
(:mod:`scalerl_jax.rollout.fleet.guard`; :func:`guarded` builds that command line): it polls ``os.getppid()``
every ``WATCH_INTERVAL_S`` and kills the command once the experiment is gone. Polling, not
``prctl(PR_SET_PDEATHSIG)``: that signal fires when the *thread* that forked the child exits, which would kill
children started from a short-lived thread.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

PACKAGE_PARENT = Path(__file__).resolve().parents[3]  # makes ``-m scalerl_jax.serve`` importable from any cwd
WATCH_INTERVAL_S = 0.5
GUARD_MODULE = "scalerl_jax.rollout.fleet.guard"  # run by :func:`guarded`; nothing imports it


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, max_chars: int = 3000) -> str:
    """The last ``max_chars`` characters of a log file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_chars))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def parent_has_accelerator() -> bool:
    """Whether this process's JAX would use an accelerator, without initialising a backend for it.

    An already-initialised JAX is asked directly; otherwise an installed accelerator plugin (CUDA, ROCm,
    TPU) counts as one.
    """
    if "jax" in sys.modules:
        try:
            from jax._src import xla_bridge

            if xla_bridge.backends_are_initialized():
                import jax

                return jax.default_backend() != "cpu"
        except (ImportError, AttributeError, RuntimeError):
            pass
    with contextlib.suppress(Exception):  # broken package metadata must not stop the fleet
        if any(True for _ in importlib.metadata.entry_points(group="jax_plugins")):
            return True
    for mod in ("jax_plugins", "libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                "jax_rocm7_plugin"):
        try:
            if importlib.util.find_spec(mod) is not None:
                return True
        except (ImportError, ValueError):
            pass
    return False


@dataclass(eq=False)
class Child:
    """One fleet process (a server, or the router's guard) and its restart bookkeeping."""

    name: str  # "server 0", "router"
    port: int
    log_path: Path
    host: str
    proc: subprocess.Popen | None = None
    state: str = "new"  # new | starting | up | waiting (to be restarted) | stopped
    started_at: float = 0.0
    restart_at: float = 0.0
    failures: int = 0  # consecutive failed restarts (for the backoff)
    version: int = 0  # weight version it was started with or last given

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def popen_logged(cmd: list[str], log_path: Path, env: dict[str, str], header: str) -> subprocess.Popen:
    """Start ``cmd`` in its own session and process group, its stdout and stderr appended to ``log_path``."""
    with open(log_path, "a") as logf:  # appended: a restart keeps the log of the crash before it
        logf.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {header}\n$ {' '.join(cmd)}\n")
        logf.flush()
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                cwd=str(PACKAGE_PARENT), start_new_session=True, close_fds=True)


def killpg(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``proc``'s whole process group (it leads one: :func:`popen_logged`); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# ---- signal handlers and atexit, shared by every fleet of the process ------------------------------------


class _Stoppable(Protocol):  # a LocalFleet
    def stop(self) -> None: ...


_live: set[_Stoppable] = set()  # the live fleets
_live_lock = threading.RLock()
_prev_handlers: dict[int, Any] = {}
_atexit_registered = _handlers_installed = False
_main_stop_depth = 0  # stop() calls running on the main thread, where signal handlers run
_deferred_signals: list[int] = []


def track(fleet: _Stoppable) -> None:
    """Stop ``fleet`` on SIGINT, SIGTERM and at exit (once :func:`install_hooks` ran) until :func:`untrack`."""
    with _live_lock:
        _live.add(fleet)


def untrack(fleet: _Stoppable) -> None:
    with _live_lock:
        _live.discard(fleet)


def _stop_all() -> None:
    with _live_lock:
        fleets = list(_live)
    for f in fleets:
        f.stop()


def _chain(signum: int, frame: Any) -> None:
    prev = _prev_handlers.get(signum)
    if callable(prev):
        prev(signum, frame)  # e.g. Python's default SIGINT handler raises KeyboardInterrupt
        return
    # SIG_DFL (or a handler installed from C): die of the same signal, as the default action would
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _on_signal(signum: int, frame: Any) -> None:
    if _main_stop_depth:
        # interrupted a stop() on the main thread (a second Ctrl-C): let it finish killing, then act on this
        _deferred_signals.append(signum)
        return
    _stop_all()
    _chain(signum, frame)


def install_hooks() -> None:
    """Register the atexit hook, and (from the main thread) the SIGINT/SIGTERM handlers, once per process."""
    global _atexit_registered, _handlers_installed
    with _live_lock:
        if not _atexit_registered:
            atexit.register(_stop_all)
            _atexit_registered = True
        if _handlers_installed or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; atexit and the watchdogs remain
        _handlers_installed = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN:
                continue  # the process chose to survive this signal; so does its fleet
            _prev_handlers[sig] = prev
            signal.signal(sig, _on_signal)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Around a stop: a SIGINT/SIGTERM arriving meanwhile is acted on after it, not half-way through it.

    (Blocking the signals with ``pthread_sigmask`` would not do: another thread would take them.)
    """
    global _main_stop_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _main_stop_depth += 1
    try:
        yield
    finally:
        _main_stop_depth -= 1
    if not _main_stop_depth and _deferred_signals:
        signum = _deferred_signals[0]
        _deferred_signals.clear()
        _stop_all()
        _chain(signum, None)


# ---- the guard's command line (the guard itself: :mod:`scalerl_jax.rollout.fleet.guard`) -----------------


def guarded(cmd: Sequence[str]) -> list[str]:
    """``cmd`` run under the guard (:mod:`scalerl_jax.rollout.fleet.guard`): it is killed once this process is gone."""
    return [sys.executable, "-m", GUARD_MODULE, "--guard", str(os.getpid()), "--", *cmd]
