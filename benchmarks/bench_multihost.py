"""Multi-process cost on CPU, printed as ratios measured in one run.

1. Train-step time for the same global batch and the same 4-device mesh: one process x 4 devices against two
   processes x 2 devices (``scalerl_jax.launch``; gloo collectives between the processes). Each timed step is
   what the trainer does: the leader's host batch broadcast to the followers (``TrainerCore.step``), each
   process placing its own rows, the jitted step on the global mesh, host metrics. Median of ``--steps`` after
   ``--warmup`` untimed steps; the two configurations alternate ``--rounds`` times (the machine is shared).
2. The 8B train step ahead-of-time compiled by 4 processes x 4 devices (4 hosts x 4 GB200s: 16 devices, as the
   8B preset trains) against one process x 16 simulated devices: per-device memory of each.

    python -m benchmarks.bench_multihost [--steps 10] [--rounds 2] [--skip-aot]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(out: str, steps: int, warmup: int, model: str) -> None:
    """One process of the timed run (launched alone or by scalerl_jax.launch)."""
    from scalerl_jax import distributed as dist

    dist.initialize(dist.resolve())
    import dataclasses

    import jax
    import numpy as np
    from scalerl_jax.experiments.presets import build_plan

    from scalerl_jax.models import init_params, llama_100m
    from scalerl_jax.train.core import TrainerCore
    from scalerl_jax.train.rl_batch import build_train_batch

    plan = build_plan("smoke")
    exp = plan.exp
    if model == "llama_100m":
        exp = dataclasses.replace(exp, model=dataclasses.replace(llama_100m(), dtype="float32"))
    exp = dataclasses.replace(exp, out_dir=tempfile.mkdtemp(prefix="bench_mh_"))
    params = jax.tree.map(np.asarray, init_params(exp.model, jax.random.key(0), std=0.02))
    channel = dist.Channel() if jax.process_count() > 1 else None
    core = TrainerCore(exp, params, seq_len=plan.seq_len, pad_id=0, run_dir=exp.out_dir,
                       channel=channel if jax.process_index() == 0 else None, log=lambda s: None)
    if jax.process_index() != 0:
        core.follow(channel)
        return
    n, T = core.n_rows, plan.seq_len
    rng = np.random.default_rng(0)
    batch = build_train_batch([], [], version=0, loss_cfg=exp.loss, seq_len=T, n_rows=n, pad_id=0)[0].as_dict()
    batch["tokens"] = rng.integers(2, exp.model.vocab_size, (n, T)).astype(batch["tokens"].dtype)
    batch["loss_mask"] = np.ones_like(batch["loss_mask"])
    batch["gen_logp"] = np.full_like(batch["gen_logp"], -2.0)
    batch["advantages"] = rng.standard_normal(batch["advantages"].shape).astype(batch["advantages"].dtype)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        m = core.step(batch)
        float(m["loss"])
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    core.stop()
    Path(out).write_text(json.dumps({"median_s": statistics.median(times), "times": times,
                                     "processes": jax.process_count(), "devices": jax.device_count(),
                                     "rows": n, "seq_len": T, "params": exp.model.num_params()}))


def timed(processes: int, steps: int, warmup: int, model: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        me = ["scalerl_jax.benchmarks.bench_multihost", "--worker", str(out), "--steps", str(steps),
              "--warmup", str(warmup), "--model", model]
        if processes == 1:
            env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
            r = subprocess.run([sys.executable, "-m", *me], cwd=ROOT, env=env, capture_output=True, text=True)
        else:
            r = subprocess.run([sys.executable, "-m", "scalerl_jax.launch", "--processes", str(processes),
                                "--cpu-devices", str(4 // processes), "--log-dir", d, "--", *me], cwd=ROOT,
                               capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{processes}-process run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return json.loads(out.read_text())


def aot(processes: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "aot.json"
        cmd = ["-m", "scalerl_jax.aot", "--preset", "llama3_8b", "--devices", "16", "--seq-len", "16384",
               "--json", str(out)]
        if processes == 1:
            r = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True)
        else:
            r = subprocess.run([sys.executable, "-m", "scalerl_jax.launch", "--processes", str(processes),
                                "--cpu-devices", str(16 // processes), "--log-dir", d, "--", *cmd[1:]], cwd=ROOT,
                               capture_output=True, text=True)
        if not out.exists():
            raise SystemExit(f"AOT with {processes} processes failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return json.loads(out.read_text())[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="tiny", choices=["tiny", "llama_100m"],
                    help="tiny (the smoke preset's, 0.99M) or llama_100m (124M, f32)")
    ap.add_argument("--skip-aot", action="store_true")
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.steps, a.warmup, a.model)
        return 0
    one, two = [], []
    for _ in range(a.rounds):
        one.append(timed(1, a.steps, a.warmup, a.model)["median_s"])
        two.append(timed(2, a.steps, a.warmup, a.model)["median_s"])
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"train step, {a.model} model, same global batch and 4-device mesh (median of {a.steps} steps, "
          f"{a.rounds} rounds):")
    print(f"  1 process x 4 devices : {m1 * 1e3:8.1f} ms  (rounds: {', '.join(f'{x * 1e3:.1f}' for x in one)})")
    print(f"  2 processes x 2 devices: {m2 * 1e3:8.1f} ms  (rounds: {', '.join(f'{x * 1e3:.1f}' for x in two)})")
    print(f"  ratio 2-process / 1-process: {m2 / m1:.2f}")
    if not a.skip_aot:
        r1, r4 = aot(1), aot(4)
        gib = 2**30
        print("llama3_8b train step, 16 devices, 16k tokens, AOT per-device memory (GiB):")
        for name, r in (("1 process x 16 devices", r1), ("4 processes x 4 devices", r4)):
            print(f"  {name}: params {r['params_bytes'] / gib:.2f}, Adam {r['opt_state_bytes'] / gib:.2f}, "
                  f"temp {r['temp_bytes'] / gib:.2f}, peak {r['peak_bytes'] / gib:.2f}"
                  f" ({'fits' if r['fits_gb200'] else 'DOES NOT FIT'} a GB200)")
        print(f"  ratio of peaks (4 processes / 1): {r4['peak_bytes'] / r1['peak_bytes']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
