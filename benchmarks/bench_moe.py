"""MoE layer throughput: expert-parallel dispatch (shard_map + all_to_all + ragged_dot) against the dense
dispatch (every expert on every token), at several expert counts, on simulated CPU devices.

    python -m benchmarks.bench_moe                      # 8 simulated devices, E in 8 16 32
    python -m benchmarks.bench_moe --experts 8 16 --tokens 4096 --d 256 --ffn 512

Each row times a jitted forward + backward (value_and_grad w.r.t. the input and every MoE weight) of one MoE
layer over the same tokens, median of ``--reps`` calls after a warm-up, and prints tokens/s and the ratio to the
dense dispatch measured in the same run. Paths:

* ``dense``: ``moe_impl="dense"``, tokens sharded over the 8 devices (data parallel), every device runs all E
  experts on its tokens (E x the routed FLOPs);
* ``ragged-1``: sort + ``ragged_dot`` on one device (no mesh);
* ``ep-X``: expert parallelism over an ``expert`` axis of X devices (tokens over all 8, experts over X).

The simulated devices share this machine's cores, so the absolute numbers are CPU numbers and the 8 "devices" do
not add compute: the ratios reflect the FLOPs and data movement each path does, not multi-chip scaling. The
active/total parameter ratio of the MoE presets is printed at the end.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import MeshConfig  # noqa: E402
from scalerl_jax.models.moe import moe_ffn, moe_specs  # noqa: E402
from scalerl_jax.models.presets import get_preset, tiny_moe  # noqa: E402


def median_time(f, args, reps: int) -> float:
    """Median wall seconds of ``f(*args)`` over ``reps`` calls after one warm-up call."""
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def time_layer(g, cfg, h, mp, mcfg: MeshConfig | None, reps: int) -> float:
    """Median seconds of the jitted ``g(h, mp)`` (an MoE layer's value and gradient) on one device (``mcfg`` None) or
    on the mesh of ``mcfg``, the tokens and the MoE weights sharded by their logical axes."""
    if mcfg is None:
        return median_time(jax.jit(g), (h, mp), reps)
    mesh = shd.make_mesh(mcfg)
    x_sh = NamedSharding(mesh, shd.logical_to_spec(("batch", "seq", None), h.shape, mesh))
    axes = {k: w.axes[1:] for k, w in moe_specs(cfg, 1).items()}
    w_sh = {k: NamedSharding(mesh, shd.logical_to_spec(axes[k], v.shape, mesh)) for k, v in mp.items()}
    with shd.use_mesh(mesh):
        f = jax.jit(g, in_shardings=(x_sh, w_sh))
        return median_time(f, (jax.device_put(h, x_sh), jax.device_put(mp, w_sh)), reps)


def bench(n_experts: int, tokens: int, d: int, ffn: int, reps: int) -> list[dict]:
    cfg = dataclasses.replace(tiny_moe(), d_model=d, expert_ffn_dim=ffn, n_experts=n_experts, top_k=1)
    rng = np.random.RandomState(0)
    B, T = 8, tokens // 8
    h = rng.randn(B, T, d).astype(np.float32)
    ct = rng.randn(B, T, d).astype(np.float32)
    mp = {"router": rng.randn(d, n_experts).astype(np.float32),
          "w_gate": 0.05 * rng.randn(n_experts, d, ffn).astype(np.float32),
          "w_up": 0.05 * rng.randn(n_experts, d, ffn).astype(np.float32),
          "w_down": 0.05 * rng.randn(n_experts, ffn, d).astype(np.float32),
          "shared_gate": 0.05 * rng.randn(d, ffn).astype(np.float32),
          "shared_up": 0.05 * rng.randn(d, ffn).astype(np.float32),
          "shared_down": 0.05 * rng.randn(ffn, d).astype(np.float32)}

    def loss(c):
        return lambda h, mp: jnp.sum(moe_ffn(h, mp, c)[0] * ct)

    rows = []
    layouts = [("dense", dataclasses.replace(cfg, moe_impl="dense"), MeshConfig(fsdp=8)),
               ("ragged-1", cfg, None)]
    layouts += [(f"ep-{x}", cfg, MeshConfig(fsdp=8 // x, expert=x)) for x in (2, 4, 8) if n_experts % x == 0]
    for name, c, mcfg in layouts:
        t = time_layer(jax.value_and_grad(loss(c), argnums=(0, 1)), c, h, mp, mcfg, reps)
        rows.append({"experts": n_experts, "path": name, "seconds": t, "tokens_per_s": tokens / t})
    dense_t = rows[0]["seconds"]
    for r in rows:
        r["speedup_vs_dense"] = dense_t / r["seconds"]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per call (B=8 rows)")
    ap.add_argument("--d", type=int, default=256, help="model width")
    ap.add_argument("--ffn", type=int, default=512, help="expert width")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    from scalerl_jax.benchmarks import machine

    print(machine.header(machine.describe()))
    print(f"MoE layer fwd+bwd, {args.tokens} tokens, d {args.d}, expert ffn {args.ffn}, top-1, "
          f"{len(jax.devices())} simulated devices")
    print("experts | path | ms / call | tokens/s | vs dense")
    print("--- | --- | --- | --- | ---")
    for e in args.experts:
        for r in bench(e, args.tokens, args.d, args.ffn, args.reps):
            print(f"{r['experts']} | {r['path']} | {r['seconds'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | "
                  f"{r['speedup_vs_dense']:.2f}x", flush=True)
    print()
    print("preset | total params | active params | active / total")
    print("--- | --- | --- | ---")
    for name in ("tiny_moe", "scout_17b16e"):
        c = get_preset(name)
        print(f"{name} | {c.num_params():,} | {c.num_active_params():,} | {c.num_active_params() / c.num_params():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
