"""LocalFleet with real processes: servers behind the real ``sglang-router``, always stopped, restarted on death.

One 2-server fleet serves the module; the parent-kill tests start their own 1-server fleets inside a small
parent script, since what they check is what happens when that parent dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import sglang_router  # noqa: F401 -- a test dependency: missing, these tests fail instead of skipping

from scalerl_jax.rollout.client import SGLangGenerator
from scalerl_jax.rollout.fleet import FleetError, LocalFleet
from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams
from tests.servers import START_S, checkpoint_pair, kill_once_generating, prompts, stats, wait_until

# hang guards, not speed limits: a process group's end and a monitor's reaction (seconds here)
GONE_S = 120.0

ROOT = Path(__file__).resolve().parents[1]
# the suite's shared compilation cache (tests/conftest.py): restarted servers load their executables
XLA_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
    tempfile.gettempdir(), "scalerl_jax_test_fleet_xla_cache")
SERVER_ARGS = ("--debug-chunk-delay-ms", "15")  # slow decoding a little, so that a kill lands mid-batch


def _group_members(pgids) -> list[tuple[int, str]]:
    """(pid, state) of every live, non-zombie process in one of the process groups ``pgids``."""
    pgids = set(pgids)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp in pgids and state not in ("Z", "X"):
            out.append((int(d.name), state))
    return out


def _wait_groups_gone(pgids, timeout_s: float) -> float:
    t0 = time.monotonic()
    while _group_members(pgids):
        assert time.monotonic() - t0 < timeout_s, f"still alive after {timeout_s} s: {_group_members(pgids)}"
        time.sleep(0.1)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return checkpoint_pair(tmp_path_factory, "fleet_ckpts", 3, 4)


@pytest.fixture(scope="module")
def fleet(ckpts, tmp_path_factory):
    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg)
        print(msg)

    f = LocalFleet(ckpts[0], 2, log_dir=tmp_path_factory.mktemp("fleet_logs"), max_batch=8, decode_chunk=4,
                   compile_cache_dir=XLA_CACHE, extra_server_args=SERVER_ARGS, log=log, startup_timeout_s=START_S)
    f.lines = lines  # type: ignore[attr-defined]
    with f:
        yield f


def test_router_fleet_serves_through_both_workers(fleet):
    assert fleet.url not in fleet.worker_urls and len(set(fleet.worker_urls)) == 2
    assert any(m.startswith("[fleet] starting 2 servers") for m in fleet.lines)
    assert any(m.startswith("[fleet] ready in") for m in fleet.lines)
    assert all(p.exists() for p in fleet.log_files.values()) and set(fleet.log_files) == {"server 0", "server 1",
                                                                                           "router"}
    ws = fleet.router_workers()
    assert {w["url"] for w in ws} == set(fleet.worker_urls) and all(w["is_healthy"] for w in ws)
    assert fleet.device_count() == 2
    infos = [httpx.get(u + "/get_server_info", timeout=5, trust_env=False).json() for u in fleet.worker_urls]
    assert all(i["weight_version"] == "0" and i["max_batch"] == 8 for i in infos)

    before = [stats(u)["generate_requests"] for u in fleet.worker_urls]
    with httpx.Client(trust_env=False, timeout=120) as http:
        for p in prompts(6):
            r = http.post(fleet.url + "/generate", json={"input_ids": p, "sampling_params": {
                "temperature": 0, "max_new_tokens": 8}})
            assert r.status_code == 200, r.text
            assert len(r.json()["output_ids"]) >= 1
    counts = [stats(u)["generate_requests"] - b for u, b in zip(fleet.worker_urls, before)]
    assert min(counts) >= 1 and sum(counts) == 6, counts


def test_killed_server_is_restarted_with_current_weights(fleet, ckpts):
    fleet.set_current_weights(ckpts[1], 7)
    victim_url = fleet.worker_urls[1]
    victim_pid = fleet.pids["server 1"]
    restarts = fleet.restarts
    start = stats(victim_url)["generate_requests"]

    killer = kill_once_generating(victim_url, lambda: os.killpg(victim_pid, signal.SIGKILL), start)

    # the run goes on through the kill: every prompt completes exactly once
    reqs = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=20), request_id=f"k{i}")
            for i, p in enumerate(prompts(16))]
    t = threading.Thread(target=killer)
    with SGLangGenerator(fleet.url, timeout_s=60, max_retries=8, backoff_s=0.2, concurrency=8) as gen:
        t.start()
        results = gen.generate(reqs)
        t.join()
    assert len(results) == len(reqs)
    for req, comps in zip(reqs, results):
        assert len(comps) == 1 and comps[0].request_id == req.request_id
        assert comps[0].finish_reason in ("stop", "length") and comps[0].token_ids

    # the monitor restarts it on the same port with the newest weights; the router re-admits it
    deadline = time.monotonic() + START_S  # a server's start-up: a hang guard
    while True:
        version = None
        try:
            version = httpx.get(victim_url + "/get_weight_version", timeout=2, trust_env=False).json()
        except httpx.HTTPError:
            pass
        ws = fleet.router_workers()
        if (version == {"weight_version": "7"} and len(ws) == 2 and all(w["is_healthy"] for w in ws)
                and fleet.restarts == restarts + 1):
            break
        assert time.monotonic() < deadline, (version, ws, fleet.restarts, fleet.lines[-5:])
        time.sleep(0.2)
    assert fleet.pids["server 1"] != victim_pid
    assert any("server 1" in m and "died (exit -9); restarting with weights v7" in m for m in fleet.lines)
    assert "server 0" in fleet.pids and len(fleet.pids) == 3
    # and it serves again through the router
    with httpx.Client(trust_env=False, timeout=120) as http:
        for p in prompts(4):
            r = http.post(fleet.url + "/generate", json={"input_ids": p, "sampling_params": {"max_new_tokens": 4}})
            assert r.status_code == 200, r.text
    assert stats(victim_url)["generate_requests"] >= 1


def test_weights_set_during_a_restart_reach_the_restarted_server(fleet, ckpts):
    old_pid = fleet.pids["server 1"]
    os.killpg(old_pid, signal.SIGKILL)
    # respawned with v7; newer weights arrive while it is still loading
    wait_until(lambda: fleet.pids.get("server 1", old_pid) != old_pid, GONE_S, lambda: fleet.lines[-3:])
    fleet.set_current_weights(ckpts[0], 9)
    url = fleet.worker_urls[1]

    def version():
        try:
            return httpx.get(url + "/get_weight_version", timeout=2, trust_env=False).json()["weight_version"]
        except httpx.HTTPError:
            return None

    wait_until(lambda: version() == "9", START_S, lambda: (version(), fleet.lines[-3:]))
    assert any("server 1" in m and "is back" in m and "with weights v9" in m for m in fleet.lines)


def test_router_whose_guard_dies_is_replaced_without_an_orphan(fleet):
    guard = fleet.pids["router"]
    router_procs = [pid for pid, _ in _group_members([guard]) if pid != guard]
    assert len(router_procs) == 1
    os.kill(guard, signal.SIGKILL)  # the guard only: its router would be orphaned
    wait_until(lambda: fleet.pids.get("router", guard) != guard and fleet.router_restarts == 1, GONE_S,
              lambda: fleet.lines[-3:])
    _wait_groups_gone([guard], timeout_s=GONE_S)  # the old router is gone, so the new one could bind the port
    wait_until(lambda: len(ws := fleet.router_workers()) == 2 and all(w["is_healthy"] for w in ws), START_S,
              lambda: fleet.router_workers())
    r = httpx.post(fleet.url + "/generate", json={"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}},
                   timeout=START_S, trust_env=False)
    assert r.status_code == 200, r.text


def test_bad_model_dir_is_a_clear_startup_error(tmp_path):
    bad = tmp_path / "not_a_checkpoint"
    bad.mkdir()
    f = LocalFleet(bad, 1, log_dir=tmp_path / "logs", router=False, compile_cache_dir=XLA_CACHE,
                   log=lambda m: None)
    with pytest.raises(FleetError) as ei:
        f.start()
    msg = str(ei.value)
    port = f.worker_urls[0].rsplit(":", 1)[1]
    assert "server 0" in msg and f":{port}" in msg and "during start-up" in msg, msg
    assert "config.json not found" in msg, msg  # the quoted log tail
    assert f.pids == {}
    f.stop()  # idempotent after a failed start


PARENT = textwrap.dedent("""
    import json, signal, sys, time
    sys.path.insert(0, {root!r})
    from scalerl_jax.rollout.fleet import LocalFleet

    def own_handler(signum, frame):  # an experiment's own SIGTERM handler, installed before the fleet's
        print("own handler: fleet already stopped:", fleet.pids == {{}}, file=sys.stderr, flush=True)
        sys.exit(7)

    # Ctrl-C in a terminal: Python's KeyboardInterrupt (a suite started in the background, e.g. with nohup or &,
    # hands its children SIGINT ignored, and a process that ignores SIGINT keeps its fleet through it too)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if {own_handler!r}:
        signal.signal(signal.SIGTERM, own_handler)
    fleet = LocalFleet({ckpt!r}, 1, log_dir={logs!r}, max_batch=4, compile_cache_dir={cache!r},
                       log=lambda m: print(m, file=sys.stderr, flush=True), startup_timeout_s={start_s!r})
    with fleet:
        print(json.dumps(fleet.pids), flush=True)
        while True:
            time.sleep(0.1)
""")


@pytest.mark.parametrize(("sig", "own_handler"), [(signal.SIGINT, False), (signal.SIGTERM, False),
                                                  (signal.SIGTERM, True), (signal.SIGKILL, False)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-chained", "SIGKILL"])
def test_children_die_with_their_parent(sig, own_handler, ckpts, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(root=str(ROOT), ckpt=str(ckpts[0]), logs=str(tmp_path / "logs"),
                                    cache=XLA_CACHE, own_handler=own_handler, start_s=START_S))
    with open(tmp_path / "parent.err", "w") as err:
        parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True,
                                  start_new_session=True)
    pids: dict[str, int] = {}
    try:
        line = parent.stdout.readline()  # the parent's start-up is bounded by the fleet's timeout
        assert line, (tmp_path / "parent.err").read_text()
        pids = json.loads(line)
        assert set(pids) == {"server 0", "router"}
        members = _group_members(pids.values())
        assert len(members) >= 3, members  # the server, the router's guard and the router itself
        os.kill(parent.pid, sig)
        rc = parent.wait(timeout=GONE_S)
        # SIGINT / SIGTERM: the fleet is stopped, then the previous handler runs (or the default action)
        assert rc == (7 if own_handler else -sig), rc
        if own_handler:
            assert "own handler: fleet already stopped: True" in (tmp_path / "parent.err").read_text()
        took = _wait_groups_gone(pids.values(), timeout_s=GONE_S)
        print(f"{sig.name}: children gone {took:.1f} s after the parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
        for pid, _ in _group_members(pids.values()):
            os.kill(pid, signal.SIGKILL)


def test_stop_leaves_no_child_alive(fleet):
    """Runs last in this module: it stops the shared fleet."""
    pids = fleet.pids
    assert len(pids) == 3 and len(_group_members(pids.values())) >= 4
    fleet.stop()
    assert _group_members(pids.values()) == []  # stop() returns only after reaping every group
    for pid in pids.values():
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left behind
    assert fleet.pids == {}
    fleet.stop()
