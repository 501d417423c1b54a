"""The :class:`~scalerl_jax.rollout.protocol.Generator` protocol over an SGLang fleet, taking params like the
embedded engine does.

The trainer hands every back-end the same thing, a params pytree and its version; this adapter turns it into what
SGLang servers need. :meth:`RemoteGenerator.update_weights` writes the params as an HF checkpoint directory
(safetensors + config.json + the base model's tokenizer files) under ``export_dir/v<version>``, then has the
client push it to every server in flight (``pause_generation(in_place)`` -> ``update_weights_from_disk`` ->
``continue_generation``, see :mod:`scalerl_jax.rollout.client.sglang`). Only the newest ``keep`` exports are kept;
a local fleet (:class:`~scalerl_jax.rollout.fleet.LocalFleet`) is told the newest one before the push, so that a
server it restarts meanwhile comes back with current weights, and its worker list is where control calls go (so a
push does not depend on its router being up). Pushing the version this object pushed last is a no-op, so the train
and eval sides can share one fleet. A failed push is retried once. The client confirms every push worker by
worker (the version each reports must be the one pushed, see :mod:`scalerl_jax.rollout.client.weights`); a
worker it could not reach keeps its older version, which its tokens then carry, and is logged here. The first
push of a run (also after ``--resume``) logs the version every worker reports.

``metrics()`` reports what the trainer logs per step: the last push's seconds and bytes, pushes so far, and the
client's request counters (attempts, retries, failovers, re-sent requests, tokens per server).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalerl_jax.config import ModelConfig
from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.protocol import Completion, GenerationRequest


class RemoteGenerator:
    """Generator protocol over an :class:`~scalerl_jax.rollout.client.sglang.SGLangGenerator` (see the module
    docstring). ``dtype``: the exported checkpoint's tensor dtype ("float32" keeps the generator's log-probs equal
    to the trainer's on our CPU servers; "bfloat16" is what SGLang serves at scale)."""

    def __init__(self, client: Any, model_cfg: ModelConfig, *, export_dir: str | Path, tokenizer_dir: str | Path,
                 keep: int = 3, dtype: str = "float32", fleet: Any = None, devices: int | None = None,
                 log=print) -> None:
        if keep < 1:
            raise ValueError(f"RemoteGenerator: keep must be >= 1, got {keep}")
        self.client = client
        self.cfg = model_cfg
        self.export_dir = Path(export_dir)
        self.tokenizer_dir = Path(tokenizer_dir)
        self.keep, self.dtype, self.fleet = int(keep), dtype, fleet
        self._devices = devices
        self._lock = threading.Lock()  # one push at a time (the trainer's; eval shares the fleet)
        self._pushed: int | None = None
        self.log = log
        # exports left by an earlier process of this run (a resume) are pruned like this process's own
        self._exports: list[Path] = sorted(self.export_dir.glob("v[0-9]*")) if self.export_dir.is_dir() else []
        if fleet is not None and hasattr(client, "control_urls"):
            client.control_urls = lambda: fleet.worker_urls
        self._poll: dict[str, tuple[float, float]] = {}  # worker url -> (time, completion tokens) at the last poll
        self._rates: dict[str, float] = {}
        self._last_poll = 0.0
        self.sync = {"weight_sync_seconds": 0.0, "weight_sync_export_seconds": 0.0, "weight_sync_bytes": 0,
                     "weight_pushes": 0, "weight_sync_total_seconds": 0.0}

    # ---- Generator protocol ----

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.client.generate(requests)

    @property
    def weight_version(self) -> int:
        return self.client.weight_version

    def update_weights(self, weights: Any, version: int) -> None:
        """Export ``weights`` (a params pytree, or an HF directory already on disk) as version ``version`` and push
        it to every server; a no-op when the fleet already holds ``version``."""
        from scalerl_jax.data.tokenizer_build import copy_tokenizer_files
        from scalerl_jax.models.hf_io import save_hf_checkpoint

        version = int(version)
        with self._lock:
            if self._pushed == version:
                return
            t0 = time.perf_counter()
            if isinstance(weights, (str, Path)):
                path = Path(weights)
            else:
                path = self.export_dir / f"v{version:07d}"
                save_hf_checkpoint(weights, self.cfg, path, dtype=self.dtype)
                copy_tokenizer_files(self.tokenizer_dir, path)
                if path not in self._exports:
                    self._exports.append(path)
                # the in-flight exports of the newest pushes are kept; older ones go even if this push fails
                while len(self._exports) > self.keep:
                    shutil.rmtree(self._exports.pop(0), ignore_errors=True)
            t1 = time.perf_counter()
            if self.fleet is not None:  # before the push: a server restarting meanwhile loads these weights
                self.fleet.set_current_weights(str(path), version)
            try:
                self.client.update_weights(str(path), version)
            except Exception as e:  # noqa: BLE001 -- one retry (a worker restarting, a router blip), then raise
                self.log(f"[fleet] push of v{version} failed ({type(e).__name__}: {e}); retrying once")
                time.sleep(1.0)
                self.client.update_weights(str(path), version)
            t2 = time.perf_counter()
            first = self._pushed is None
            self._pushed = version
            if first and hasattr(self.client, "server_weight_versions"):
                held = self.client.server_weight_versions()
                self.log(f"[fleet] workers hold v{version}: " + ", ".join(f"{u} -> {v}" for u, v in held.items()))
            behind = {u: v for u, v in getattr(self.client, "worker_versions", dict)().items() if v != version}
            if behind:
                self.log(f"[fleet] v{version} did not reach " + ", ".join(f"{u} (holds v{v})" for u, v in
                                                                          behind.items())
                         + ": their tokens carry that version until they are caught up")
            self.sync.update(weight_sync_seconds=t2 - t0, weight_sync_export_seconds=t1 - t0,
                             weight_sync_bytes=sum(f.stat().st_size for f in path.glob("*.safetensors")))
            self.sync["weight_pushes"] += 1
            self.sync["weight_sync_total_seconds"] += t2 - t0

    # ---- what the trainer reads besides the protocol ----

    def reseed(self, seed: int) -> None:
        """Re-seed what the client draws itself (thinking budgets of client-side interruption); the servers'
        sampling is their own."""
        self.client.reseed(seed)

    def device_count(self) -> int:
        """Generator devices the fleet uses (counted in the run's compute)."""
        if self._devices is not None:
            return int(self._devices)
        for owner, name in ((self.fleet, "device_count"), (self.client, "device_count")):
            fn = getattr(owner, name, None) if owner is not None else None
            if fn is not None:
                return int(fn())
        return len(getattr(self.client, "urls", ())) or 1

    def metrics(self) -> dict[str, float]:
        """Per-step numbers for the train rows: the last push and the client's cumulative counters."""
        out: dict[str, float] = dict(self.sync)
        snap = getattr(self.client, "stats_snapshot", None)
        stats = snap() if snap is not None else dict(getattr(self.client, "stats", {}))
        for k, v in stats.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"client_{k}"] = v
            elif isinstance(v, dict):  # per-server counters: {url: {tokens, busy_s, ...}}
                for url, d in v.items():
                    if isinstance(d, dict):
                        for kk, vv in d.items():
                            if isinstance(vv, (int, float)) and not isinstance(vv, bool):
                                out[f"server_{_short(url)}_{kk}"] = vv
        out.update(self._worker_rates())
        return out

    POLL_S = 5.0

    def _worker_rates(self) -> dict[str, float]:
        """Generated tokens/s of each worker (behind a router the client cannot attribute requests): from the
        ``completion_tokens`` counter of our servers' ``/stats``, at most every ``POLL_S`` seconds. Servers without
        that route (real SGLang) are left out."""
        import httpx

        now = time.monotonic()
        if now - self._last_poll < self.POLL_S:
            return self._rates
        self._last_poll = now
        targets = getattr(self.client, "_control_targets", lambda: list(getattr(self.client, "urls", ())))
        try:
            urls = targets()
        except httpx.HTTPError:
            return self._rates
        for url in urls:
            try:
                tokens = float(httpx.get(url + ws.STATS, timeout=2.0).json()["completion_tokens"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                continue
            prev = self._poll.get(url)
            self._poll[url] = (now, tokens)
            if prev is not None and now > prev[0] and tokens >= prev[1]:
                self._rates[f"worker_{_short(url)}_tokens_per_s"] = (tokens - prev[1]) / (now - prev[0])
        return self._rates

    def close(self) -> None:
        """Close the client (its in-flight requests are cancelled; stop a local fleet first so they fail fast)."""
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


def _short(url: str) -> str:
    """``http://127.0.0.1:30001`` -> ``127.0.0.1:30001`` (metric names stay readable)."""
    return url.split("://", 1)[-1].rstrip("/")
