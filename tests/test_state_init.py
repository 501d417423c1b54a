"""The train state born sharded, HF checkpoints read per shard, and resumes that never lose data.

- On 8 simulated CPU devices (a subprocess, ``_state_init_check.py``): the per-shard load equals the whole-model
  load bit for bit for a dense and a MoE checkpoint on several meshes, each block is read exactly once (bytes read ==
  the tensors' bytes on disk), every state leaf has its planned sharding and none the plan shards is whole on a
  device, the jitted init's output shardings are the plan's, and a resumed TrainerCore keeps them without reading
  the base weights.
- Two processes x 2 devices (``python -m scalerl_jax.launch``): each reads only about half of the checkpoint.
- ``--resume`` with every checkpoint corrupted stops naming each checkpoint, metrics.jsonl byte-identical; a fresh
  start in a directory holding an earlier run is refused, ``--overwrite`` deletes what it names.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scalerl_jax.experiments.store import check_run_dir

from scalerl_jax.config import ConfigError
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]


def test_state_is_born_sharded_on_eight_devices(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_state_init_check.py"), str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    core = out.pop("trainer_core")
    assert len(out) == 7
    for case, res in out.items():
        assert res["equal"] and res["placed"] and res["state_ok"] and res["compiled_out_ok"], (case, res)
        assert res["bytes_read"] == res["bytes_on_disk"], (case, res)  # every block read once, replicas share it
    assert core == {"fresh_ok": True, "resume_ok": True, "restored_step": 0, "base_bytes_read_on_resume": 0}


def test_two_processes_each_read_only_their_blocks(tmp_path):
    import dataclasses

    import jax
    import numpy as np

    from scalerl_jax.models import init_params, save_hf_checkpoint, tiny

    cfg = dataclasses.replace(tiny(), n_heads=4, n_kv_heads=4, vocab_size=32, d_model=64, head_dim=16, ffn_dim=128,
                              n_layers=2)
    save_hf_checkpoint(jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0))), cfg, tmp_path / "ck",
                       max_shard_bytes=20000)
    r = subprocess.run([sys.executable, "-m", "scalerl_jax.launch", "--processes", "2", "--cpu-devices", "2",
                        "--log-dir", str(tmp_path / "logs"), "--", "tests._hf_sharded_mp_check", str(tmp_path / "ck")],
                       cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in r.stdout.splitlines() if "RESULT " in line]
    assert sorted(x["process"] for x in rows) == [0, 1]
    disk = rows[0]["bytes_on_disk"]
    # the mesh shards every matrix over fsdp=4 (2 devices per process): each process reads its half of every matrix
    # and the (small) replicated norms whole, so a little over half of the checkpoint, and together all of it
    norms = (2 * 2 + 1) * 64 * 4
    for x in rows:
        assert x["equal"] and x["local_devices"] == 2
        assert x["bytes_read"] == (disk - norms) // 2 + norms, x
    assert sum(x["bytes_read"] for x in rows) >= disk


# ---- resumes never lose data -------------------------------------------------------------------------------


def _run(args: list[str], timeout: int = HANG_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.math_8b", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_resume_with_every_checkpoint_corrupt_stops_and_keeps_metrics(smoke_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert steps
    for step in steps:  # truncate every array file of the state to half: unreadable or failing its checksum
        for f in (run / "checkpoints" / str(step) / "state").rglob("*"):
            if f.is_file() and f.stat().st_size > 64 and "metadata" not in f.name.lower():
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    before = (run / "metrics.jsonl").read_bytes()
    r = _run(["--preset", "smoke", "--out", str(run), "--resume", "--no-fit", "--steps", "40"])
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    for step in steps:
        assert f"step {step}:" in r.stderr, r.stderr[-2000:]
    assert "metrics.jsonl was left as it was" in r.stderr
    assert (run / "metrics.jsonl").read_bytes() == before


def test_fresh_start_in_a_used_directory_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n{"kind": "eval", "step": 1}\n')
    before = (tmp_path / "metrics.jsonl").read_bytes()
    r = _run(["--preset", "smoke", "--out", str(tmp_path), "--no-fit"], timeout=HANG_S)
    assert r.returncode == 2 and "metrics.jsonl with 2 rows" in r.stderr and "--overwrite" in r.stderr, r.stderr
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    # --resume without any checkpoint to continue from: refused the same way
    with pytest.raises(ConfigError, match="no checkpoint to continue from"):
        check_run_dir(tmp_path, resume=True, overwrite=False, log=lambda s: None)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_overwrite_deletes_what_it_names(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "report.md").write_text("old")
    (tmp_path / "warmstart").mkdir()
    said: list[str] = []
    check_run_dir(tmp_path, resume=False, overwrite=True, log=said.append)
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "report.md").exists() and (tmp_path / "warmstart").is_dir()  # the base model stays
    assert "metrics.jsonl" in said[0] and "checkpoints" in said[0] and "report.md" in said[0]
    # an empty directory (or a new one) needs nothing
    check_run_dir(tmp_path, resume=False, overwrite=False)
    check_run_dir(tmp_path, resume=True, overwrite=False)


@pytest.mark.parametrize("mode, want", [("newest", {"restored": 1}), ("all", None)])
def test_processes_restore_the_same_checkpoint_or_fail_together(tmp_path, mode, want):
    """Process 1 alone cannot read checkpoint 2 (``newest``) or any (``all``): both processes fall back to step 1
    together, or both stop with a ResumeError naming process 1's reason for each step; none hangs."""
    r = subprocess.run([sys.executable, "-m", "scalerl_jax.launch", "--processes", "2", "--cpu-devices", "2",
                        "--log-dir", str(tmp_path / "logs"), "--", "tests._restore_agree_check", str(tmp_path / "run"),
                        mode], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    rows = {x["process"]: x for x in (json.loads(line.split("RESULT ", 1)[1]) for line in r.stdout.splitlines()
                                      if "RESULT " in line)}
    assert sorted(rows) == [0, 1]
    if want is not None:
        assert all({k: v for k, v in x.items() if k != "process"} == want for x in rows.values()), rows
    else:
        for x in rows.values():
            assert "step 2: process 1: OSError: injected read error of step 2" in x["error"], x
            assert "step 1: process 1: OSError: injected read error of step 1" in x["error"], x
