"""RLTrainer: PipelineRL-k staleness bound, PPO-off-policy-k rounds, zero-variance filtering, NPR, NaN skips.

Every test builds a tiny trainer directly (tests/_trainer_driver.py: a 1-layer model, 4 prompts x 4 samples, 6
new tokens) and observes it from outside: the generator is wrapped, the scorer is the test's own, and every
batch handed to the train step is seen through ``RLTrainer(on_batch=...)``. Expected values come from those
observations (token versions recorded by the engine, rewards the test's scorer gave), not from the trainer.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

import jax
import numpy as np
import pytest

from scalerl_jax.metrics import read_metrics
from scalerl_jax.rollout.protocol import INJECTED_VERSION
from tests._trainer_driver import (
    TOK,
    build_trainer,
    enable_compile_cache,
    even_first_token_score,
    flat_params,
    make_data,
    make_exp,
)


@pytest.fixture(scope="module", autouse=True)
def _compile_cache():
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    old = {k: getattr(jax.config, k) for k in keys}
    enable_compile_cache()
    yield
    for k, v in old.items():
        jax.config.update(k, v)


class RecordingGenerator:
    """Wraps a JaxEngine: records every generate call and weight push, optionally sleeps and edits outputs."""

    def __init__(self, engine, *, rng=None, max_sleep=0.0, edit=None, events=None):
        self.engine, self.rng, self.max_sleep, self.edit = engine, rng, max_sleep, edit
        self.events = events if events is not None else []
        self.calls = 0
        self.pushes: list[int] = []
        self._lock = threading.Lock()

    def _nap(self):
        if self.max_sleep:
            time.sleep(float(self.rng.uniform(0, self.max_sleep)))

    def generate(self, requests):
        self._nap()
        with self._lock:
            self.events.append(("gen", self.engine.weight_version, [r.meta["prompt_id"] for r in requests]))
        out = self.engine.generate(requests)
        self._nap()
        if self.edit is not None:
            self.edit(self.calls, out)
        self.calls += 1
        return out

    def update_weights(self, weights, version):
        self.pushes.append(int(version))
        self.engine.update_weights(weights, version)

    def reseed(self, seed):
        self.engine.reseed(seed)

    @property
    def weight_version(self):
        return self.engine.weight_version


def slow_down_steps(trainer, rng, max_sleep):
    inner = trainer.core.step_fn

    def step(state, batch):
        time.sleep(float(rng.uniform(0, max_sleep)))
        return inner(state, batch)

    trainer.core.step_fn = step


def token_versions(rb) -> np.ndarray:
    return np.asarray([v for g in rb.groups for c in g for v, inj in zip(c.versions, c.injected) if not inj], int)


def row_prompt_ids(batch, rb) -> list[int | None]:
    """The prompt of every row of a TrainBatch, recognised from its leading tokens (None for padding rows)."""
    enc = {p.prompt_id: TOK.encode(p.prompt) for p in rb.problems}
    out = []
    for row in np.asarray(batch.tokens):
        # unambiguous: a prompt holds exactly one "=", at its end
        hit = [pid for pid, ids in enc.items() if list(row[: len(ids)]) == ids]
        out.append(hit[0] if hit else None)
    return out


def run_trainer(tmp_path, exp, **kw):
    trainer, engine = build_trainer(tmp_path, exp, **kw)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    return trainer, engine, summary


# ---- PipelineRL-k: staleness ----------------------------------------------------------------------------------


@pytest.mark.parametrize("k,seed", [(1, 0), (2, 1)])
def test_pipeline_staleness_never_exceeds_k(tmp_path, k, seed):
    rng = np.random.default_rng(seed)
    seen = []
    gen = {}

    def wrap(engine):
        # random pauses inside generation too (between decode chunks), so weights land mid-sequence
        engine.chunk_hook = lambda ci: time.sleep(float(rng.uniform(0, 0.004)))
        gen["g"] = RecordingGenerator(engine, rng=rng, max_sleep=0.03)
        return gen["g"]

    def on_batch(step, rb, batch, stats):
        seen.append((step, rb.index, token_versions(rb), batch))

    steps = 14
    exp = make_exp(mode="pipeline", k=k, steps=steps, eval_every=100, seed=seed, npr=False, decode_chunk=2)
    trainer, _engine = build_trainer(tmp_path, exp, wrap_generator=wrap, on_batch=on_batch)
    slow_down_steps(trainer, rng, 0.05)
    try:
        summary = trainer.run()
    finally:
        trainer.close()

    assert [s for s, *_ in seen] == list(range(steps)), "every update step trains exactly one batch, in order"
    max_stale = 0
    for step, index, versions, batch in seen:
        assert versions.size > 0
        assert versions.min() >= 0 and versions.max() <= step, (step, versions)
        assert step - versions.min() <= k, f"step {step}: a token from version {versions.min()} (k={k})"
        max_stale = max(max_stale, step - int(versions.min()))
        # the batch's staleness field agrees with the engine's version tags on every trained token
        used = np.asarray(batch.loss_mask) > 0
        assert np.asarray(batch.staleness)[used].max() <= k
    assert max_stale >= 1, "the generator never ran ahead: the test did not exercise staleness"
    assert summary["dropped_stale_batches"] == 0  # the throttle, not the drop, is what keeps staleness <= k
    rows = read_metrics(tmp_path, "train")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(0 <= r["batch_staleness"] <= k for r in rows)
    # weights went out after every update, tagged with the step count
    assert gen["g"].pushes[: steps + 1] == list(range(steps + 1))


def test_pipeline_batch_versions_mix_in_flight(tmp_path):
    """In-flight updates: a completion being generated when the trainer's update arrives carries two versions. The
    generator is held two tokens into its second batch until the trainer's first update has been pushed (the engine
    applies it at the next chunk boundary), so the mix does not depend on the generator being the slower of the two
    on this machine."""
    multi = []
    held = threading.Event()

    def wrap(engine):
        g = RecordingGenerator(engine)

        def hold(ci):
            if g.calls == 1 and ci == 2 and not held.is_set():  # batch 1 (batch 0 is the trainer's first), mid-way
                held.set()
                deadline = time.monotonic() + 600  # a hang guard: the trainer's first step
                while len(g.pushes) < 2:  # v0 at the start, then the first update
                    assert time.monotonic() < deadline, "the trainer pushed no update while the generator waited"
                    time.sleep(0.01)

        engine.chunk_hook = hold
        return g

    def on_batch(step, rb, batch, stats):
        multi.extend(len(set(c.versions) - {INJECTED_VERSION}) > 1 for g in rb.groups for c in g)

    exp = make_exp(mode="pipeline", k=2, steps=8, npr=False, decode_chunk=1)
    run_trainer(tmp_path, exp, wrap_generator=wrap, on_batch=on_batch)
    assert held.is_set() and any(multi), "no completion saw a weight update mid-sequence"


# ---- PPO-off-policy-k: rounds ---------------------------------------------------------------------------------


def test_ppo_off_policy_trains_k_minibatches_per_round(tmp_path):
    k, rounds = 3, 3
    events: list = []
    gen = {}

    def wrap(engine):
        gen["g"] = RecordingGenerator(engine, events=events)
        return gen["g"]

    def on_batch(step, rb, batch, stats):
        events.append(("train", step, token_versions(rb)))

    exp = make_exp(mode="ppo_off_policy", k=k, steps=k * rounds, npr=False)
    run_trainer(tmp_path, exp, wrap_generator=wrap, on_batch=on_batch)

    kinds = "".join("g" if e[0] == "gen" else "t" for e in events)
    assert kinds == ("g" * k + "t" * k) * rounds, kinds
    for r in range(rounds):
        gens = events[2 * k * r : 2 * k * r + k]
        trains = events[2 * k * r + k : 2 * k * (r + 1)]
        assert [g[1] for g in gens] == [k * r] * k, "every batch of a round is sampled by the round's first policy"
        for j, (_, step, versions) in enumerate(trains):
            assert step == k * r + j
            assert set(versions.tolist()) == {k * r}
            assert step - versions.min() == j  # batch j of a round is j versions stale
    # the generator is updated once per round, not after every minibatch
    assert gen["g"].pushes == [k * r for r in range(rounds + 1)]
    rows = read_metrics(tmp_path, "train")
    assert [r["batch_staleness"] for r in rows] == list(range(k)) * rounds


# ---- zero-variance filtering and No-Positive-Resampling ----------------------------------------------------------


def test_a_compacted_size_compiles_beside_the_loop(tmp_path):
    """prepare_rows compiles in a background thread, once per size; a failed compile is reported."""
    exp = make_exp(mode="ppo_off_policy", k=1, steps=1, seed=3)
    logs = []
    trainer, _ = build_trainer(tmp_path, exp, log=logs.append)
    try:
        assert trainer.core.row_quantum == 4 and sorted(trainer.core._compiled) == []
        trainer.core.prepare_rows(8)
        trainer.core.prepare_rows(8)  # once
        trainer.core.prepare_rows(16)  # the full batch: jit's own
        trainer.core._compile_pool.shutdown(wait=True)
        assert sorted(trainer.core._compiled) == [8]
        assert sum("compiled for compacted batches of 8 rows" in m for m in logs) == 1
        real = trainer.core.step_fn

        class Broken:
            def lower(self, *a):
                raise RuntimeError("no such program")

        trainer.core.step_fn = Broken()
        trainer.core._compile_rows(12)
        trainer.core.step_fn = real
        assert sorted(trainer.core._compiled) == [8]
        assert any("12 rows did not compile in the background (RuntimeError: no such program)" in m for m in logs)
    finally:
        trainer.close()


def test_which_size_a_step_uses_does_not_depend_on_how_fast_it_compiles(tmp_path, monkeypatch):
    """A size is used from ROW_SIZE_LEAD steps after a batch first wants it, however long its compile takes (the
    loop waits for a late one): a run with compiles slowed by 3 s each trains the same rows and the same numbers,
    bit for bit, as one without."""
    from scalerl_jax.train import core as core_mod
    from scalerl_jax.train.trainer import ROW_SIZE_LEAD

    def run(sub, delay):
        real = core_mod.TrainerCore._compile_rows

        def slow(self, rows):
            time.sleep(delay)
            return real(self, rows)

        monkeypatch.setattr(core_mod.TrainerCore, "_compile_rows", slow)
        exp = make_exp(mode="ppo_off_policy", k=2, steps=14, seed=7, npr=False)
        _, _, summary = run_trainer(tmp_path / sub, exp, score=even_first_token_score)
        rows = read_metrics(tmp_path / sub, "train")
        return [(r["train_rows"], r["loss"], r["n_filtered_groups"]) for r in rows], summary

    fast, _ = run("fast", 0.0)
    slow, _ = run("slow", 3.0)
    assert fast == slow
    sizes = [n for n, _, _ in fast]
    assert min(sizes) < 16, sizes  # some steps were compacted
    # no compacted size before ROW_SIZE_LEAD steps have passed
    assert all(n == 16 for n in sizes[:ROW_SIZE_LEAD]), sizes


def test_a_resume_restores_the_size_schedule_its_batches_can_take(tmp_path):
    exp = make_exp(mode="ppo_off_policy", k=1, steps=2, checkpoint_every=2, seed=3)
    trainer, _ = build_trainer(tmp_path, exp)
    try:
        trainer.size_from = {4: 90, 8: 30, 12: 50}  # later than this run's steps: none used, all kept
        trainer.run()
    finally:
        trainer.close()
    for buckets, want in ((8, {4: 90, 8: 30, 12: 50}), (2, {8: 30}), (1, {})):  # quantum 4, 8, none
        again = dataclasses.replace(exp, train=dataclasses.replace(exp.train, row_buckets=buckets, steps=3))
        trainer, _ = build_trainer(tmp_path, again, resume=True)
        try:
            assert trainer.resumed_from == 2 and trainer.size_from == want, buckets
        finally:
            trainer.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_compile_thread_yields_the_cpu_and_the_loop_keeps_its_priority():
    import os

    from scalerl_jax.train.core import COMPILE_NICE, _yield_cpu

    seen = {}

    def body():
        _yield_cpu()
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen["thread"] == max(COMPILE_NICE, before) and COMPILE_NICE == 10
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_zero_variance_groups_and_npr_removed_prompts_never_reach_the_loss(tmp_path):
    """Prompts with id % 3 == 0 are always solved (zero variance, then removed by NPR), id % 3 == 1 never solved
    (zero variance, filtered forever); the rest get the random even-first-token reward."""
    graded: list[tuple[int, float]] = []  # (prompt id, reward) of every training sample, in order
    drawn: list[list[int]] = []  # prompt ids of every training generate call
    trained = []

    data = make_data(n_train=12, n_val=8, seed=5)
    train_ids = {p.prompt_id for p in data.train}
    assert {i % 3 for i in train_ids} == {0, 1, 2}

    def score(texts, problems):
        base, counts = even_first_token_score(texts, problems)
        r = np.where([p.prompt_id % 3 == 0 for p in problems], 1.0,
                     np.where([p.prompt_id % 3 == 1 for p in problems], -1.0, base)).astype(np.float32)
        graded.extend((p.prompt_id, float(x)) for p, x in zip(problems, r) if p.prompt_id in train_ids)
        return r, counts

    def wrap(engine):
        g = RecordingGenerator(engine)
        orig = g.generate

        def generate(requests):
            drawn.append([r.meta["prompt_id"] for r in requests])
            return orig(requests)

        g.generate = generate
        return g

    def on_batch(step, rb, batch, stats):
        trained.append((step, rb, batch))

    steps = 9
    exp = make_exp(mode="ppo_off_policy", k=1, steps=steps, npr=True, seed=5)
    trainer, _ = build_trainer(tmp_path, exp, data=data, score=score, wrap_generator=wrap, on_batch=on_batch)
    try:
        trainer.size_from = {4: 0, 8: 0, 12: 0}  # every compacted size in use from the first step
        summary = trainer.run()
    finally:
        trainer.close()

    # 1. rows of zero-variance groups carry no loss: the compacted batch (TrainConfig.row_buckets: 16 rows in
    # steps of 4, a group) leaves them out, and any that stay (none here) would have mask 0 and advantage 0;
    # informative groups do train
    G = exp.rollout.group_size
    assert exp.train.row_buckets == 8
    for step, rb, batch in trained:
        # a prompt may be drawn twice into one batch: it is zero-variance only if every one of its groups is
        informative_ids = {p.prompt_id for p, r in zip(rb.problems, rb.rewards) if not np.all(r == r[0])}
        zero_var = {p.prompt_id for p in rb.problems} - informative_ids
        pids = row_prompt_ids(batch, rb)
        mask, adv = np.asarray(batch.loss_mask), np.asarray(batch.advantages)
        for i, pid in enumerate(pids):
            if pid is None:
                assert mask[i].sum() == 0
            elif pid in zero_var:
                assert mask[i].sum() == 0 and adv[i] == 0, (step, pid)
        informative = [p.prompt_id for p in rb.problems if p.prompt_id not in zero_var]
        for pid in informative:
            assert sum(mask[i].sum() for i, q in enumerate(pids) if q == pid) > 0
        n_informative = sum(not np.all(r == r[0]) for r in rb.rewards)
        assert sum(q is not None for q in pids) == n_informative * G, (step, pids)
        assert len(pids) == max(4, -(-n_informative * G // 4) * 4), (step, len(pids), n_informative)

    # 2. metrics count the filtered groups per batch (train and all-filtered "error" rows alike)
    rows = [r for r in read_metrics(tmp_path) if r["kind"] in ("train", "error")]
    assert len(rows) == len(drawn)
    n_seen = 0
    removed: set[int] = set()
    hist: dict[int, list[int]] = {}
    removed_at: dict[int, int] = {}
    for call, (ids, row) in enumerate(zip(drawn, rows)):
        batch_grades = graded[n_seen : n_seen + len(ids) * G]
        n_seen += len(ids) * G
        # graded is problem-major (G samples per drawn prompt); by position, since a prompt may be drawn twice
        assert [q for q, _ in batch_grades] == [pid for pid in ids for _ in range(G)]
        groups = [[r for _, r in batch_grades[j * G: (j + 1) * G]] for j in range(len(ids))]
        assert row["n_filtered_groups"] == sum(len(set(g)) == 1 for g in groups)
        for pid, g in zip(ids, groups):
            c = hist.setdefault(pid, [0, 0])
            c[0] += sum(x > 0 for x in g)
            c[1] += len(g)
            if pid not in removed and c[0] / c[1] >= 0.9:
                removed.add(pid)
                removed_at[pid] = call
        assert row["npr_removed"] == len(removed)
    assert summary["filtered_groups"] == sum(r["n_filtered_groups"] for r in rows)
    trained_rows = {step: int(np.asarray(batch.tokens).shape[0]) for step, _, batch in trained}
    assert any(n < exp.rollout.prompts_per_batch * G for n in trained_rows.values())  # compaction happened
    assert [r["train_rows"] for r in rows if r["kind"] == "train"] == [trained_rows[r["step"] - 1] for r in rows
                                                                        if r["kind"] == "train"]
    assert summary["npr"]["n_removed"] == len(removed)
    assert {i for i in train_ids if i % 3 == 0} <= removed and not any(i % 3 == 1 for i in removed)

    # 3. a removed prompt is never drawn again (k = 1: every draw after its removal is in a later epoch)
    for pid, call in removed_at.items():
        assert all(pid not in ids for ids in drawn[call + 1 :]), pid
    counts = {}
    for ids in drawn:
        for pid in ids:
            counts[pid] = counts.get(pid, 0) + 1
    assert max(counts.values()) >= 2, "the run never reached a second epoch"


# ---- non-finite inputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["logprobs", "reward", "logprobs_device_check"])
def test_nan_input_skips_the_step_bit_for_bit(tmp_path, monkeypatch, where):
    poison_call = 1  # the second training batch
    snapshots = []  # (row, full state as numpy) after every metrics row

    def edit(call, out):
        if where.startswith("logprobs") and call == poison_call:
            for g in out:
                for c in g:
                    c.logprobs[0] = float("nan")

    calls = [0]

    def score(texts, problems):
        r, counts = even_first_token_score(texts, problems)
        if where == "reward" and problems[0].prompt_id in train_ids:
            if calls[0] == poison_call:
                r[3] = np.nan
            calls[0] += 1
        return r, counts

    if where == "logprobs_device_check":  # let the NaN through the host check: the jitted step must skip it
        import scalerl_jax.train.trainer as trainer_mod

        monkeypatch.setattr(trainer_mod, "batch_is_finite", lambda batch: True)

    data = make_data(n_train=32, n_val=8, seed=2)
    train_ids = {p.prompt_id for p in data.train}
    exp = make_exp(mode="ppo_off_policy", k=1, steps=3, npr=False, seed=2)
    trainer, _ = build_trainer(tmp_path, exp, data=data, score=score,
                               wrap_generator=lambda e: RecordingGenerator(e, edit=edit))
    write = trainer.metrics.write

    def spy(row):
        write(row)
        snapshots.append((row, flat_params(trainer.state)))

    trainer.metrics.write = spy
    init = flat_params(trainer.state)
    try:
        summary = trainer.run()
    finally:
        trainer.close()

    rows = [r for r, _ in snapshots if r["kind"] in ("train", "error")]
    kinds = [r["kind"] for r in rows]
    assert kinds == ["train", "error", "train", "train"], kinds
    err_i = [i for i, (r, _) in enumerate(snapshots) if r["kind"] == "error"]
    assert len(err_i) == 1
    err_row, after = snapshots[err_i[0]]
    assert "non-finite" in err_row["reason"]
    assert err_row["step"] == 1
    # the state right after the skipped batch equals the state after the previous update, bit for bit
    before = [s for r, s in snapshots[: err_i[0]] if r["kind"] == "train"][-1]
    assert before.keys() == after.keys()
    for key in before:
        assert np.array_equal(before[key], after[key]), key
    assert not all(np.array_equal(init[k_], before[k_]) for k_ in init), "the first update changed nothing"
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3]
    assert summary["skipped_steps"] == 1


# ---- batches that make no update -------------------------------------------------------------------------------


def test_pipeline_continues_past_batches_without_update(tmp_path):
    """The first 2k+2 training batches score -1 everywhere (every group zero-variance filtered: consumed, no update).
    The producer's throttle must not wait for versions that those batches never create (it deadlocked once), and
    every trained token still respects the staleness bound."""
    k, steps = 2, 6
    n_dead = 2 * k + 2
    calls = {"train": 0}
    seen = []
    data = make_data(seed=0)
    train_ids = {p.prompt_id for p in data.train}

    def score(texts, problems):
        r, counts = even_first_token_score(texts, problems)
        if problems and problems[0].prompt_id in train_ids:
            calls["train"] += 1
            if calls["train"] <= n_dead:
                r = -np.ones_like(r)
        return r, counts

    def on_batch(step, rb, batch, stats):
        seen.append((step, token_versions(rb)))

    exp = make_exp(mode="pipeline", k=k, steps=steps, npr=False)
    trainer, _engine = build_trainer(tmp_path, exp, data=data, score=score, on_batch=on_batch)
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("summary", trainer.run()), daemon=True)
    t.start()
    t.join(timeout=240)
    trainer.close()
    assert not t.is_alive(), "the pipeline deadlocked after batches that made no update"
    assert done["summary"]["steps"] == steps and done["summary"]["empty_batches"] >= n_dead
    assert [s for s, _ in seen] == list(range(steps))
    assert all(step - v.min() <= k for step, v in seen)


def test_a_run_that_can_never_update_stops_with_a_clear_error(tmp_path, monkeypatch):
    from scalerl_jax.train.trainer import RLTrainer

    monkeypatch.setattr(RLTrainer, "MAX_BATCHES_WITHOUT_UPDATE", 5)
    exp = make_exp(mode="pipeline", k=1, steps=4, npr=False)
    trainer, _engine = build_trainer(tmp_path, exp, score=lambda texts, problems: (
        -np.ones(len(texts), np.float32), {"timeouts": 0, "no_answer": 0}))
    try:
        with pytest.raises(RuntimeError, match="5 consecutive rollout batches made no update"):
            trainer.run()
    finally:
        trainer.close()
