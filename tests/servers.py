"""What the rollout tests share: our SGLang-API server as a subprocess (start, wait, kill), random checkpoints,
free ports, JSON POSTs and polls, the fleet tests' prompts, a teacher-forced greedy reference, a minimal HTTP reply
for fake servers, and :class:`ReleaseProxy` (our server as a given SGLang release shows itself)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.models import forward, init_params, save_hf_checkpoint, tiny
from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.client.wire import parse_release
from scalerl_jax.rollout.fleet.processes import free_port
from tests.tolerances import model_logprob_tol

ROOT = Path(__file__).resolve().parents[1]
# the suite's shared compilation cache (tests/conftest.py sets it before this module is imported)
JAX_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
    tempfile.gettempdir(), "scalerl_jax_test_server_xla_cache")


# a hang guard for a server's start-up (JAX's import and its first compiles; ~10 s alone here), generous for a loaded
# machine 4x slower; not a speed limit
START_S = 600.0


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = START_S, path: str = "/health"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}:\n{tail(proc)}")
        try:
            if httpx.get(url + path, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url}{path} not healthy after {timeout_s}s:\n{tail(proc) if proc else ''}")


def tail(proc: subprocess.Popen) -> str:
    log = getattr(proc, "log_path", None)
    return Path(log).read_text()[-3000:] if log and Path(log).exists() else ""


def start_server(tmp: Path, *args: str, name: str = "server") -> tuple[subprocess.Popen, str]:
    """``python -m scalerl_jax.serve ARGS`` on a free loopback port (not yet waited for)."""
    port = free_port()
    log_path = tmp / f"{name}-{port}.log"
    # the servers compile the same shapes: share XLA executables between them through JAX's persistent cache
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "JAX_COMPILATION_CACHE_DIR": JAX_CACHE,
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    with open(log_path, "w") as log_f:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "scalerl_jax.serve", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=log_f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc, f"http://127.0.0.1:{port}"


def kill(proc: subprocess.Popen) -> None:
    """Kill the process group we started (server or router) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def kill_once_generating(url: str, kill_fn, start: int, delay_s: float = 0.05):
    """A thread target: wait (up to START_S) until the server at ``url`` has taken more than ``start`` /generate
    requests, then ``delay_s`` more (mid-generation), then ``kill_fn()``."""

    def run() -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/stats", timeout=5, trust_env=False).json()["generate_requests"] > start:
                    break
            except httpx.HTTPError:
                break
            time.sleep(0.01)
        time.sleep(delay_s)
        kill_fn()

    return run


def reply_json(handler, code: int, payload) -> None:
    """Answer a ``BaseHTTPRequestHandler`` request with ``payload`` (bytes, or an object sent as JSON)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def save_random_checkpoint(path: Path, seed: int) -> Path:
    save_hf_checkpoint(init_params(tiny(), jax.random.PRNGKey(seed)), tiny(), path)
    return path


forward_jit = jax.jit(forward, static_argnums=2)


def assert_greedy_against_model(params, cfg, prompt: list[int], out_ids: list[int], out_lps: list[float]) -> None:
    """Each output token is an argmax of the teacher-forced logits, with the matching log-prob.

    The sequence is right-padded to ``cfg.max_seq_len`` (causal: padding cannot change earlier positions) so
    that one compiled forward serves every call.
    """
    seq = prompt + out_ids
    toks = np.zeros((1, cfg.max_seq_len), np.int32)
    toks[0, : len(seq)] = seq
    logits = np.asarray(forward_jit(jax.tree.map(jnp.asarray, params), jnp.asarray(toks), cfg))[0]
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    # the server's decode and this forward pass are two float32 orderings of the model (tests/tolerances.py)
    tol = model_logprob_tol(cfg, cfg.max_seq_len, float(np.abs(logits).max()))
    for k, (t, lp) in enumerate(zip(out_ids, out_lps)):
        row = logp[len(prompt) - 1 + k]
        assert row[t] >= row.max() - tol, f"token {k}: {t} is not the argmax {row.argmax()}"
        assert abs(row[t] - lp) <= tol, f"token {k}: logprob {lp} vs model {row[t]}"


def checkpoint_pair(tmp_path_factory, name: str, seed_a: int, seed_b: int) -> tuple[Path, Path]:
    """Two random tiny checkpoints (``seed_a``, ``seed_b``) under a fresh directory ``name``: a module's ``ckpts``."""
    d = tmp_path_factory.mktemp(name)
    return save_random_checkpoint(d / "a", seed_a), save_random_checkpoint(d / "b", seed_b)


def prompts(k: int) -> list[list[int]]:
    """``k`` distinct 6-token prompts of the tiny vocabulary (one shape bucket)."""
    return [[2 + (i % 10), 12, 2 + (i // 10) % 10, 13, 2 + (i * 7) % 10, 14] for i in range(k)]


def post(url: str, route: str, body: Any, status: int = 200, timeout: float = 120.0) -> httpx.Response:
    """POST ``body`` as JSON to ``url + route`` and check the status."""
    r = httpx.post(url + route, json=body, timeout=timeout)
    assert r.status_code == status, (route, body, r.text)
    return r


def stats(url: str) -> dict:
    """Our server's ``/stats``."""
    return httpx.get(url + ws.STATS, timeout=5, trust_env=False).json()


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str | Callable[[], Any],
               every_s: float = 0.05) -> Any:
    """Poll ``cond()`` until it returns something true (returned); after ``timeout_s`` an AssertionError with
    ``what`` (a string, or a callable that says what was seen)."""
    deadline = time.monotonic() + timeout_s
    while not (out := cond()):
        assert time.monotonic() < deadline, f"not after {timeout_s} s: {what() if callable(what) else what}"
        time.sleep(every_s)
    return out





class ReleaseProxy:
    """Our real server as an SGLang ``release`` shows itself: ``version`` in ``/get_server_info``, no extensions;
    before 0.5.6 ``/pause_generation`` takes no mode (it aborts in-flight requests); ``output_ids`` absent before
    0.5 and prefixed with prompt tokens in 0.5.3 (the detokenizer's ``decode_ids``); ``weight_versions`` only from
    0.5.19; no ``weight_version`` before 0.5.3. Unknown top-level request fields are ignored, as SGLang does."""

    def __init__(self, upstream: str, release: str):
        self.upstream, self.release = upstream, release
        self.rel = parse_release(release)
        self.bodies: dict[str, list] = {}
        self.raw: list = []  # upstream /generate answers, before rewriting
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                r = httpx.get(proxy.upstream + self.path, timeout=60)
                self._send(r.status_code, proxy.rewrite_get(self.path, r))

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                with proxy.lock:
                    proxy.bodies.setdefault(self.path, []).append(body)
                body = proxy.rewrite_request(self.path, body)
                r = httpx.post(proxy.upstream + self.path, json=body, timeout=120)
                self._send(r.status_code, proxy.rewrite_post(self.path, body, r))

            def _send(self, code, payload):
                reply_json(self, code, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def rewrite_get(self, path, r):
        if r.status_code != 200 or not r.headers.get("content-type", "").startswith("application/json"):
            return r.content
        out = r.json()
        if isinstance(out, dict):
            out.pop(ws.EXTENSIONS_KEY, None)
            out.pop(ws.DEVICE_COUNT, None)
            if "server_info" in path:
                out["version"] = self.release
        return out

    def rewrite_request(self, path, body):
        if path == "/generate":
            body = {k: v for k, v in body.items() if k != ws.LENGTH_CONTROL}
        if path == "/pause_generation" and self.rel < (0, 5, 6):
            body = {}  # no mode: the default, abort
        return body

    def rewrite_post(self, path, body, r):
        if path != "/generate" or r.status_code != 200:
            return r.content
        out = r.json()
        with self.lock:
            self.raw.append(json.loads(json.dumps(out)))
        for o in out if isinstance(out, list) else [out]:
            meta = o["meta_info"]
            for k in ws.META_EXTENSIONS:
                meta.pop(k, None)
            if self.rel < (0, 5, 19):  # weight_versions: absent in 0.5.18, present in 0.5.19
                meta.pop("weight_versions", None)
            if self.rel < (0, 5, 3):
                meta.pop("weight_version", None)
            if self.rel < (0, 5, 0):
                o.pop("output_ids", None)
            elif self.rel < (0, 5, 5):
                o["output_ids"] = body["input_ids"][-3:] + o["output_ids"]
        return out

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
