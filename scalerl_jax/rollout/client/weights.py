"""Weight pushes to SGLang-API servers, confirmed worker by worker: the part of
:class:`~scalerl_jax.rollout.client.sglang.SGLangGenerator` that updates weights in flight and knows which version
each worker really holds.

A push (:meth:`WeightUpdates.update_weights`) goes to every control target: the workers (a router URL expanded into
its workers, ``sglang-router`` does not forward control routes, or the fleet's own list). On each it runs
``/pause_generation`` -> ``/update_weights_from_disk {model_path, weight_version, ...}`` -> ``/continue_generation``,
then asks the worker which version it serves (``/get_weight_version``, gone in SGLang 0.5.23: ``/get_model_info``
``weight_version``). A worker that answers another version gets the push once more; if it still disagrees,
:class:`WeightVersionMismatch` names the worker, the version pushed and the version found. A worker that reports
no version at all (SGLang 0.4.10) is taken at its update response's word.

Versions held: the client records, per worker, the version confirmed there. A worker that could not be reached
during a push keeps the version it had. Responses with no per-token versions (neither our
``output_token_versions`` nor SGLang 0.5.19+'s ``weight_versions`` spans) are tagged with what the serving worker
holds (:meth:`WeightUpdates.held_version`); a URL that is not a known worker (a router, which does not say which
worker answered) gets the oldest version any worker holds, so staleness is never under-counted. Before a
``generate`` call, a worker that lags behind the newest push is brought up to date (:meth:`WeightUpdates.catch_up`,
at most once per ``dead_cooldown_s`` per worker while it stays unreachable).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx

from scalerl_jax.rollout import wire_schema as ws

log = logging.getLogger(__name__)


class GenerationError(RuntimeError):
    """A request that could not be completed (bad request, or every retry failed)."""


class WeightVersionMismatch(GenerationError):
    """A worker that took a weight push reports another version than the one pushed (after one re-push)."""

    def __init__(self, url: str, expected: str, found: str) -> None:
        super().__init__(f"{url}: after pushing weight_version {expected!r} (twice), the worker reports "
                         f"weight_version {found!r}")
        self.url, self.expected, self.found = url, expected, found


class WeightUpdates:
    """Mixin of :class:`~scalerl_jax.rollout.client.sglang.SGLangGenerator`: weight pushes, per-worker versions and
    the fleet's devices. It uses the client's ``urls``, ``control_urls``, ``timeout_s``, ``pause_mode``,
    ``dead_cooldown_s``, ``_ctl_http``, ``_lock``, ``_version``, ``_updating``, ``_update_epoch``, ``_routers``,
    ``router_workers``, ``server_caps``, ``_get_json`` and ``_mark_dead``; :meth:`_init_weights` sets its own state.
    """

    CATCH_UP_RETRY_S = 60.0  # a reachable worker whose catch-up failed is tried again after this long

    def _init_weights(self, catch_up: bool) -> None:
        self.catch_up_workers = bool(catch_up)
        self._held: dict[str, int] = {}  # worker URL -> the version confirmed there
        self._latest: tuple[str, int] | None = None  # (path, version) of the newest push that succeeded
        self._push_lock = threading.Lock()  # one push (or catch-up) at a time
        self._catch_up_after: dict[str, float] = {}

    # ---- versions --------------------------------------------------------------------------------------

    def held_version(self, url: str) -> int:
        """The version the worker at ``url`` holds; for a URL that is not a known worker (a router) the oldest
        any worker holds; before the first push, the version the client was given. Call with ``_lock`` held."""
        if url in self._held:
            return self._held[url]
        return min(self._held.values(), default=self._version)

    def worker_versions(self) -> dict[str, int]:
        """Per worker, the version the client confirmed there (empty before the first push)."""
        with self._lock:
            return dict(self._held)

    def reported_version(self, url: str) -> str | None:
        """The ``weight_version`` the worker at ``url`` reports (``/get_weight_version``, else ``/get_model_info``);
        None when it reports none. Raises httpx.HTTPError when it cannot be reached."""
        for route in (ws.WEIGHT_VERSION, ws.MODEL_INFO):
            info = self._get_json(url + route)
            if isinstance(info, dict) and info.get("weight_version") is not None:
                return str(info["weight_version"])
        return None

    def server_weight_versions(self) -> dict[str, str | None]:
        """Every control target's reported weight version (:meth:`reported_version`); None where unreachable."""
        out: dict[str, str | None] = {}
        for url in self._control_targets():
            try:
                out[url] = self.reported_version(url)
            except httpx.HTTPError:
                out[url] = None
        return out

    # ---- control calls -----------------------------------------------------------------------------------

    def _control_targets(self) -> list[str]:
        """Server URLs to send control calls to: ``control_urls`` when set (a fleet that knows its workers), else
        every URL with a router URL expanded into its workers."""
        if self.control_urls is not None:
            return list(self.control_urls())
        targets: list[str] = []
        for url in self.urls:
            try:
                workers = self.router_workers(url)
            except httpx.HTTPError:
                workers = None
            if workers is not None:
                self._routers[url] = True
            targets.extend(workers if workers is not None else [url])
        return list(dict.fromkeys(targets))

    def _control(self, url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._ctl_http.post(f"{url}{route}", json=body, timeout=self.timeout_s)
        try:
            out = r.json()
        except ValueError:
            out = {"message": r.text}
        if r.status_code != 200 or (isinstance(out, dict) and out.get("success") is False):
            raise GenerationError(f"{url}{route}: HTTP {r.status_code}: {str(out)[:500]}")
        return out if isinstance(out, dict) else {"result": out}

    def _update_one(self, url: str, path: str, version: int) -> None:
        pause, update = self.server_caps(url).update_bodies(path, version, self.pause_mode)
        self._control(url, ws.PAUSE, pause)
        try:
            self._control(url, ws.UPDATE_WEIGHTS, update)
        finally:
            self._control(url, ws.CONTINUE, {})

    def _push_one(self, url: str, path: str, version: int) -> None:
        """Push to one worker and confirm the version it then reports (one re-push on a mismatch); records the
        version it holds. Raises httpx.TransportError when it cannot be reached, GenerationError otherwise."""
        expected = str(version)
        found = None
        for attempt in range(2):
            self._update_one(url, path, version)
            found = self.reported_version(url)
            if found is None or found == expected:
                if found is None and attempt == 0:
                    log.info("%s reports no weight_version: the push of %s is taken at its word", url, expected)
                with self._lock:
                    self._held[url] = version
                return
            log.warning("%s reports weight_version %r after the push of %r; pushing again", url, found, expected)
        raise WeightVersionMismatch(url, expected, str(found))

    # ---- pushes ------------------------------------------------------------------------------------------

    def update_weights(self, weights: Any, version: int) -> None:
        """Load the HF checkpoint directory ``weights`` on every worker, in flight, tagged ``version``, and confirm
        each worker's version (see the module docstring).

        Workers that cannot be reached are skipped (marked dead; they keep their version and are caught up
        later); any other failure, a confirmed wrong version included, raises after generation has been resumed
        on that worker. Raises when no worker took the update.
        """
        if not isinstance(weights, (str, bytes)) and not hasattr(weights, "__fspath__"):
            raise TypeError("SGLangGenerator.update_weights takes an HF checkpoint directory path, "
                            f"got {type(weights).__name__}")
        path, version = str(weights), int(version)
        with self._push_lock:
            with self._lock:
                self._updating += 1
            try:
                targets = self._control_targets()
                with self._lock:  # a worker first seen now holds what the others were last given
                    self._held = {u: self._held.get(u, self._version) for u in targets}
                results = self._push_all(targets, path, version)
                unreachable = [u for u, e in results.items() if isinstance(e, httpx.TransportError)]
                for u in unreachable:
                    log.warning("update_weights: %s unreachable, skipped (it keeps v%s)", u, self._held.get(u))
                    self._mark_dead(u)
                failed = {u: e for u, e in results.items() if e is not None and u not in unreachable}
                if failed:  # the first failure is the cause (a WeightVersionMismatch keeps its fields there)
                    raise GenerationError(
                        f"update_weights to version {version} failed on {len(failed)} server(s): "
                        + "; ".join(str(e) if str(e).startswith(u) else f"{u}: {e}" for u, e in failed.items())
                    ) from next(iter(failed.values()))
                if len(unreachable) == len(targets):
                    raise GenerationError(f"update_weights: no server reachable among {targets}")
                with self._lock:
                    self._version = version
                    self._latest = (path, version)
            finally:
                with self._lock:
                    self._updating -= 1
                    self._update_epoch += 1

    def _push_all(self, targets: list[str], path: str, version: int) -> dict[str, BaseException | None]:
        """:meth:`_push_one` on every target at once; the exception of each (None: done)."""
        results: dict[str, BaseException | None] = {}

        def run(url: str) -> None:
            try:
                self._push_one(url, path, version)
                results[url] = None
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                results[url] = e

        threads = [threading.Thread(target=run, args=(u,)) for u in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def catch_up(self) -> list[str]:
        """Bring workers that missed a push up to the newest one (confirmed); returns those brought up to date.

        A worker is tried at most once per ``dead_cooldown_s`` while unreachable (once per ``CATCH_UP_RETRY_S``
        when it answers but the push fails); one that already reports the newest version (a fleet restarted it with
        those weights) is only recorded. Skipped while a push is under way (it reaches
        them). Failures are logged, not raised: the worker's tokens keep its older version.
        """
        if not self.catch_up_workers or self._latest is None:
            return []
        now = time.monotonic()
        with self._lock:
            version = self._latest[1]
            lagging = [u for u, v in self._held.items() if v != version and self._catch_up_after.get(u, 0.0) <= now]
        if not lagging or not self._push_lock.acquire(blocking=False):
            return []
        done = []
        try:
            with self._lock:
                self._updating += 1
                path, version = self._latest
            for url in lagging:
                with self._lock:
                    self._catch_up_after[url] = now + self.dead_cooldown_s
                try:
                    if self.reported_version(url) == str(version):
                        with self._lock:
                            self._held[url] = version
                    else:
                        self._push_one(url, path, version)
                    done.append(url)
                    log.info("%s caught up with weights v%d", url, version)
                except httpx.TransportError:
                    self._mark_dead(url)
                except Exception as e:  # noqa: BLE001 - its tokens keep its real (older) version meanwhile
                    log.warning("catching %s up with weights v%d failed: %s", url, version, e)
                    with self._lock:  # reachable but refusing: try again much later, not before every batch
                        self._catch_up_after[url] = now + max(self.dead_cooldown_s, self.CATCH_UP_RETRY_S)
        finally:
            with self._lock:
                self._updating -= 1
                self._update_epoch += 1
            self._push_lock.release()
        return done

    def device_count(self) -> int:
        """Accelerator devices the fleet generates on: the sum over servers (routers expanded into their workers)
        of what each reports in ``/get_server_info`` (see :func:`.wire_schema.devices_from_server_info`); a server
        that cannot be asked, or reports nothing usable, counts as 1."""
        total = 0
        for url in self._control_targets():
            total += self.server_caps(url, refresh=True).devices or 1
        return total
