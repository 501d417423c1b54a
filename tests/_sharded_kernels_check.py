"""Run in a subprocess with 4 simulated CPU devices: an RL train step with the Pallas attention kernels (interpret
mode) under sharded meshes (the trainer's jit_train_step) vs the unsharded reference step.

Prints one JSON line: {case: {"loss", "grad_norm_rel", "params", "in_shard_map", ...}}.
"""

import os

import chex

chex.set_n_cpu_devices(4)  # replaces any device count in XLA_FLAGS; raises if JAX has already started
os.environ["JAX_PLATFORMS"] = "cpu"

import dataclasses  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import LossConfig, MeshConfig, TrainConfig  # noqa: E402
from scalerl_jax.models import init_params, tiny  # noqa: E402
from scalerl_jax.train import init_train_state, jit_train_step, make_optimizer, make_train_step, state_shardings  # noqa: E402
from scalerl_jax.train.rl import rl_loss  # noqa: E402
from tests.tolerances import train_steps_tol  # noqa: E402

assert len(jax.devices()) == 4


def pallas_calls(closed) -> dict:
    """pallas_call equations of a jaxpr (nested ones included), counted by whether a shard_map encloses them."""
    counts = {"inside": 0, "outside": 0}

    def walk(jaxpr, inside):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "pallas_call":
                counts["inside" if inside else "outside"] += 1
                continue
            for v in eqn.params.values():
                for sub in v if isinstance(v, (list, tuple)) else (v,):
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        walk(sub, inside or name == "shard_map")

    walk(closed.jaxpr, False)
    return counts

B, T = 8, 24  # T ragged against the attention kernel's 32-long blocks and longer than attn_chunk (flash path)
rng = np.random.RandomState(0)
LR = 1e-2
opt = make_optimizer(TrainConfig(lr=LR, warmup_steps=0, weight_decay=0.0, adam_eps=1.0))  # see _sharded_check
out = {}
for kv_heads in (2, 1):  # GQA: heads split with the tensor axis; MQA: one kv head, heads kept whole per device
    ref_cfg = dataclasses.replace(tiny(), n_heads=4, n_kv_heads=kv_heads, vocab_size=24, attn_chunk=8)
    ker_cfg = dataclasses.replace(ref_cfg, attention_impl="pallas")
    params = jax.tree.map(np.asarray, init_params(ref_cfg, jax.random.key(0), std=0.1))
    tokens = rng.randint(0, 24, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    mask[:, 5:] = 1.0
    mask[-1, 20:] = 0.0
    batch = {"tokens": tokens, "loss_mask": mask,
             "gen_logp": (mask * rng.uniform(-4, -0.5, (B, T))).astype(np.float32),
             "staleness": np.zeros((B, T), np.int32), "advantages": rng.randn(B).astype(np.float32),
             "rewards": np.sign(rng.randn(B)).astype(np.float32), "group_ids": (np.arange(B) // 4).astype(np.int32),
             "truncated": np.zeros(B, np.float32)}
    ref_state, ref_m = jax.jit(make_train_step(rl_loss(ref_cfg, LossConfig()), opt))(init_train_state(params, opt),
                                                                                     batch)
    # GQA over both meshes; MQA (heads cannot split alike) on the tensor mesh only
    for shape in (dict(fsdp=2, tensor=2), dict(fsdp=4, tensor=1))[:2 if kv_heads == 2 else 1]:
        mesh = shd.make_mesh(MeshConfig(**shape))
        _, st_sh = state_shardings(ker_cfg, opt, mesh)
        b_sh = shd.batch_shardings(batch, mesh)
        step = jit_train_step(make_train_step(rl_loss(ker_cfg, LossConfig()), opt), st_sh, b_sh, mesh)
        state0, batch0 = jax.device_put(init_train_state(params, opt), st_sh), jax.device_put(batch, b_sh)
        calls = pallas_calls(jax.make_jaxpr(step)(state0, batch0))  # the jitted step the trainer runs
        state, m = step(state0, batch0)
        out[f"kv{kv_heads}_" + "x".join(f"{k}{v}" for k, v in shape.items())] = {
            "loss": abs(float(m["loss"]) - float(ref_m["loss"])),
            "loss_ref": float(ref_m["loss"]),
            "grad_norm_rel": abs(float(m["grad_norm"]) - float(ref_m["grad_norm"])) / float(ref_m["grad_norm"]),
            "params": max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                          for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params))),
            "update": max(float(np.abs(np.asarray(a) - p).max())
                          for a, p in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(params))),
            # every pallas_call sits inside a shard_map (the kernels see their own rows, not gathered operands)
            "pallas_calls": calls,
            # what float32 reordering can change (tests/tolerances.py)
            "tol": train_steps_tol(ref_cfg, params, batch, ref_m, lr=LR, steps=1),
        }

print(json.dumps(out))
