"""A tiny RLTrainer for the trainer tests, and a command-line driver that runs one (for kill/resume tests).

The model is a one-layer, 32-wide Llama over the 17-token character vocabulary; each batch is 4 prompts x 4
samples of at most 6 new tokens. The default scorer is independent of the task: a completion gets +1 iff its
first character has an even token id, so a random-init policy already produces informative groups.

Driver usage (a subprocess the tests can SIGKILL):

    python -m tests._trainer_driver RUN_DIR --mode ppo_off_policy --k 2 --steps 12 --checkpoint-every 2 [--resume]

writes RUN_DIR/final_params.npz (flattened params, keys = tree paths) when the run finishes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

from scalerl_jax.config import (
    DataConfig,
    ExperimentConfig,
    LengthConfig,
    LossConfig,
    MeshConfig,
    RolloutConfig,
    TrainConfig,
    generator_model,
)
from scalerl_jax.data.pipeline import PromptData
from scalerl_jax.data.tasks import Problem, arith_split
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.models import init_params
from scalerl_jax.models.presets import tiny
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.train.trainer import RLTrainer

TOK = CharTokenizer()
SEQ_LEN = 16  # prompts are at most 8 characters ("99+99*9="), completions at most 6 tokens
MAX_NEW = 6


def model_cfg():
    return dataclasses.replace(tiny(), d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
                               max_seq_len=32)


def even_first_token_score(texts: Sequence[str], problems: Sequence[Problem]) -> tuple[np.ndarray, dict]:
    """+1 iff the completion's first character has an even token id (independent of the arithmetic)."""
    r = [1.0 if t and TOK.encode(t[0])[0] % 2 == 0 else -1.0 for t in texts]
    return np.asarray(r, np.float32), {"timeouts": 0, "no_answer": 0}


def make_exp(*, mode: str = "ppo_off_policy", k: int = 1, steps: int = 6, eval_every: int = 1000,
             checkpoint_every: int = 1000, keep: int = 3, seed: int = 0, npr: bool = True, lr: float = 3e-3,
             decode_chunk: int = 2, prompts: int = 4, group: int = 4) -> ExperimentConfig:
    return ExperimentConfig(
        name="trainer_test", model=model_cfg(), mesh=MeshConfig(fsdp=-1),
        loss=LossConfig(kind="cispo", eps_max=5.0, aggregation="prompt", normalization="batch",
                        filter_zero_variance=True),
        rollout=RolloutConfig(mode=mode, k=k, prompts_per_batch=prompts, group_size=group, temperature=1.0,
                              max_prompt_len=8, max_new_tokens=MAX_NEW, decode_chunk=decode_chunk,
                              length=LengthConfig(kind="none")),
        data=DataConfig(source="arith", val_size=8, seed=seed, npr=npr, npr_threshold=0.9),
        train=TrainConfig(lr=lr, warmup_steps=0, schedule="constant", adam_eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                          steps=steps, eval_every=eval_every, eval_samples=2, checkpoint_every=checkpoint_every,
                          keep_checkpoints=keep, seed=seed),
    )


def make_data(n_train: int = 64, n_val: int = 8, seed: int = 0) -> PromptData:
    train, val = arith_split(n_train, n_val, seed)
    return PromptData(train=train, val=val, seed=seed)


def build_trainer(run_dir, exp: ExperimentConfig, *, data: PromptData | None = None, score: Callable | None = None,
                  wrap_generator: Callable | None = None, on_batch=None, resume: bool = False,
                  params=None, log=lambda s: None) -> tuple[RLTrainer, JaxEngine]:
    """(trainer, the inner training engine). ``wrap_generator(engine)`` may return a wrapper generator."""
    mcfg = exp.model
    data = data or make_data(seed=exp.data.seed)
    if params is None:
        params = jax.tree.map(np.asarray, init_params(mcfg, jax.random.key(exp.train.seed)))
    rows = exp.rollout.prompts_per_batch * exp.rollout.group_size
    gen_cfg = generator_model(exp)  # the run path's rule: rollout.generator_dtype over the trainer's model
    engine = JaxEngine(gen_cfg, params, max_batch=rows, max_len=SEQ_LEN, decode_chunk=exp.rollout.decode_chunk,
                       seed=exp.train.seed)
    # same batch bucket as the training engine, so both share one compiled prefill/decode
    eval_engine = JaxEngine(gen_cfg, params, max_batch=rows, max_len=SEQ_LEN,
                            decode_chunk=exp.rollout.decode_chunk, seed=exp.train.seed + 1)
    gen = wrap_generator(engine) if wrap_generator else engine
    trainer = RLTrainer(exp, params, data=data, encode=TOK.encode, decode=TOK.decode,
                        score=score or even_first_token_score, pad_id=TOK.pad_id, eos_ids=tuple(TOK.stop_ids),
                        generator=gen, eval_generator=eval_engine, length=None, seq_len=SEQ_LEN, run_dir=run_dir,
                        resume=resume, log=log, on_batch=on_batch)
    return trainer, engine


def flat_params(params) -> dict[str, np.ndarray]:
    """Params as {tree path: numpy array} (host copies)."""
    leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]
    return {jax.tree_util.keystr(p): np.array(x) for p, x in leaves}


def enable_compile_cache(path: str | os.PathLike | None = None) -> None:
    """Share compiled XLA programs between the many small trainers (and subprocesses) of the tests."""
    path = (path or os.environ.get("SCALERL_TEST_JAX_CACHE") or os.environ.get("JAX_COMPILATION_CACHE_DIR")
            or "/tmp/scalerl_test_jax_cache")
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--mode", default="ppo_off_policy")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=24)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--hold-at-step", type=int, default=None,
                    help="when the train step after step N begins, write RUN_DIR/holding and wait there to be killed "
                         "(kill tests: a SIGKILL mid-run at a known point, however fast the machine)")
    a = ap.parse_args(argv)
    enable_compile_cache()
    exp = make_exp(mode=a.mode, k=a.k, steps=a.steps, eval_every=4, checkpoint_every=a.checkpoint_every, keep=10)
    # no live forecast: nothing here reads it, and its refit process (a JAX start-up and a NUTS compile per run) and
    # its wait for the last eval's refit at the end would only make these runs depend on a quiet machine
    exp = dataclasses.replace(exp, forecast=dataclasses.replace(exp.forecast, enabled=False))
    trainer, _ = build_trainer(a.run_dir, exp, data=make_data(n_train=a.n_train), resume=a.resume,
                               log=lambda s: print(s, flush=True))
    print(f"[driver] resumed_from {trainer.resumed_from}", flush=True)
    if a.hold_at_step is not None:
        import time

        inner = trainer.core.step_fn

        def step_fn(state, batch):
            if int(state.step) == a.hold_at_step:
                (Path(a.run_dir) / "holding").write_text(str(a.hold_at_step))
                while True:
                    time.sleep(60)
            return inner(state, batch)

        trainer.core.step_fn = step_fn
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    np.savez(Path(a.run_dir) / "final_params.npz", **flat_params(trainer.state.params))
    print(f"[driver] done: {summary['steps']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
