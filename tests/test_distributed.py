"""jax.distributed start-up and the leader -> followers channel (scalerl_jax/distributed.py).

- Which GPUs a process uses: ``SCALERL_LOCAL_DEVICE_IDS``, and the SLURM split for one rank per node, one rank
  per GPU (bound by SLURM or not) and ranks sharing a node's GPUs; SLURM's coordinator address against JAX's own.
- The channel with two real CPU processes (started as the launcher does, or as a 2-task srun step): a follower
  waits for a slow leader far past its poll and the heartbeat timeout and gets the command; a leader killed with
  SIGKILL ends the follower at once with JAX's message that the leader died, one that hangs (SIGSTOP) ends it
  after the heartbeat timeout. The same with the default heartbeat timeout while a CPU hog keeps every core busy:
  the starved pair stays up, and a killed leader still ends the follower within seconds, not after the timeout.
  A killed follower ends the leader at its next collective (gloo's closed connection) and 10 s in JAX's shutdown
  barrier, not after the heartbeat timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from scalerl_jax.config import ConfigError
from scalerl_jax.distributed import StallWatch, resolve, slurm_coordinator, slurm_first_host, slurm_tasks_on_node
from scalerl_jax.launch import free_port
from tests.conftest import ROOT


def _slurm(**kw) -> dict[str, str]:
    env = dict(SLURM_JOB_ID="12345", SLURM_STEP_ID="0", SLURM_NTASKS="8", SLURM_PROCID="5", SLURM_LOCALID="1",
               SLURM_NODEID="1", SLURM_STEP_NODELIST="gpu[003-004]", SLURM_STEP_TASKS_PER_NODE="4(x2)")
    env.update(kw)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_node_list_and_coordinator():
    assert [slurm_first_host(s) for s in ("node001", "node001,host2", "node[001-015],host2", "node[007,009-015]",
                                          "rack1-[01-04]-ib,x", "a[1-2]b[3-4]")] == \
        ["node001", "node001", "node001", "node007", "rack1-01-ib", "a1b3"]
    with pytest.raises(ConfigError, match="without"):
        slurm_first_host("node[001-003")
    # JAX's rule for the port: 61440 + job id % 4096 = 61440 + 57
    assert slurm_coordinator(_slurm()) == "gpu003:61497"
    assert slurm_coordinator(_slurm(JAX_COORDINATOR_PORT="29500")) == "gpu003:29500"
    assert slurm_tasks_on_node(_slurm(SLURM_STEP_TASKS_PER_NODE="2(x3),1", SLURM_NODEID="3")) == 1
    assert slurm_tasks_on_node(_slurm(SLURM_STEP_TASKS_PER_NODE="2(x3),1", SLURM_NODEID="2")) == 2
    with pytest.raises(ConfigError, match="SLURM_PROCID"):
        resolve(env=_slurm(SLURM_PROCID=None))


def test_slurm_coordinator_agrees_with_jax_own_detection(monkeypatch):
    from jax._src.clusters.slurm_cluster import SlurmCluster

    for nodes in ("node001", "node001,host2", "node[001-015],host2", "node[007,009-015]"):
        env = _slurm(SLURM_STEP_NODELIST=nodes)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert slurm_coordinator(env) == SlurmCluster.get_coordinator_address(None, None)


def test_slurm_device_split():
    one_per_node = resolve(env=_slurm(SLURM_NTASKS="4", SLURM_PROCID="2", SLURM_LOCALID="0", SLURM_NODEID="2",
                                      SLURM_STEP_NODELIST="gpu[003-006]", SLURM_STEP_TASKS_PER_NODE="1(x4)",
                                      CUDA_VISIBLE_DEVICES="0,1,2,3"))
    assert (one_per_node.source, one_per_node.num_processes, one_per_node.process_id) == ("slurm", 4, 2)
    assert one_per_node.local_device_ids is None  # all 4 (JAX's own detection would give [0] only)
    # one rank per GPU, 4 per node: SLURM bound one GPU to each task, or left all 4 visible to each
    assert resolve(env=_slurm(SLURM_GPUS_PER_TASK="1", CUDA_VISIBLE_DEVICES="1")).local_device_ids is None
    assert resolve(env=_slurm(SLURM_GPUS_PER_TASK="1", CUDA_VISIBLE_DEVICES="0,1,2,3")).local_device_ids == (1,)
    assert resolve(env=_slurm(CUDA_VISIBLE_DEVICES="0,1,2,3")).local_device_ids == (1,)
    # 2 ranks x 2 GPUs on a 4-GPU node (--gpus-per-node=4 --ntasks-per-node=2): rank 1 takes ordinals 2, 3 ...
    two = dict(SLURM_STEP_TASKS_PER_NODE="2(x4)", SLURM_GPUS_ON_NODE="4")
    assert resolve(env=_slurm(**two, CUDA_VISIBLE_DEVICES="0,1,2,3")).local_device_ids == (2, 3)
    # ... unless SLURM already gave it only its 2 (--gpu-bind=per_task:2)
    assert resolve(env=_slurm(**two, CUDA_VISIBLE_DEVICES="2,3")).local_device_ids is None
    assert resolve(env=_slurm(SLURM_GPUS_PER_TASK="h100:2", SLURM_STEP_TASKS_PER_NODE="2(x4)",
                              CUDA_VISIBLE_DEVICES="0,1,2,3")).local_device_ids == (2, 3)
    assert resolve(env=_slurm()).local_device_ids == (1,)  # nothing visible said: one GPU per rank, as JAX does
    with pytest.raises(ConfigError, match="SCALERL_LOCAL_DEVICE_IDS"):  # 3 GPUs for 2 ranks: whose is which?
        resolve(env=_slurm(SLURM_STEP_TASKS_PER_NODE="2(x4)", CUDA_VISIBLE_DEVICES="0,1,2"))
    explicit = resolve(env=_slurm(SCALERL_LOCAL_DEVICE_IDS="0,2", CUDA_VISIBLE_DEVICES="0,1,2"))
    assert (explicit.local_device_ids, explicit.devices_from) == ((0, 2), "SCALERL_LOCAL_DEVICE_IDS")


def test_launcher_environment_resolves_with_its_device_ids():
    env = dict(JAX_COORDINATOR_ADDRESS="127.0.0.1:1234", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1",
               SCALERL_LOCAL_DEVICE_IDS="0,1", CUDA_VISIBLE_DEVICES="2,3")
    cfg = resolve(env=env)
    assert (cfg.source, cfg.process_id, cfg.local_device_ids) == ("env", 1, (0, 1))
    assert resolve(env={**env, "SCALERL_LOCAL_DEVICE_IDS": ""}).local_device_ids is None
    for bad in ("a,b", "0,0", "-1"):
        with pytest.raises(ConfigError, match="SCALERL_LOCAL_DEVICE_IDS"):
            resolve(env={**env, "SCALERL_LOCAL_DEVICE_IDS": bad})
    # the two timeouts are separate; defaults 300 s each; nonsense is refused naming the flag
    assert (cfg.init_timeout_s, cfg.heartbeat_timeout_s) == (300, 300)
    cfg = resolve(env=env, init_timeout_s=60, heartbeat_timeout_s=900)
    assert (cfg.init_timeout_s, cfg.heartbeat_timeout_s) == (60, 900)
    with pytest.raises(ConfigError, match=r"--heartbeat-timeout must be a whole number of seconds >= 1, got 0"):
        resolve(env=env, heartbeat_timeout_s=0)
    with pytest.raises(ConfigError, match=r"--dist-timeout must be .* got -5"):
        resolve(env={}, init_timeout_s=-5)


def test_the_stall_watch_measures_how_long_the_process_did_not_run():
    """The main thread keeps the GIL for 1.5 s (a 5 s switch interval): the watch thread cannot run meanwhile."""
    lines: list[str] = []
    watch = StallWatch(3, 8, period_s=0.05, report_s=0.5, log=lines.append).start()
    time.sleep(0.3)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:
            pass
    finally:
        sys.setswitchinterval(interval)
    time.sleep(0.3)
    watch.close()
    # the loop holds the GIL for 1.5 s of wall time whatever the machine's speed; the watch, waking every 0.05 s,
    # sees a stall of about that: below 1.5 by at most the wake-up it had just had, above it by how late the OS
    # wakes the thread afterwards (a loaded machine: up to 1.5 s allowed)
    assert 1.2 < watch.longest_s < 3.0, watch.longest_s
    stalls = [s for s in lines if s.startswith("[dist] process 3 did not run for ")]
    assert len(stalls) == 1 and "heartbeat timeout 8s" in stalls[0], lines  # the 0.05 s wake-ups are below 0.5 s
    # printed with one decimal: within half a unit of it (and the float's own rounding)
    assert float(stalls[0].split(" for ")[1].split("s")[0]) == pytest.approx(watch.longest_s, abs=0.05 + 1e-9)
    assert lines[-1] == f"[dist] process 3: longest stall {watch.longest_s:.1f}s (heartbeat timeout 8s)"


# ---- the channel, two real processes ------------------------------------------------------------------------

CHILD = """
import sys, time
from scalerl_jax import distributed as dist
hb = {} if sys.argv[1] == "default" else {"heartbeat_timeout_s": int(sys.argv[1])}
watch = dist.initialize(dist.resolve(**hb))
ch = dist.Channel()
if dist.is_leader():
    time.sleep(float(sys.argv[2]))
    ch.send("hello", {"x": 1})
    print("sent", flush=True)
    time.sleep(600)
t0 = time.monotonic()
cmd, meta, _ = ch.recv()
print(f"got {cmd} {meta} after {time.monotonic() - t0:.1f}s; longest stall {watch.longest_s:.2f}s", flush=True)
ch.recv()
print("second command?!", flush=True)
"""
HEARTBEAT_S, POLL_S = 5, 0.5
START_S = 600  # a hang guard for two JAX processes' start-up on a loaded machine, not a speed limit


def _pair(tmp_path, leader_delay_s: float, slurm: bool, heartbeat: str = str(HEARTBEAT_S)):
    """Leader and follower, told their ranks as the launcher does, or as an srun step of 2 tasks on one node."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, JAX_PLATFORMS="cpu", SCALERL_CHANNEL_POLL_S=str(POLL_S))
        if slurm:
            env.update(SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURM_NTASKS="2", SLURM_PROCID=str(rank),
                       SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_STEP_NODELIST="localhost",
                       SLURM_STEP_TASKS_PER_NODE="2", JAX_COORDINATOR_PORT=str(port))
        else:
            env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(rank))
        log = open(tmp_path / f"p{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, "-c", CHILD, heartbeat, str(leader_delay_s)],
                                       cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    return procs


# SIGKILL: a 20 s heartbeat timeout, which the leader's 25 s silence outlasts (the follower still waits) and which
# the closed sockets then beat by far on any machine; SIGSTOP: a hung leader, which only the heartbeat timeout ends
# (the SIGKILL case waits 25 s by design: extended, CI runs it; the suite keeps the SIGSTOP case)
@pytest.mark.parametrize("how,delay,slurm,heartbeat", [
    pytest.param("SIGKILL", 25.0, False, 20, marks=pytest.mark.extended), ("SIGSTOP", 0.0, True, HEARTBEAT_S)])
def test_a_follower_waits_for_a_slow_leader_and_stops_when_it_dies(tmp_path, how, delay, slurm, heartbeat):
    (leader, l0), (follower, l1) = _pair(tmp_path, delay, slurm, heartbeat=str(heartbeat))
    out = tmp_path / "p1.log"
    try:
        deadline = time.monotonic() + START_S + delay
        while time.monotonic() < deadline and "got hello" not in out.read_text() and follower.poll() is None:
            time.sleep(0.2)
        text = out.read_text()
        # SIGKILL case: waited 50 polls and 1.25 heartbeat timeouts for a leader that was alive, and got its command
        assert follower.poll() is None and "got hello {'x': 1} after" in text, text + (tmp_path / "p0.log").read_text()
        waited = float(text.split("got hello {'x': 1} after ")[1].split("s")[0])
        assert waited >= delay - 2, waited  # less the follower's later start-up
        assert f"heartbeat {heartbeat}s" in text and f"waking every {POLL_S:g}s" in text
        if slurm:  # resolved from SLURM's variables; GPU 1 of the node's 2 ranks (ignored on CPU)
            assert "[dist] process 1 of 2: 1 local and 2 global devices (slurm; coordinator localhost:" in text
            assert "GPUs 1 (SLURM_LOCALID 1 of 2 ranks on this node, 1 each (CUDA_VISIBLE_DEVICES unset))" in text
        t0 = time.monotonic()
        leader.send_signal(getattr(signal, how))
        rc = follower.wait(timeout=START_S)
        took = time.monotonic() - t0
    finally:
        for p in (leader, follower):
            if p.poll() is None:
                p.kill()
                p.wait()
        l0.close()
        l1.close()
    text = out.read_text()
    print(f"{how}: the follower stopped {took:.1f}s later with status {rc}")
    assert rc != 0 and "second command?!" not in text
    assert "Terminating process because the JAX distributed service detected fatal errors" in text \
        or "lost the leader (process 0)" in text, text[-3000:]
    if how == "SIGKILL":  # the leader's sockets close: at once (0.2 s here), and JAX says the leader died
        assert took < heartbeat / 2, took
        assert "the leader task was preempted/died" in text or "lost the leader (process 0)" in text, text[-3000:]
    else:  # a hung leader: the follower's heartbeats fail for the heartbeat timeout, not less
        assert heartbeat - 1 < took < 3 * heartbeat + 30, took


HOG = """
import time
end = time.monotonic() + float(__import__("sys").argv[1])
while time.monotonic() < end:
    pass
"""


def test_under_a_cpu_hog_the_default_heartbeat_keeps_a_starved_pair_up_and_a_killed_leader_still_ends_it(tmp_path):
    """Two spinning processes per core beside the pair (on top of whatever else the machine runs), until the test
    ends: the leader sends its command 10 s after start-up, the follower gets it, then the leader is SIGKILLed."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(2 * START_S)]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        (leader, l0), (follower, l1) = _pair(tmp_path, 10.0, False, heartbeat="default")
        out = tmp_path / "p1.log"
        try:
            deadline = time.monotonic() + START_S
            while time.monotonic() < deadline and "got hello" not in out.read_text() and follower.poll() is None:
                time.sleep(0.2)
            text = out.read_text()
            assert follower.poll() is None and leader.poll() is None and "got hello {'x': 1}" in text, \
                text[-3000:] + (tmp_path / "p0.log").read_text()[-3000:]
            assert "heartbeat 300s (--heartbeat-timeout" in text  # the default, logged at start-up
            stall = float(text.split("longest stall ")[1].split("s")[0])
            t0 = time.monotonic()
            leader.send_signal(signal.SIGKILL)
            rc = follower.wait(timeout=START_S)
            took = time.monotonic() - t0
        finally:
            for p in (leader, follower):
                if p.poll() is None:
                    p.kill()
                    p.wait()
            l0.close()
            l1.close()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    text = out.read_text()
    print(f"under the hog: the follower's longest stall {stall:.2f}s; it stopped {took:.1f}s after the leader's "
          f"SIGKILL with status {rc}")
    assert stall < 30, stall  # far below the 300 s default
    assert rc != 0 and "second command?!" not in text
    assert took < 60, took  # the closed sockets (1.1 s here), not the 300 s heartbeat timeout
    assert "the leader task was preempted/died" in text or "lost the leader (process 0)" in text, text[-3000:]


LOOP = """
import time
import numpy as np
from scalerl_jax import distributed as dist
dist.initialize(dist.resolve())
ch = dist.Channel(poll_s=0.5)
for i in range(10**6):
    if dist.is_leader():
        time.sleep(0.5)
        ch.send("step", {"i": i}, {"batch": np.full(1000, i, np.float32)})
    else:
        cmd, meta, arrays = ch.recv()
        assert float(arrays["batch"][0]) == meta["i"] == i
    if i == 3:
        print("3 commands", flush=True)
"""


def test_a_killed_follower_ends_the_leader_at_its_next_collective_not_after_the_heartbeat_timeout(tmp_path):
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-c", LOOP], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    leader, follower = procs
    try:
        for line in follower.stdout:  # the follower has received 4 broadcast batches
            if "3 commands" in line:
                break
        follower.kill()
        t0 = time.monotonic()
        rc = leader.wait(timeout=START_S)
        took = time.monotonic() - t0
        text = leader.stdout.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
    print(f"the leader exited {took:.1f}s after its follower's SIGKILL, status {rc}")
    assert "heartbeat 300s" in text  # the default: not what ended it
    # its error at once, then at most 10 s in JAX's shutdown barrier, which waits for the dead process (10.6 s here;
    # the heartbeat timeout, 300 s, would be far later)
    assert rc == 1 and 9 < took < 100, (rc, took, text[-3000:])
    assert "Connection closed by peer" in text and "[dist] process 0 failed (JaxRuntimeError): exiting without " \
        "jax.distributed's shutdown barrier after 10s" in text
