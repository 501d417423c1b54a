"""Ahead-of-time proof: lower and compile the RL train step for a real preset on an abstract mesh.

No weights are allocated: params, optimiser state and the batch are ShapeDtypeStructs. On a CPU-only
machine the mesh is made of simulated devices, so the command sets
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX is imported::

    python -m scalerl_jax.aot --preset llama3_8b --devices 16 --seq-len 16384
    python -m scalerl_jax.aot --preset llama3_8b --devices 16 32 64 --seq-len 16384   # table
    python -m scalerl_jax.aot --preset scout_17b16e --devices 16 --seq-len 16384 --microbatches 2
    python -m scalerl_jax.aot --config runs/8b/dry_run/config.json --devices 16 --seq-len 16384

``--config`` takes a resolved ExperimentConfig (``dataclasses.asdict`` as JSON; ``experiments.math_8b --dry-run``
writes one): the model, loss, head dtype, optimiser, micro-batches, mesh and sampling temperature all come from
it, so the program compiled is the one the run would train with. Without it, ``--preset`` names a model preset
and the loss and optimiser are the defaults.

It prints per-device bytes from ``compiled.memory_analysis()`` for the train state's initialisation and for the
step, next to the analytic split (params, optimiser state), and checks both against ``--device-memory-gb``
(default: a GB200's 186 GB of HBM; ``--device-memory-gb 80`` for an H100, 141 for an H200).
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


# XLA's passes run as they would for a launch: nothing is turned off by default. (The estimate once needed
# XLA:CPU's while-loop-invariant code motion disabled: with a bf16 stack of saved layer inputs it hoisted a
# float32 upcast of all of them out of the backward loop, 160 GiB/device for Scout. The layers now save that stack
# as raw integer bits (models/layers.py remat_layer) and tie the weights to each micro-batch (train/step.py), and
# the number is within 2% either way.) --cpu-no-licm turns the pass off to compare.
NO_LICM_XLA_FLAGS = "--xla_disable_hlo_passes=while-loop-invariant-code-motion"

# Under ``python -m scalerl_jax.launch`` (JAX_COORDINATOR_ADDRESS set) the devices are the launcher's processes'
# devices (e.g. 4 processes x 4 = the 4 hosts x 4 GPUs of 16 GB200s): every process compiles the same program.
_MULTI = "JAX_COORDINATOR_ADDRESS" in os.environ
if __name__ == "__main__" and not _MULTI:  # must happen before jax is imported
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_peek_devices(sys.argv)}"
        + (" " + NO_LICM_XLA_FLAGS if "--cpu-no-licm" in sys.argv else "")
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import (  # noqa: E402
    ExperimentConfig,
    LossConfig,
    MeshConfig,
    ModelConfig,
    TrainConfig,
    from_dict,
)
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
    microbatches: int = 1, logp_chunk: int = 1024, temperature: float = 1.0,
    device_memory_gb: float = GB200_HBM_BYTES / 1e9,
) -> dict:
    """Compile the RL train step abstractly and return a memory report (bytes per device).

    The train state's initialisation (:func:`scalerl_jax.train.state_init.init_state_fn`: params placed on the
    mesh, Adam moments created by one jitted computation with the state's shardings) is compiled beside it:
    ``init_peak_bytes``. ``fits``: both peaks under 90 % of ``device_memory_gb``.

    The global batch is ``microbatches x (data*fsdp*expert shards) x seqs_per_shard`` sequences of ``seq_len``
    tokens; gradient accumulation runs the micro-batches in a ``lax.scan`` so activation memory is that
    of one micro-batch.
    """
    mesh_cfg = mesh_cfg or MeshConfig(fsdp=-1)
    loss_cfg = loss_cfg or LossConfig()
    train_cfg = dataclasses.replace(train_cfg or TrainConfig(), microbatches=microbatches)
    mesh = shd.abstract_mesh(mesh_cfg, n_devices)
    dp = mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]  # the batch axes (ShardingRules.batch)
    global_batch = microbatches * dp * seqs_per_shard
    opt = make_optimizer(train_cfg)
    abstract_state, state_sh = state_shardings(model_cfg, opt, mesh)
    batch = abstract_batch(global_batch, seq_len)
    batch_sh = shd.batch_shardings(batch, mesh)
    loss_fn = rl_loss(model_cfg, loss_cfg, temperature=temperature, logp_chunk=logp_chunk)
    step = make_train_step(loss_fn, opt, microbatches)

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
    init = init_memory(opt, abstract_state, state_sh)
    params_b = _sharded_bytes(abstract_state.params, state_sh.params)
    opt_b = _sharded_bytes(abstract_state.opt_state, state_sh.opt_state)
    batch_b = _sharded_bytes(batch, batch_sh)
    arg = int(mem.argument_size_in_bytes)
    out = int(mem.output_size_in_bytes)
    alias = int(mem.alias_size_in_bytes)
    temp = int(mem.temp_size_in_bytes)
    peak = arg + out - alias + temp
    cap = device_memory_gb * 1e9
    return {
        "devices": n_devices, "mesh": dict(mesh.shape), "seq_len": seq_len, "global_batch": global_batch,
        "microbatches": microbatches, "params_bytes": params_b, "opt_state_bytes": opt_b, "batch_bytes": batch_b,
        "argument_bytes": arg, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp,
        "peak_bytes": peak, "fits_gb200": peak < 0.9 * GB200_HBM_BYTES, "lower_s": t1 - t0, "compile_s": t2 - t1,
        "init_peak_bytes": init["peak_bytes"], "init_peak_gib_per_device": init["peak_bytes"] / GiB,
        "step_peak_gib_per_device": peak / GiB, "device_memory_gb": device_memory_gb,
        "fits": max(peak, init["peak_bytes"]) < 0.9 * cap,
        "n_params": model_cfg.num_params(), "loss": dataclasses.asdict(loss_cfg), "head_dtype": model_cfg.head_dtype,
        "dtype": model_cfg.dtype, "param_dtype": model_cfg.param_dtype, "temperature": temperature,
        "hlo_sha256": hashlib.sha256(lowered.as_text().encode()).hexdigest(),
    }


def init_memory(opt, abstract_state, state_sh) -> dict:
    """Peak bytes per device of the train state's initialisation, as compiled: its argument (the params' blocks,
    donated), its output (params, moments, step) and its temporaries."""
    from scalerl_jax.train.state_init import init_state_fn

    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state.params,
                          state_sh.params)
    mem = init_state_fn(opt, state_sh).lower(params).compile().memory_analysis()
    arg, out, alias, temp = (int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                             int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes))
    return {"argument_bytes": arg, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp,
            "peak_bytes": arg + out - alias + temp}


def format_table(reports: list[dict]) -> str:
    cap = reports[0]["device_memory_gb"] if reports else GB200_HBM_BYTES / 1e9
    head = ("devices", "mesh", "batch", "params GiB", "opt GiB", "temp (act.) GiB", "init peak GiB", "step peak GiB",
            f"{cap:g} GB device", "compile s")
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in reports:
        mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1)
        rows.append(" | ".join([
            str(r["devices"]), mesh, f"{r['global_batch']}x{r['seq_len']}", f"{r['params_bytes'] / GiB:.2f}",
            f"{r['opt_state_bytes'] / GiB:.2f}", f"{r['temp_bytes'] / GiB:.2f}",
            f"{r['init_peak_gib_per_device']:.2f}", f"{r['peak_bytes'] / GiB:.2f}",
            "fits" if r["fits"] else "DOES NOT FIT", f"{r['compile_s']:.1f}",
        ]))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3_8b",
                    help="model preset (tiny, llama_100m, llama3_8b, tiny_moe, scout_17b16e); ignored with --config")
    ap.add_argument("--config", default=None, metavar="JSON",
                    help="a resolved ExperimentConfig as JSON (dataclasses.asdict): compile its model, loss, head "
                         "dtype, optimiser, micro-batches, mesh and temperature instead of --preset's defaults")
    ap.add_argument("--devices", type=int, nargs="+", default=[16], help="simulated device counts to compile for")
    ap.add_argument("--seq-len", type=int, default=16384, help="tokens per sequence (paper: 16,384)")
    ap.add_argument("--tensor", type=int, default=None, help="tensor-parallel axis size (the rest is fsdp; default: "
                    "the config's, else 1)")
    ap.add_argument("--expert", type=int, default=None,
                    help="expert-parallel axis size (MoE presets; default: the config's, else min(n_experts, devices))")
    ap.add_argument("--capacity-factor", type=float, default=None,
                    help="MoE all-to-all capacity factor (default: the preset's; None = dropless)")
    ap.add_argument("--microbatches", type=int, default=None,
                    help="gradient-accumulation steps in the compiled step (default: the config's, else 1)")
    ap.add_argument("--seqs-per-shard", type=int, default=1, help="sequences per data shard per micro-batch")
    ap.add_argument("--device-memory-gb", type=float, default=GB200_HBM_BYTES / 1e9, metavar="M",
                    help="memory per device to check both peaks against (90 %% of it; default: a GB200's 186; "
                         "H100 80, H200 141)")
    ap.add_argument("--json", help="also write the reports to this JSON file")
    ap.add_argument("--cpu-no-licm", action="store_true", help="turn off XLA's while-loop-invariant code motion "
                    "(to compare: the default compiles with every pass, as a launch does)")
    args = ap.parse_args(argv)
    if _MULTI:
        from scalerl_jax import distributed as dist

        dist.initialize(dist.resolve())
    exp = None
    if args.config:
        try:
            exp = from_dict(ExperimentConfig, json.loads(open(args.config).read()))
        except (OSError, ValueError) as e:
            ap.error(f"--config {args.config}: {e}")
        cfg, loss_cfg, train_cfg, temperature = exp.model, exp.loss, exp.train, exp.rollout.temperature
        what = f"{exp.name} from {args.config}"
    else:
        cfg, loss_cfg, train_cfg, temperature = get_preset(args.preset), LossConfig(), TrainConfig(), 1.0
        what = f"preset {args.preset}"
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, args.seq_len))
    if args.capacity_factor is not None:
        cfg = dataclasses.replace(cfg, moe_capacity_factor=args.capacity_factor)
    microbatches = args.microbatches or (train_cfg.microbatches if exp else 1)
    tensor = args.tensor or (exp.mesh.tensor if exp else 1)
    print(f"[aot] {what}: {cfg.num_params() / 1e9:.2f}B params ({cfg.arch}, {cfg.n_layers} layers), "
          f"{loss_cfg.kind} loss ({loss_cfg.aggregation} aggregation, {loss_cfg.normalization} normalisation), "
          f"{cfg.head_dtype} head, {cfg.dtype} compute, {microbatches} micro-batch(es), temperature {temperature}",
          flush=True)
    reports = []
    for n in args.devices:
        ep = 1
        if cfg.is_moe:
            ep = args.expert or (exp.mesh.expert if exp and exp.mesh.expert > 1 else None) or max(
                d for d in range(1, min(cfg.n_experts, n // tensor) + 1)
                if cfg.n_experts % d == 0 and (n // tensor) % d == 0)
        data = exp.mesh.data if exp else 1
        r = aot_compile(cfg, n, seq_len=args.seq_len, mesh_cfg=MeshConfig(data=data, fsdp=-1, tensor=tensor, expert=ep),
                        loss_cfg=loss_cfg, train_cfg=train_cfg, microbatches=microbatches,
                        seqs_per_shard=args.seqs_per_shard, temperature=temperature,
                        device_memory_gb=args.device_memory_gb)
        reports.append(r)
        print(f"[aot] {n} devices: init peak {r['init_peak_gib_per_device']:.2f} GiB/device, step peak "
              f"{r['peak_bytes'] / GiB:.2f} GiB/device, compiled in {r['compile_s']:.1f}s", flush=True)
    if jax.process_index() != 0:
        return 0 if all(r["fits"] for r in reports) else 1
    if jax.process_count() > 1:
        print(f"[aot] compiled by {jax.process_count()} processes x {jax.local_device_count()} devices")
    print(format_table(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=2)
    return 0 if all(r["fits"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
