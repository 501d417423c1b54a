"""Run in a subprocess with 4 simulated CPU devices: Qwen checkpoints read per shard.

For random Qwen2, Qwen3 and Qwen3-MoE checkpoints written by transformers (``argv[1]``: a scratch directory) and
several meshes: the per-shard load (``load_hf_sharded``) equals the whole-model load bit for bit, and every block is
read once (bytes read == the tensors' bytes on disk). Then Qwen3-MoE's feed-forward through the expert-parallel
dispatch (shard_map + all_to_all + ragged_dot on an fsdp x expert mesh) against the dense dispatch, output and
gradients. Prints one JSON line {case: {"equal", "bytes_read", "bytes_on_disk"}, "ep": {"out", "grad"}, "ep_tol":
{"out", "grad"}} (ep: max relative differences; ep_tol: what float32 reordering can change, tests/tolerances.py).
"""

import os
import sys

import chex

chex.set_n_cpu_devices(4)
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import MeshConfig, TrainConfig  # noqa: E402
from scalerl_jax.models import load_hf_checkpoint  # noqa: E402
from scalerl_jax.models.hf_sharded import ReadStats, load_hf_sharded  # noqa: E402
from scalerl_jax.train import make_optimizer, state_shardings  # noqa: E402
from tests.hf_models import make_hf_qwen  # noqa: E402
from tests.tolerances import moe_layer_rel, reorder_rel  # noqa: E402

assert len(jax.devices()) == 4
tmp = Path(sys.argv[1])
out = {}
models = {"qwen2": dict(tied=False), "qwen3": dict(tied=True, head_dim=32),
          "qwen3_moe": dict(layers=3, mlp_only=(1,), experts=4, top_k=2)}
meshes = {"fsdp4": MeshConfig(fsdp=4), "fsdp2_tp2": MeshConfig(fsdp=2, tensor=2),
          "fsdp2_ep2": MeshConfig(fsdp=2, expert=2)}
for arch, kw in models.items():
    make_hf_qwen(tmp / arch, arch, kv_heads=2, **kw)
    whole, cfg = load_hf_checkpoint(tmp / arch)
    disk = sum(np.asarray(w).nbytes for w in jax.tree.leaves(whole))
    for mname, mesh_cfg in meshes.items():
        if mname.endswith("ep2") and arch != "qwen3_moe":
            continue
        mesh = shd.make_mesh(mesh_cfg)
        _, st_sh = state_shardings(cfg, make_optimizer(TrainConfig()), mesh)
        stats = ReadStats()
        params = load_hf_sharded(tmp / arch, cfg, st_sh.params, stats=stats)
        equal = all(np.array_equal(np.asarray(s.data), np.asarray(w)[s.index])
                    for a, w in zip(jax.tree.leaves(params), jax.tree.leaves(whole), strict=True)
                    for s in a.addressable_shards)
        out[f"{arch}/{mname}"] = {"equal": bool(equal), "bytes_read": stats.bytes_read, "bytes_on_disk": int(disk)}

import dataclasses  # noqa: E402

import jax.numpy as jnp  # noqa: E402

from scalerl_jax.models.moe import moe_ffn, moe_specs  # noqa: E402

cfg = dataclasses.replace(cfg, dtype="float32")  # the Qwen3-MoE checkpoint, loaded last
mp = jax.tree.map(lambda a: jnp.asarray(a[0]), {k: whole["moe"][k] for k in whole["moe"]})
rng = np.random.RandomState(0)
h, ct = rng.randn(8, 6, cfg.d_model).astype(np.float32), rng.randn(8, 6, cfg.d_model).astype(np.float32)


def loss(c):
    return jax.value_and_grad(lambda h, mp: jnp.sum(moe_ffn(h, mp, c)[0] * ct), argnums=(0, 1))


ref_l, ref_g = jax.jit(loss(dataclasses.replace(cfg, moe_impl="dense")))(h, mp)
mesh = shd.make_mesh(MeshConfig(fsdp=2, expert=2))
w_sh = {k: jax.sharding.NamedSharding(mesh, shd.logical_to_spec(moe_specs(cfg, 1)[k].axes[1:], a.shape, mesh))
        for k, a in mp.items()}
x_sh = jax.sharding.NamedSharding(mesh, shd.logical_to_spec(("batch", "seq", None), h.shape, mesh))
with shd.use_mesh(mesh):
    f = jax.jit(loss(cfg), in_shardings=(x_sh, w_sh))
    assert "all-to-all" in f.lower(h, mp).compile().as_text()  # the expert-parallel path, not a fallback
    ep_l, ep_g = f(jax.device_put(h, x_sh), jax.device_put(mp, w_sh))
# the layer's output may move by moe_layer_rel of its largest entry in either dispatch; the objective sums its
# products with ct (which cancel: the bound is relative to the sum of the terms' absolute values, not to the sum)
y = np.asarray(jax.jit(lambda h, mp: moe_ffn(h, mp, dataclasses.replace(cfg, moe_impl="dense"))[0])(h, mp), np.float64)
n_tok = h.shape[0] * h.shape[1]
out["ep_tol"] = {"out": (moe_layer_rel(cfg, n_tok) * np.abs(y).max() * np.abs(ct).sum()
                         + reorder_rel(y.size) * np.abs(y * ct).sum()) / abs(float(ref_l)),
                 "grad": moe_layer_rel(cfg, n_tok, backward=True)}
out["ep"] = {"out": abs(float(ep_l) - float(ref_l)) / abs(float(ref_l)),
             "grad": max(float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())
                         for a, b in zip(jax.tree.leaves(ep_g), jax.tree.leaves(ref_g)))}
print(json.dumps(out), flush=True)
