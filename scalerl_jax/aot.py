"""Ahead-of-time proof: lower and compile the RL train step for a real preset on an abstract mesh.

No weights are allocated: params, optimiser state and the batch are ShapeDtypeStructs. On a CPU-only
machine the mesh is made of simulated devices, so the command sets
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX is imported::

    python -m scalerl_jax.aot --preset llama3_8b --devices 16 --seq-len 16384
    python -m scalerl_jax.aot --preset llama3_8b --devices 16 32 64 --seq-len 16384   # table
    python -m scalerl_jax.aot --preset scout_17b16e --devices 16 --seq-len 16384 --microbatches 2

It prints per-device bytes from ``compiled.memory_analysis()`` next to the analytic split (params,
optimiser state) and checks them against a GB200's 186 GB of HBM.
"""

from __future__ import annotations

import argparse
import os
import sys


def _peek_devices(argv: list[str]) -> int:
    """The largest ``--devices`` value (the values up to the next option only: ``--seq-len 16384`` after
    ``--devices 16`` must not ask XLA for 16,384 simulated devices)."""
    for i, a in enumerate(argv):
        if a == "--devices":
            vals = []
            for x in argv[i + 1 :]:
                if not x.isdigit():
                    break
                vals.append(int(x))
            return max(vals, default=16)
        if a.startswith("--devices="):
            return int(a.split("=", 1)[1])
    return 16


# XLA:CPU emulates bfloat16: it upcasts the bf16 stack of saved layer inputs ([L, B, T, D], what remat keeps)
# and its while-loop-invariant code motion then hoists that upcast out of the backward loop, holding a float32
# copy of every layer's input (16 GiB per device for Scout at 16k tokens, 8 GiB for the 8B). GPU and TPU
# compilers keep the bf16 slices native, so the simulated-device estimate turns that pass off unless
# --cpu-licm is given (BUILD.md lists both numbers).
CPU_AOT_XLA_FLAGS = "--xla_disable_hlo_passes=while-loop-invariant-code-motion"

if __name__ == "__main__":  # must happen before jax is imported
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_peek_devices(sys.argv)}"
        + ("" if "--cpu-licm" in sys.argv else " " + CPU_AOT_XLA_FLAGS)
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import LossConfig, MeshConfig, ModelConfig, TrainConfig  # noqa: E402
from scalerl_jax.models.presets import get_preset  # noqa: E402
from scalerl_jax.train import make_optimizer, make_train_step, state_shardings  # noqa: E402
from scalerl_jax.train.rl import abstract_batch, rl_loss  # noqa: E402

GB200_HBM_BYTES = 186e9
GiB = 2**30


def _sharded_bytes(abstract, shardings) -> int:
    total = 0
    for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
        total += int(np.prod(s.shard_shape(a.shape))) * np.dtype(a.dtype).itemsize
    return total


def aot_compile(
    model_cfg: ModelConfig, n_devices: int, *, seq_len: int, mesh_cfg: MeshConfig | None = None,
    loss_cfg: LossConfig | None = None, train_cfg: TrainConfig | None = None, seqs_per_shard: int = 1,
    microbatches: int = 1, logp_chunk: int = 1024,
) -> dict:
    """Compile the RL train step abstractly and return a memory report (bytes per device).

    The global batch is ``microbatches x (data*fsdp*expert shards) x seqs_per_shard`` sequences of ``seq_len``
    tokens; gradient accumulation runs the micro-batches in a ``lax.scan`` so activation memory is that
    of one micro-batch.
    """
    mesh_cfg = mesh_cfg or MeshConfig(fsdp=-1)
    loss_cfg = loss_cfg or LossConfig()
    train_cfg = train_cfg or TrainConfig(microbatches=microbatches)
    mesh = shd.abstract_mesh(mesh_cfg, n_devices)
    dp = mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]  # the batch axes (ShardingRules.batch)
    global_batch = microbatches * dp * seqs_per_shard
    opt = make_optimizer(train_cfg)
    abstract_state, state_sh = state_shardings(model_cfg, opt, mesh)
    batch = abstract_batch(global_batch, seq_len)
    batch_sh = shd.batch_shardings(batch, mesh)
    step = make_train_step(rl_loss(model_cfg, loss_cfg, logp_chunk=logp_chunk), opt, microbatches)

    def traced(state, b):
        with shd.use_mesh(mesh):
            return step(state, b)

    jitted = jax.jit(traced, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, shd.replicated(mesh)),
                     donate_argnums=(0,))
    t0 = time.perf_counter()
    lowered = jitted.lower(abstract_state, batch)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    params_b = _sharded_bytes(abstract_state.params, state_sh.params)
    opt_b = _sharded_bytes(abstract_state.opt_state, state_sh.opt_state)
    batch_b = _sharded_bytes(batch, batch_sh)
    arg = int(mem.argument_size_in_bytes)
    out = int(mem.output_size_in_bytes)
    alias = int(mem.alias_size_in_bytes)
    temp = int(mem.temp_size_in_bytes)
    peak = arg + out - alias + temp
    return {
        "devices": n_devices, "mesh": dict(mesh.shape), "seq_len": seq_len, "global_batch": global_batch,
        "microbatches": microbatches, "params_bytes": params_b, "opt_state_bytes": opt_b, "batch_bytes": batch_b,
        "argument_bytes": arg, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp,
        "peak_bytes": peak, "fits_gb200": peak < 0.9 * GB200_HBM_BYTES, "lower_s": t1 - t0, "compile_s": t2 - t1,
        "n_params": model_cfg.num_params(),
    }


def format_table(reports: list[dict]) -> str:
    head = ("devices", "mesh", "batch", "params GiB", "opt GiB", "temp (act.) GiB", "peak GiB", "GB200 186GB", "compile s")
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in reports:
        mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1)
        rows.append(" | ".join([
            str(r["devices"]), mesh, f"{r['global_batch']}x{r['seq_len']}", f"{r['params_bytes'] / GiB:.2f}",
            f"{r['opt_state_bytes'] / GiB:.2f}", f"{r['temp_bytes'] / GiB:.2f}", f"{r['peak_bytes'] / GiB:.2f}",
            "fits" if r["fits_gb200"] else "DOES NOT FIT", f"{r['compile_s']:.1f}",
        ]))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3_8b",
                    help="model preset (tiny, llama_100m, llama3_8b, tiny_moe, scout_17b16e)")
    ap.add_argument("--devices", type=int, nargs="+", default=[16], help="simulated device counts to compile for")
    ap.add_argument("--seq-len", type=int, default=16384, help="tokens per sequence (paper: 16,384)")
    ap.add_argument("--tensor", type=int, default=1, help="tensor-parallel axis size (the rest is fsdp)")
    ap.add_argument("--expert", type=int, default=None,
                    help="expert-parallel axis size (MoE presets; default: min(n_experts, devices))")
    ap.add_argument("--capacity-factor", type=float, default=None,
                    help="MoE all-to-all capacity factor (default: the preset's; None = dropless)")
    ap.add_argument("--microbatches", type=int, default=1, help="gradient-accumulation steps in the compiled step")
    ap.add_argument("--seqs-per-shard", type=int, default=1, help="sequences per data shard per micro-batch")
    ap.add_argument("--json", help="also write the reports to this JSON file")
    ap.add_argument("--cpu-licm", action="store_true", help="keep XLA:CPU's while-loop-invariant code motion (off by "
                    "default: it hoists a float32 copy of the saved bf16 layer inputs that accelerators never make)")
    args = ap.parse_args(argv)
    cfg = get_preset(args.preset)
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, args.seq_len))
    if args.capacity_factor is not None:
        cfg = dataclasses.replace(cfg, moe_capacity_factor=args.capacity_factor)
    reports = []
    for n in args.devices:
        ep = 1
        if cfg.arch == "llama4":
            ep = args.expert or max(d for d in range(1, min(cfg.n_experts, n // args.tensor) + 1)
                                    if cfg.n_experts % d == 0 and (n // args.tensor) % d == 0)
        r = aot_compile(cfg, n, seq_len=args.seq_len, mesh_cfg=MeshConfig(fsdp=-1, tensor=args.tensor, expert=ep),
                        microbatches=args.microbatches, seqs_per_shard=args.seqs_per_shard)
        reports.append(r)
        print(f"[aot] {args.preset} on {n} devices: peak {r['peak_bytes'] / GiB:.2f} GiB/device, "
              f"compiled in {r['compile_s']:.1f}s", flush=True)
    print(format_table(reports))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(reports, f, indent=2)
    return 0 if all(r["fits_gb200"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
