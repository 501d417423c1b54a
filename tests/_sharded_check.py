"""Run in a subprocess with 8 simulated CPU devices: sharded forward / train step vs unsharded.

Prints one JSON line: {mesh: {"forward": max_abs_diff, "params": max_abs_diff, "loss": abs_diff, ...,
"tol": {the same keys: what float32 reordering can change, tests/tolerances.py}}}.
"""

import os

import chex

chex.set_n_cpu_devices(8)  # replaces any device count in XLA_FLAGS; raises if JAX has already started
os.environ["JAX_PLATFORMS"] = "cpu"

import dataclasses  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import LossConfig, MeshConfig, TrainConfig  # noqa: E402
from scalerl_jax.models import forward, init_params, tiny  # noqa: E402
from scalerl_jax.train import init_train_state, jit_train_step, make_optimizer, make_train_step, state_shardings  # noqa: E402
from scalerl_jax.train.rl import rl_loss  # noqa: E402
from tests.tolerances import train_steps_tol  # noqa: E402

assert len(jax.devices()) == 8
cfg = dataclasses.replace(tiny(), n_heads=4, n_kv_heads=2, vocab_size=24, attn_chunk=16)
params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0), std=0.1))  # host copy: donation must not eat it
B, T = 16, 32
rng = np.random.RandomState(0)
tokens = rng.randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
mask = np.zeros((B, T), np.float32)
mask[:, 8:] = 1.0
batch = {
    "tokens": tokens, "loss_mask": mask, "gen_logp": (mask * rng.uniform(-4, -0.5, (B, T))).astype(np.float32),
    "staleness": np.zeros((B, T), np.int32), "advantages": rng.randn(B).astype(np.float32),
    "rewards": np.sign(rng.randn(B)).astype(np.float32), "group_ids": (np.arange(B) // 4).astype(np.int32),
    "truncated": np.zeros(B, np.float32),
}
# Adam divides by sqrt(v): for near-zero gradients it turns reduction-order noise (1e-9) into full-size
# steps of either sign, so a tight parameter comparison needs a well-conditioned update. adam_eps=1 makes
# the update ~ lr * m (SGD with momentum) while exercising the same sharded step, optimiser state and all.
tcfg = TrainConfig(lr=1e-2, warmup_steps=0, weight_decay=0.01, adam_eps=1.0)
opt = make_optimizer(tcfg)
loss_fn = rl_loss(cfg, LossConfig(), logp_chunk=8)

ref_logits = np.asarray(forward(params, jnp.asarray(tokens), cfg))
ref_state, ref_m = jax.jit(make_train_step(loss_fn, opt))(init_train_state(params, opt), batch)
ref_state, ref_m2 = jax.jit(make_train_step(loss_fn, opt))(ref_state, batch)
tol = train_steps_tol(cfg, params, batch, ref_m, ref_logits, lr=tcfg.lr, steps=2)

out = {}
for shape in [dict(fsdp=4, tensor=2), dict(fsdp=8, tensor=1), dict(data=2, fsdp=2, tensor=2), dict(fsdp=2, tensor=4)]:
    mesh = shd.make_mesh(MeshConfig(**shape))
    _, st_sh = state_shardings(cfg, opt, mesh)
    state = jax.device_put(init_train_state(params, opt), st_sh)
    b_sh = shd.batch_shardings(batch, mesh)
    step = jit_train_step(make_train_step(loss_fn, opt), st_sh, b_sh, mesh)
    with shd.use_mesh(mesh):
        logits = jax.jit(lambda p, t: forward(p, t, cfg), in_shardings=(st_sh.params, b_sh["tokens"]))(
            state.params, jax.device_put(tokens, b_sh["tokens"]))
    state, m = step(state, jax.device_put(batch, b_sh))
    state, m2 = step(state, jax.device_put(batch, b_sh))
    sharded_dims = sum(any(ax is not None for ax in s.spec) for s in jax.tree.leaves(st_sh.params))
    out["x".join(f"{k}{v}" for k, v in shape.items())] = {
        "forward": float(np.abs(np.asarray(logits) - ref_logits).max()),
        "params": max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                      for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params))),
        "loss": abs(float(m2["loss"]) - float(ref_m2["loss"])),
        "grad_norm_rel": abs(float(m["grad_norm"]) - float(ref_m["grad_norm"])) / float(ref_m["grad_norm"]),
        "n_sharded_params": sharded_dims,
        "steps": int(state.step),
        "tol": tol,
    }
print(json.dumps(out))
