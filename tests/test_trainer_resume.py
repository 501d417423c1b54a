"""RLTrainer checkpoints: SIGKILL mid-run and resume (PPO-off-policy, bit-identical to an uninterrupted run), and a
corrupted newest checkpoint skipped in favour of the previous one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from scalerl_jax.metrics import read_metrics
from tests._trainer_driver import build_trainer, enable_compile_cache, flat_params, make_data, make_exp
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
STEPS, K, CKPT_EVERY, EVAL_EVERY = 16, 2, 4, 4


@pytest.fixture(scope="module", autouse=True)
def _compile_cache():
    old = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                               "jax_persistent_cache_min_compile_time_secs",
                                               "jax_persistent_cache_min_entry_size_bytes")}
    enable_compile_cache()
    yield
    for k, v in old.items():
        jax.config.update(k, v)


def _driver(run_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests._trainer_driver", str(run_dir), "--mode", "ppo_off_policy", "--k", str(K),
           "--steps", str(STEPS), "--checkpoint-every", str(CKPT_EVERY), *extra]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(run_dir.with_suffix(".log"), "ab"),
                            stderr=subprocess.STDOUT)


def _committed_checkpoints(run_dir: Path) -> list[int]:
    d = run_dir / "checkpoints"
    if not d.exists():
        return []
    # orbax writes into a temporary directory and renames it to the bare step number once complete
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / "_CHECKPOINT_METADATA").exists())


def _train_steps(run_dir: Path) -> list[int]:
    try:
        return [r["step"] for r in read_metrics(run_dir, "train")]
    except (FileNotFoundError, ValueError):  # ValueError: a half-written last line
        return []


HOLD = 7  # the victim is killed in the train step after step 7: mid-round (K = 2), past the step-4 checkpoint
# the runs below wait on tests.conftest.HANG_S, a hang guard (a driver run: start-up, compile or cache load and 16
# steps take under a minute on an idle 2-core machine; the two first runs share it), not a speed limit


@pytest.mark.lane  # three driver processes, a minute or more: in the background lane (tests/conftest.py)
def test_sigkill_and_resume_is_contiguous_and_bit_identical(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    full.mkdir()
    killed.mkdir()
    ref = _driver(full)
    # the victim stops itself at a known point and waits there for the SIGKILL: no race with its own progress
    victim = _driver(killed, "--hold-at-step", str(HOLD))
    try:
        deadline = time.monotonic() + HANG_S
        while not ((killed / "holding").exists() and CKPT_EVERY in _committed_checkpoints(killed)):
            assert victim.poll() is None, "the run ended before it could be killed: " + \
                killed.with_suffix(".log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the victim did not reach its hold point and its first checkpoint"
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        victim.wait(HANG_S)
        at_kill = max(_train_steps(killed))
        assert at_kill == HOLD and not (killed / "final_params.npz").exists()
        assert ref.wait(HANG_S) == 0, full.with_suffix(".log").read_text()[-2000:]
    finally:
        for p in (ref, victim):
            if p.poll() is None:
                p.kill()

    resumed = _driver(killed, "--resume")
    assert resumed.wait(HANG_S) == 0, killed.with_suffix(".log").read_text()[-3000:]
    log = killed.with_suffix(".log").read_text()
    line = [ln for ln in log.splitlines() if ln.startswith("[driver] resumed_from")][-1]
    resumed_from = int(line.split()[-1])
    assert resumed_from % K == 0 and CKPT_EVERY <= resumed_from <= at_kill

    # metrics.jsonl: every train step exactly once, evals exactly at their steps, one summary
    rows = read_metrics(killed)
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, STEPS + 1))
    assert [r["step"] for r in rows if r["kind"] == "eval"] == list(range(0, STEPS + 1, EVAL_EVERY))
    assert [r["kind"] for r in rows].count("summary") == 1
    assert not [r for r in rows if r["kind"] == "error"]

    # the same run as the uninterrupted one: per-step rewards, filtered groups, the curriculum's removals and the
    # loss are equal, so the prompt stream, curriculum, RNG and optimiser state all came back
    ref_rows = read_metrics(full)
    for a, b in zip([r for r in ref_rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "train"]):
        for key in ("step", "reward_mean", "pass_rate", "n_filtered_groups", "npr_removed", "loss", "grad_norm",
                    "completion_len", "batch_staleness"):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    ref_sum, sum_ = ref_rows[-1], rows[-1]
    for key in ("steps", "gen_tokens", "flops_train", "flops_gen", "filtered_groups", "skipped_steps",
                "empty_batches", "npr"):
        assert ref_sum[key] == sum_[key], (key, ref_sum[key], sum_[key])  # counters restored, not restarted
    assert sum_["compute_s"] > 0

    # parameters bit-identical to the uninterrupted run
    a, b = np.load(full / "final_params.npz"), np.load(killed / "final_params.npz")
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        assert np.array_equal(a[key], b[key]), key


def _largest_file(d: Path) -> Path:
    return max((p for p in d.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["flip_bytes", "truncate", "extras"])
def test_corrupted_latest_checkpoint_falls_back_to_previous(tmp_path, damage):
    data = make_data(n_train=24, n_val=8)
    exp = make_exp(mode="ppo_off_policy", k=1, steps=4, checkpoint_every=2, keep=5)
    trainer, _ = build_trainer(tmp_path, exp, data=data)
    saved = {}
    save = trainer.core.ckpt.save

    def spy(step, state, extras):
        saved[step] = flat_params(state)
        save(step, state, extras)

    trainer.core.ckpt.save = spy
    try:
        trainer.run()
    finally:
        trainer.close()
    assert sorted(saved) == [2, 4]

    newest = tmp_path / "checkpoints" / "4"
    if damage == "flip_bytes":  # silent corruption: orbax itself restores this without complaint
        f = _largest_file(newest / "state")
        raw = bytearray(f.read_bytes())
        for i in range(len(raw) // 3, len(raw) // 3 + 32):
            raw[i] ^= 0xFF
        f.write_bytes(bytes(raw))
    elif damage == "truncate":
        f = _largest_file(newest / "state")
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:
        (newest / "extras" / "metadata").write_text('{"step": 4, "data": ')

    with pytest.warns(UserWarning, match=r"checkpoints/4 could not be restored"):
        resumed, _ = build_trainer(tmp_path, exp, data=data, resume=True)
    try:
        assert resumed.resumed_from == 2
        got = flat_params(resumed.state)
        assert got.keys() == saved[2].keys()
        for key in got:
            assert np.array_equal(got[key], saved[2][key]), key
        # metrics rolled back to the checkpoint, then the run continues without gaps
        assert [r["step"] for r in read_metrics(tmp_path, "train")] == [1, 2]
        resumed.run()
    finally:
        resumed.close()
    assert [r["step"] for r in read_metrics(tmp_path, "train")] == [1, 2, 3, 4]


def test_ppo_checkpoints_continue_after_a_skipped_update(tmp_path):
    """A skipped update leaves the step count off a multiple of k; round-boundary checkpoints must go on."""

    class PoisonFirstBatch:
        def __init__(self, engine):
            self.engine, self.calls = engine, 0

        def generate(self, requests):
            out = self.engine.generate(requests)
            if self.calls == 0:
                for g in out:
                    for c in g:
                        c.logprobs[0] = float("nan")
            self.calls += 1
            return out

        def update_weights(self, weights, version):
            self.engine.update_weights(weights, version)

        def reseed(self, seed):
            self.engine.reseed(seed)

        @property
        def weight_version(self):
            return self.engine.weight_version

    exp = make_exp(mode="ppo_off_policy", k=2, steps=6, checkpoint_every=2, keep=10)
    trainer, _ = build_trainer(tmp_path, exp, wrap_generator=PoisonFirstBatch)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    assert summary["skipped_steps"] == 1
    # rounds end at steps 1, 3, 5, 6 (the last one cut short); checkpoints whenever a multiple of 2 was crossed
    assert _committed_checkpoints(tmp_path) == [3, 5, 6]


def test_pipeline_checkpoint_keeps_the_prompts_still_in_flight(tmp_path):
    """PipelineRL generates up to k + 1 batches ahead of the trainer. A checkpoint must store the prompt stream's
    position after the batches the trainer consumed, not after those drawn, or a resume skips the in-flight ones."""
    exp = make_exp(mode="pipeline", k=2, steps=4, checkpoint_every=4, npr=False)
    data = make_data(n_train=64)  # 64 prompts: the run stays inside the first epoch
    trainer, _ = build_trainer(tmp_path, exp, data=data)
    inner, ppb, calls = trainer.core.step_fn, exp.rollout.prompts_per_batch, [0]

    def step_once_generation_ran_ahead(state, batch):
        # each step waits (on the prompt stream, not on a clock) until the generator has drawn a batch past the one
        # being trained, so batches are in flight whatever the machine's speed
        calls[0] += 1
        deadline = time.monotonic() + HANG_S
        while trainer.prompts.get_state()["position"] <= calls[0] * ppb and time.monotonic() < deadline:
            time.sleep(0.01)
        return inner(state, batch)

    trainer.core.step_fn = step_once_generation_ran_ahead
    try:
        s = trainer.run()
        drawn = trainer.prompts.get_state()["position"]
    finally:
        trainer.close()
    consumed = s["steps"] + s["dropped_stale_batches"] + s["skipped_steps"] + s["empty_batches"]
    assert s["steps"] == 4 and drawn > consumed * ppb, (drawn, consumed)  # batches were in flight at the end

    ref = data.train_iterator(None)  # an independent iterator over the same stream, advanced by what was trained
    ref.next_batch(consumed * ppb)
    resumed, _ = build_trainer(tmp_path, exp, data=data, resume=True)
    try:
        assert resumed.resumed_from == 4
        assert resumed.prompts.get_state() == ref.get_state()
        assert [p.prompt_id for p in resumed.prompts.next_batch(ppb)] == [p.prompt_id for p in ref.next_batch(ppb)]
    finally:
        resumed.close()
