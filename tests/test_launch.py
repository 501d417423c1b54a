"""The launcher's per-rank GPU split (``--gpus-per-process``): the environment each rank receives, checked in
``child_env`` / ``plan_gpus`` and in real launches of tiny children that print their environment (no JAX). Its
heartbeat diagnosis: a process ended by the coordination service's heartbeat check is called busy (raise
``--heartbeat-timeout``), dead or stopped from what the launcher saw of the silent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_jax.launch import LaunchError, child_env, heartbeat_diagnosis, host_gpus, plan_gpus, rank_gpus
from tests.conftest import HANG_S, ROOT

SMI = """#!/bin/sh
echo "GPU 0: NVIDIA H200 (UUID: GPU-0a)"
echo "GPU 1: NVIDIA H200 (UUID: GPU-1b)"
echo "  MIG 3g.71gb     Device  0: (UUID: MIG-2c)"
echo "GPU 2: NVIDIA H200 (UUID: GPU-3d)"
echo "GPU 3: NVIDIA H200 (UUID: GPU-4e)"
"""


@pytest.fixture
def fake_smi(tmp_path) -> str:
    """A PATH whose nvidia-smi lists 4 GPUs (one with a MIG instance, which is not a GPU of its own)."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "nvidia-smi").write_text(SMI)
    (d / "nvidia-smi").chmod(0o755)
    return str(d)


def _base(**kw) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "SCALERL_LOCAL_DEVICE_IDS")}
    return {**env, **kw}


def test_child_env_gives_each_rank_its_own_gpus_renumbered_from_zero():
    host = ["4", "5", "6", "7"]  # the launcher itself was given GPUs 4..7
    envs = [child_env({"PATH": "/bin"}, coordinator="127.0.0.1:1", n=2, rank=r, cpu_devices=None,
                      gpus=rank_gpus(host, r, 2)) for r in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "6,7"]
    assert [e["SCALERL_LOCAL_DEVICE_IDS"] for e in envs] == ["0,1", "0,1"]  # ordinals after CUDA's renumbering
    assert [e["JAX_PROCESS_ID"] for e in envs] == ["0", "1"] and {e["JAX_NUM_PROCESSES"] for e in envs} == {"2"}
    # 3 ranks x 1 GPU of 4: the fourth GPU is nobody's; UUIDs are passed on as written
    uuids = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    assert [rank_gpus(uuids, r, 1) for r in range(3)] == [["GPU-a"], ["GPU-b"], ["GPU-c"]]
    # without --gpus-per-process nothing about GPUs is set or changed
    e = child_env({"CUDA_VISIBLE_DEVICES": "1,2"}, coordinator="h:1", n=2, rank=1, cpu_devices=None)
    assert e["CUDA_VISIBLE_DEVICES"] == "1,2" and "SCALERL_LOCAL_DEVICE_IDS" not in e


def test_the_host_gpu_count_comes_from_cuda_visible_devices_or_nvidia_smi(fake_smi, tmp_path):
    assert host_gpus({"CUDA_VISIBLE_DEVICES": "2, 3,5", "PATH": fake_smi})[0] == ["2", "3", "5"]  # wins over smi
    assert host_gpus({"CUDA_VISIBLE_DEVICES": "", "PATH": fake_smi})[0] == []  # set but empty: no GPU
    assert host_gpus({"PATH": fake_smi}) == (["0", "1", "2", "3"], "nvidia-smi -L")
    gpus, why = host_gpus({"PATH": str(tmp_path)})  # no nvidia-smi there
    assert gpus is None and "nvidia-smi -L could not run" in why

    split, note = plan_gpus(2, 2, {"PATH": fake_smi})
    assert split == [["0", "1"], ["2", "3"]] and note.startswith("4 GPUs on this host")
    with pytest.raises(LaunchError, match=r"--processes 3 x --gpus-per-process 2 = 6 GPUs, but this host has 4 "
                                          r"\(nvidia-smi -L\)"):
        plan_gpus(3, 2, {"PATH": fake_smi})
    with pytest.raises(LaunchError, match=r"= 4 GPUs, but this host has 3 \(CUDA_VISIBLE_DEVICES='0,1,2'\)"):
        plan_gpus(2, 2, {"CUDA_VISIBLE_DEVICES": "0,1,2"})
    split, note = plan_gpus(2, 2, {"PATH": str(tmp_path)})
    assert split == [["0", "1"], ["2", "3"]] and note.startswith("the GPU count could not be checked")


def _launch(tmp_path: Path, *own: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerl_jax.launch", *own, "--log-dir", str(tmp_path / "logs"),
                           "--", "tests._print_env"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)


def _children(out: str) -> dict[int, dict]:
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in out.splitlines() if "ENV {" in line]
    return {int(e["JAX_PROCESS_ID"]): e for e in envs}


def test_a_real_launch_gives_each_child_its_gpus(tmp_path, fake_smi):
    env = _base(CUDA_VISIBLE_DEVICES="3,5,6,7")
    r = _launch(tmp_path, "--processes", "2", "--gpus-per-process", "2", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    got = _children(r.stdout)
    assert {k: (e["CUDA_VISIBLE_DEVICES"], e["SCALERL_LOCAL_DEVICE_IDS"], e["JAX_NUM_PROCESSES"])
            for k, e in got.items()} == {0: ("3,5", "0,1", "2"), 1: ("6,7", "0,1", "2")}
    assert got[0]["JAX_COORDINATOR_ADDRESS"] == got[1]["JAX_COORDINATOR_ADDRESS"]
    assert "GPUs per process: 0: 3,5; 1: 6,7" in r.stdout

    # the count from nvidia-smi; 2 ranks x 1 GPU of 4
    r = _launch(tmp_path, "--processes", "2", "--gpus-per-process", "1", env=_base(PATH=fake_smi))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {k: e["CUDA_VISIBLE_DEVICES"] for k, e in _children(r.stdout).items()} == {0: "0", 1: "1"}


def test_a_launch_asking_for_more_gpus_than_the_host_has_starts_nothing(tmp_path, fake_smi):
    r = _launch(tmp_path, "--processes", "3", "--gpus-per-process", "2", env=_base(PATH=fake_smi))
    assert r.returncode == 2 and "= 6 GPUs, but this host has 4 (nvidia-smi -L)" in r.stderr, r.stderr
    assert not (tmp_path / "logs").exists() and "ENV" not in r.stdout
    r = _launch(tmp_path, "--processes", "2", "--gpus-per-process", "1", "--cpu-devices", "2", env=_base())
    assert r.returncode == 2 and "exclude each other" in r.stderr
    r = _launch(tmp_path, "--processes", "2", "--gpus-per-process", "0", env=_base(PATH=fake_smi))
    assert r.returncode == 2 and "--gpus-per-process must be >= 1, got 0" in r.stderr

    # neither CUDA_VISIBLE_DEVICES nor nvidia-smi: said so, and the ranks still get disjoint GPUs
    r = _launch(tmp_path, "--processes", "2", "--gpus-per-process", "2", env=_base(PATH=str(tmp_path)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the GPU count could not be checked: CUDA_VISIBLE_DEVICES is unset and nvidia-smi -L could not run" \
        in r.stdout
    assert {k: e["CUDA_VISIBLE_DEVICES"] for k, e in _children(r.stdout).items()} == {0: "0,1", 1: "2,3"}


# JAX's own lines (jaxlib 0.10) when the coordination service found processes 1 and 0 silent
SILENT = ("[dist] timeouts: start-up 300s (--dist-timeout); heartbeat 60s (--heartbeat-timeout: ...)\n"
          "F1203 client.h:80] Terminating process because the JAX distributed service detected fatal errors. ... "
          "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n1\n0\nThe tasks have crashed.")


def test_the_heartbeat_diagnosis_tells_busy_from_dead_and_stopped():
    busy = heartbeat_diagnosis(SILENT, {}, set(), 2)
    assert "declared process(es) 0, 1 dead (stopped sending heartbeats), but the launcher saw every process of " \
        "the 2 alive and running until then: busy, not dead" in busy
    assert "Raise --heartbeat-timeout (it was 60s)" in busy
    # process 1 had been SIGKILLed (signal 9) before process 0 reported it silent: dead, and no advice to raise
    dead = heartbeat_diagnosis(SILENT, {1: -9}, set(), 2)
    assert "process 1 was killed by SIGKILL before (dead, not busy)" in dead and "Raise" not in dead
    stopped = heartbeat_diagnosis(SILENT, {}, {1}, 2)
    assert "saw process(es) 1 stopped (state T" in stopped and "Raise" not in stopped
    # another process had exited cleanly: only the silent ones are said to have been alive; no timeouts line
    assert "saw process(es) 0, 1 of the 3 alive" in heartbeat_diagnosis(SILENT.split("\n", 1)[1], {2: 0}, set(), 3)
    assert "it was" not in heartbeat_diagnosis(SILENT.split("\n", 1)[1], {}, set(), 2)
    assert heartbeat_diagnosis("Traceback ... ValueError: bad batch", {}, set(), 2) is None  # not a heartbeat end


def test_a_real_launch_says_a_silent_process_that_was_alive_was_busy(tmp_path):
    """Rank 1 of 3 ends as JAX ends a process after the service found 1 and 0 silent, while every process runs."""
    r = subprocess.run([sys.executable, "-m", "scalerl_jax.launch", "--processes", "3", "--grace", "2",
                        "--log-dir", str(tmp_path), "--", "tests._heartbeat_child", "1"], cwd=ROOT, env=_base(),
                       capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 134, (r.returncode, r.stderr)  # 128 + SIGABRT, as the process ended
    assert "process 1 was killed by SIGABRT; stopping the other processes" in r.stderr
    assert "declared process(es) 0, 1 dead (stopped sending heartbeats), but the launcher saw every process of the " \
        "3 alive and running until then: busy, not dead" in r.stderr
    assert "Raise --heartbeat-timeout (it was 12s) on the command and continue with --resume" in r.stderr
