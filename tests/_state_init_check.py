"""Run in a subprocess with 8 simulated CPU devices: the train state born sharded.

For a dense Llama and a Llama-4 MoE checkpoint (safetensors written by ``save_hf_checkpoint``, split over several
files) and several meshes: the per-shard load equals the whole-model load bit for bit, every block is read once
(bytes read == the tensors' bytes on disk), every state leaf has its planned sharding, the init is one jitted
computation whose output shardings are the plan's, and a TrainerCore saved and resumed keeps those shardings.
Prints one JSON line.
"""

import os
import sys

import chex

chex.set_n_cpu_devices(8)
os.environ["JAX_PLATFORMS"] = "cpu"

import dataclasses  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import ExperimentConfig, MeshConfig, RolloutConfig, TrainConfig  # noqa: E402
from scalerl_jax.models import init_params, load_hf_checkpoint, save_hf_checkpoint, tiny  # noqa: E402
from scalerl_jax.models.hf_sharded import ReadStats, load_hf_sharded  # noqa: E402
from scalerl_jax.train import make_optimizer, state_shardings  # noqa: E402
from scalerl_jax.train.state_init import init_sharded_state, init_state_fn  # noqa: E402

assert len(jax.devices()) == 8
tmp = Path(sys.argv[1])
out: dict = {}


def same_sharding(a: jax.Array, want) -> bool:
    return a.sharding.is_equivalent_to(want, a.ndim)


def sharded_where_planned(a: jax.Array, want) -> bool:
    """A leaf the plan shards is not held whole on any device."""
    planned_split = any(x is not None for x in want.spec)
    return not planned_split or not a.sharding.is_fully_replicated


def disk_bytes(path: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in path.glob("*.safetensors"):
        with safe_open(f, framework="numpy") as h:
            for k in h.keys():
                s = h.get_slice(k)
                total += int(np.prod(s.get_shape())) * {"F32": 4, "BF16": 2, "F16": 2}[s.get_dtype()]
    return total


dense = dataclasses.replace(tiny(), n_heads=4, n_kv_heads=2, vocab_size=24, d_model=32, head_dim=8, ffn_dim=64,
                            n_layers=3)
moe = dataclasses.replace(dense, arch="llama4", n_experts=4, expert_ffn_dim=16, moe_every=2, nope_every=2, top_k=1)
cases = {
    "dense_f32": (dense, "float32", "float32", [dict(fsdp=8), dict(fsdp=4, tensor=2), dict(data=2, fsdp=2, tensor=2),
                                                 dict(fsdp=2, tensor=4)]),
    "dense_bf16_file_f32_params": (dense, "bfloat16", "float32", [dict(fsdp=4, tensor=2)]),
    "moe_f32": (moe, "float32", "float32", [dict(fsdp=2, tensor=2, expert=2), dict(expert=4, tensor=2)]),
}
for name, (cfg, file_dtype, param_dtype, meshes) in cases.items():
    ckpt = tmp / name
    host = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(1), std=0.3))
    save_hf_checkpoint(host, cfg, ckpt, dtype=file_dtype, max_shard_bytes=6000)  # several files
    assert len(list(ckpt.glob("*.safetensors"))) > 1
    whole, ck_cfg = load_hf_checkpoint(ckpt, param_dtype=param_dtype)
    cfg_p = dataclasses.replace(cfg, param_dtype=param_dtype)
    opt = make_optimizer(TrainConfig())
    for m in meshes:
        mesh = shd.make_mesh(MeshConfig(**m))
        _, st_sh = state_shardings(cfg_p, opt, mesh)
        stats = ReadStats()
        params = load_hf_sharded(ckpt, cfg_p, st_sh.params, stats=stats)
        equal = all(np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
                    and np.asarray(a).dtype == np.asarray(b).dtype
                    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(whole), strict=True))
        placed = all(same_sharding(a, s) for a, s in zip(jax.tree.leaves(params), jax.tree.leaves(st_sh.params)))
        state = init_sharded_state(ckpt, cfg_p, opt, st_sh)
        state_ok = all(same_sharding(a, s) and sharded_where_planned(a, s)
                       for a, s in zip(jax.tree.leaves(state), jax.tree.leaves(st_sh)))
        # the init as compiled: one computation, its outputs on the plan's shardings
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params,
                                st_sh.params)
        compiled = init_state_fn(opt, st_sh).lower(abstract).compile()
        out_ok = all(c.is_equivalent_to(s, a.ndim) for c, s, a in zip(
            jax.tree.leaves(compiled.output_shardings), jax.tree.leaves(st_sh), jax.tree.leaves(state)))
        out[f"{name}/{'x'.join(f'{k}{v}' for k, v in m.items())}"] = {
            "equal": equal, "placed": placed, "state_ok": state_ok, "compiled_out_ok": out_ok,
            "bytes_read": stats.bytes_read, "bytes_on_disk": disk_bytes(ckpt)}

# a TrainerCore from an HF directory, saved, then resumed: the restored state keeps the plan's shardings
from scalerl_jax.train.core import TrainerCore  # noqa: E402

exp = ExperimentConfig(model=dense, mesh=MeshConfig(fsdp=4, tensor=2), out_dir=str(tmp / "run"),
                       rollout=RolloutConfig(prompts_per_batch=4, group_size=2, max_prompt_len=8, max_new_tokens=8))
core = TrainerCore(exp, tmp / "dense_f32", seq_len=16, pad_id=0, run_dir=exp.out_dir, log=lambda s: None)
fresh_ok = all(same_sharding(a, s) and sharded_where_planned(a, s)
               for a, s in zip(jax.tree.leaves(core.state), jax.tree.leaves(core.state_sh)))
core.save(0, {"step": 0})
core.wait()
core.close()
resumed = TrainerCore(exp, "/nonexistent-base-model-must-not-be-read", seq_len=16, pad_id=0, run_dir=exp.out_dir,
                      log=lambda s: None, resume=True)
resume_ok = all(same_sharding(a, s) and sharded_where_planned(a, s)
                for a, s in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(resumed.state_sh)))
out["trainer_core"] = {"fresh_ok": fresh_ok, "resume_ok": resume_ok, "restored_step": resumed.restored[0],
                       "base_bytes_read_on_resume": resumed.read_stats.bytes_read}
resumed.close()
print(json.dumps(out))
