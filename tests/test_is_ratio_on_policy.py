"""On the first on-policy step the trainer's token importance ratios are 1: the generator's recorded log-probs and
the trainer's recomputation agree position by position (an off-by-one between them, or a temperature applied on one
side only, shows up here). A tiny RLTrainer (tests/_trainer_driver.py, embedded engine) runs one PPO-off-policy
step with k = 1 at temperature 0.7 and top-p 0.9 (the recorded log-prob is the untruncated tempered one, which is
what the trainer recomputes); the logged ``is_ratio_*`` statistics of that step must be 1 within what two float32
orderings of the model can change a log-prob by (tests/tolerances.py). The same
batch with its gen-logprob array shifted by one position gives ratios far from 1, computed directly from
``scalerl_jax.losses.token_logprobs`` and through the loss's own metrics, so the check has teeth.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.losses import token_logprobs
from scalerl_jax.metrics import read_metrics
from scalerl_jax.models import forward_hidden, head_weight, init_params
from scalerl_jax.train.rl import rl_loss
from tests._trainer_driver import build_trainer, enable_compile_cache, make_exp
from tests.tolerances import max_logit, model_logprob_tol, reorder_rel

TEMP, TOP_P = 0.7, 0.9


@pytest.fixture(scope="module", autouse=True)
def _compile_cache():
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    old = {k: getattr(jax.config, k) for k in names}
    enable_compile_cache()
    yield
    for k, v in old.items():
        jax.config.update(k, v)


def _plain_rows(batch: dict, layout) -> dict:
    """The trainer's batch as plain rows (each completion right after its prompt), whatever layout the trainer wrote
    (``TrainerCore.prefix_layout``: (P, n) when completions start at column P, scalerl_jax/train/rl.py), so that the
    recomputations here read every row as one causal sequence."""
    if layout is None:
        return batch
    P = layout[0]
    out = {k: np.array(v) for k, v in batch.items()}
    for r, plen in enumerate(np.asarray(batch["prompt_len"])):
        for k in ("tokens", "loss_mask", "gen_logp", "staleness"):
            row = np.zeros_like(out[k][r])
            row[:plen] = batch[k][r][:plen]
            row[plen : plen + row.size - P] = batch[k][r][P:]
            out[k][r] = row
    return out


def _log_ratios(params, cfg, batch: dict) -> np.ndarray:
    """log pi_train(token t) - gen_logp[t] on the loss-masked positions, recomputed here: position t - 1's
    hidden state predicts token t."""
    tokens = jnp.asarray(batch["tokens"])
    h = forward_hidden(params, tokens[:, :-1], cfg)
    logp, _ = token_logprobs(h, head_weight(params, cfg), tokens[:, 1:], head_dtype=cfg.head_dtype, temperature=TEMP)
    used = np.asarray(batch["loss_mask"])[:, 1:] > 0
    return (np.asarray(logp) - np.asarray(batch["gen_logp"])[:, 1:])[used]


def _tol(params, cfg, batch) -> float:
    """The generator's decode and the trainer's forward pass: two float32 orderings of the model, whose log-probs
    differ by at most this (tests/tolerances.py)."""
    tokens = np.asarray(batch["tokens"])
    return model_logprob_tol(cfg, tokens.shape[1], max_logit(params, cfg, tokens) / TEMP)


def test_first_on_policy_step_has_unit_importance_ratios(tmp_path):
    exp = make_exp(mode="ppo_off_policy", k=1, steps=1, npr=False)
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, temperature=TEMP, top_p=TOP_P))
    # std 0.1 rather than the near-uniform 0.02 default: neighbouring positions' log-probs then differ clearly
    params = jax.tree.map(np.asarray, init_params(exp.model, jax.random.key(0), std=0.1))
    seen = []

    def on_batch(step, rb, batch, stats):  # before the update: the params are the ones that generated the batch
        seen.append((step, _plain_rows(batch.as_dict(), trainer.core.prefix_layout),
                     jax.device_get(trainer.state.params), rb))

    trainer, _ = build_trainer(tmp_path, exp, params=params, on_batch=on_batch)
    try:
        trainer.run()
    finally:
        trainer.close()
    (step, batch, step_params, rb), = seen
    assert step == 0
    assert {v for g in rb.groups for c in g for v in c.versions} == {0}  # on-policy: all sampled by v0
    (row,) = read_metrics(tmp_path, "train")
    n_tok = int((batch["loss_mask"][:, 1:] > 0).sum())
    assert n_tok >= 20 and row["n_tokens"] == n_tok
    cfg = exp.model
    tol = _tol(step_params, cfg, batch)  # a log-ratio's bound; a ratio's is exp(tol) - 1, about as much
    for name in ("is_ratio_mean", "is_ratio_max", "is_ratio_min", "seq_ratio_mean"):
        assert abs(row[name] - 1.0) <= np.expm1(tol) * (1 + reorder_rel(n_tok)), (name, row[name], tol)
    assert row["logp_diff_abs_mean"] <= tol and row["is_ratio_std"] <= np.expm1(tol), (row, tol)

    # the same ratios recomputed here from token_logprobs: 1 within that on every trained token
    lr = _log_ratios(step_params, cfg, batch)
    assert lr.size == n_tok and np.abs(lr).max() <= tol
    # teeth: gen_logp shifted one position to the right (the log-prob of token t stored at t + 1) is far off
    shifted = dict(batch, gen_logp=np.roll(batch["gen_logp"], 1, axis=1))
    lr_shift = _log_ratios(step_params, cfg, shifted)
    assert np.abs(lr_shift).max() > 0.5 and np.abs(lr_shift).mean() > 0.1, np.abs(lr_shift).max()
    # ... and the loss's own logged statistics would show it
    loss_fn = jax.jit(rl_loss(cfg, exp.loss, temperature=TEMP))
    _, m_ok = loss_fn(step_params, {k: jnp.asarray(v) for k, v in batch.items()})
    _, m_shift = loss_fn(step_params, {k: jnp.asarray(v) for k, v in shifted.items()})
    for name in ("is_ratio_max", "is_ratio_min"):
        assert abs(float(m_ok[name]) - 1) <= np.expm1(tol), (name, float(m_ok[name]), tol)
    assert float(m_shift["is_ratio_max"]) > 1.5 or float(m_shift["is_ratio_min"]) < 0.67


def test_bf16_generators_show_their_mismatch_in_the_logged_statistics(tmp_path):
    """rollout.generator_dtype = bfloat16 (as SGLang serves) against a float32 trainer: the first on-policy
    step's logged mismatch equals |log pi_f32 - gen_logp| recomputed here from the float32 model, and is
    clearly above what float32 orderings alone could make (the float32-generator case's bound, above) while small
    (the same policy)."""
    exp = make_exp(mode="ppo_off_policy", k=1, steps=1, npr=False)
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, temperature=TEMP, top_p=TOP_P,
                                                               generator_dtype="bfloat16"))
    params = jax.tree.map(np.asarray, init_params(exp.model, jax.random.key(0), std=0.1))
    seen = []

    def on_batch(step, rb, batch, stats):
        seen.append((_plain_rows(batch.as_dict(), trainer.core.prefix_layout), jax.device_get(trainer.state.params)))

    trainer, engine = build_trainer(tmp_path, exp, params=params, on_batch=on_batch)
    try:
        assert engine.cfg.dtype == "bfloat16" and engine.cfg.head_dtype == "float32"
        trainer.run()
    finally:
        trainer.close()
    (batch, step_params), = seen
    (row,) = read_metrics(tmp_path, "train")
    lr = _log_ratios(step_params, exp.model, batch)  # float32 trainer vs the bf16 generator's records
    # above what float32 orderings alone could make, and small (the same policy: the one-position shift above moves
    # log-probs by over 0.5)
    tol = _tol(step_params, exp.model, batch)
    print(f"bf16 generator: mean |log-ratio| {np.abs(lr).mean():.2e}, float32's bound {tol:.2e}")
    assert tol < np.abs(lr).mean() < 0.2, (np.abs(lr).mean(), tol)
    # the trainer's own float32 log-probs and these: each |log-ratio| within tol, their mean's sum reordered
    n = lr.size
    assert row["logp_diff_abs_mean"] == pytest.approx(np.abs(lr).mean(), rel=reorder_rel(n), abs=tol)
    ratios = np.exp(lr)
    assert row["is_ratio_std"] == pytest.approx(ratios.std(), rel=reorder_rel(n), abs=2 * np.expm1(tol) * ratios.max())
