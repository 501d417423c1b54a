"""Peak host memory of loading a sharded HF checkpoint (``load_hf_checkpoint``) against its size, and of the
per-shard load (``load_hf_sharded``) into 1, 2 and 4 processes.

    .venv/bin/python -m benchmarks.bench_hf_io_memory                          # Llama-3.2-1B shapes, bfloat16
    .venv/bin/python -m benchmarks.bench_hf_io_memory --dtype float32 --shard-mb 1024 --json out.json
    .venv/bin/python -m benchmarks.bench_hf_io_memory --processes 1 2 4        # per-shard load, per process

``--processes``: the same checkpoint is then loaded by P processes (``python -m scalerl_jax.launch --processes P
--cpu-devices 1``) onto a mesh of P devices (``fsdp=P``), each reading only its own blocks; each process reports
its peak RSS increase and the bytes it read. On CPU a device's buffers are host memory, so a process's RSS holds
its own blocks: the figure should fall as 1/P (plus the replicated norms and one slice being read).

Random params of the given shape are saved with ``save_hf_checkpoint`` (sharded at ``--shard-mb``), then a
fresh subprocess loads them back in the same dtype. The figure is that process's peak RSS (VmHWM, reset just
before the load) minus its RSS just before the load, over the checkpoint's bytes on disk: the params
themselves are 1.0 of it, so the ratio minus 1 is what reading costs on top (an implementation that kept
every source tensor resident while stacking the layers would be at ~2). Per-leaf SHA-1s checked against
the saved params make it a round trip.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def llama_1b_shapes(**kw):
    """Llama-3.2-1B: 16 layers, d 2048, FFN 8192, 32/8 heads of 64, vocab 128256, tied (1.24B params)."""
    from scalerl_jax.config import ModelConfig

    base = dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
                tie_embeddings=True, max_seq_len=8192, dtype="bfloat16", eos_token_id=1, pad_token_id=0)
    return ModelConfig(**{**base, **kw})


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM). Not ``ru_maxrss``: Linux carries that across ``execve``, so a child
    would report its parent's peak at the fork."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass  # the peak then includes the imports', which only overstates the load's


def _digests(params) -> list[str]:
    import jax

    return [hashlib.sha1(np.ascontiguousarray(a).view(np.uint8).data).hexdigest() for a in jax.tree.leaves(params)]


def _child(path: str, dtype: str) -> None:
    from scalerl_jax.models.hf_io import load_hf_checkpoint

    _reset_peak_rss()
    before = _rss_bytes()
    params, _ = load_hf_checkpoint(path, param_dtype=dtype)
    peak = _peak_rss_bytes()
    import jax

    print(json.dumps({"rss_before": before, "peak": peak, "digests": _digests(params),
                      "param_bytes": sum(a.nbytes for a in jax.tree.leaves(params))}))


def _child_sharded(path: str, dtype: str) -> None:
    from scalerl_jax import distributed as dist

    dist.initialize(dist.resolve(), log=lambda s: None)
    import jax

    from scalerl_jax import sharding as shd
    from scalerl_jax.config import MeshConfig, TrainConfig
    from scalerl_jax.models.hf_io import read_hf_config
    from scalerl_jax.models.hf_sharded import ReadStats, load_hf_sharded
    from scalerl_jax.train import make_optimizer, state_shardings

    _, cfg = read_hf_config(path, param_dtype=dtype)
    _, st_sh = state_shardings(cfg, make_optimizer(TrainConfig()), shd.make_mesh(MeshConfig(fsdp=jax.device_count())))
    stats = ReadStats()
    _reset_peak_rss()
    before = _rss_bytes()
    params = load_hf_sharded(path, cfg, st_sh.params, stats=stats)
    jax.block_until_ready(params)
    peak = _peak_rss_bytes()
    local = sum(s.data.nbytes for a in jax.tree.leaves(params) for s in a.addressable_shards)
    print("RESULT " + json.dumps({"process": jax.process_index(), "rss_before": before, "peak": peak,
                                  "bytes_read": stats.bytes_read, "local_param_bytes": local}), flush=True)


def measure_sharded(path: Path, dtype: str, processes: int) -> dict:
    """Load ``path`` with ``load_hf_sharded`` in ``processes`` processes of one CPU device each; the largest
    per-process peak RSS increase and bytes read."""
    launch = [sys.executable, "-m", "scalerl_jax.launch", "--processes", str(processes), "--cpu-devices", "1",
              "--log-dir", str(path.parent / f"launch{processes}"), "--"]
    r = subprocess.run([*launch, "scalerl_jax.benchmarks.bench_hf_io_memory", "--child-sharded", str(path),
                        "--dtype", dtype],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"sharded load with {processes} processes failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in r.stdout.splitlines() if "RESULT " in line]
    assert len(rows) == processes, r.stdout[-2000:]
    return {"processes": processes, "peak_rss_increase_max": max(x["peak"] - x["rss_before"] for x in rows),
            "bytes_read_max": max(x["bytes_read"] for x in rows),
            "local_param_bytes_max": max(x["local_param_bytes"] for x in rows)}


def measure(cfg, dtype: str, shard_bytes: int, workdir: str | Path, seed: int = 0,
            processes: tuple[int, ...] = ()) -> dict:
    """Save random ``cfg``-shaped params (``dtype``) sharded at ``shard_bytes`` under ``workdir``, load them in a
    subprocess; returns checkpoint bytes, shard count, peak RSS increase of the load and its ratio (and, for each of
    ``processes``, the per-shard load's per-process figures)."""
    import dataclasses

    import jax
    import ml_dtypes

    from scalerl_jax.models import param_shapes
    from scalerl_jax.models.hf_io import save_hf_checkpoint

    cfg = dataclasses.replace(cfg, param_dtype=dtype)
    np_dt = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    rng = np.random.default_rng(seed)
    shapes = param_shapes(cfg)
    params = jax.tree.map(lambda s: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np_dt), shapes,
                          is_leaf=lambda x: isinstance(x, tuple))
    digests = _digests(params)
    path = Path(workdir) / "ckpt"
    save_hf_checkpoint(params, cfg, path, dtype=dtype, max_shard_bytes=shard_bytes)
    del params
    gc.collect()
    files = sorted(path.glob("*.safetensors"))
    ckpt_bytes = sum(f.stat().st_size for f in files)
    r = subprocess.run([sys.executable, "-m", "scalerl_jax.benchmarks.bench_hf_io_memory", "--child", str(path),
                        "--dtype", dtype],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"load subprocess failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    extra = out["peak"] - out["rss_before"]
    sharded = [measure_sharded(path, dtype, p) for p in processes]
    return {"sharded": sharded,
            "params": int(sum(np.prod(s) for s in jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple)))),
            "dtype": dtype, "shards": len(files), "checkpoint_bytes": ckpt_bytes, "param_bytes": out["param_bytes"],
            "load_peak_rss_increase": extra, "ratio": extra / ckpt_bytes, "round_trip_ok": out["digests"] == digests}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--shard-mb", type=int, default=512, help="max_shard_bytes of the saved checkpoint, in MiB")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json", help="write the report to this file")
    ap.add_argument("--processes", type=int, nargs="*", default=[], metavar="P",
                    help="also load per shard (load_hf_sharded) into P processes of one CPU device each, for each P")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-sharded", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.dtype)
        return 0
    if args.child_sharded:
        _child_sharded(args.child_sharded, args.dtype)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        rep = measure(llama_1b_shapes(n_layers=args.layers), args.dtype, args.shard_mb * 2**20, tmp,
                      processes=tuple(args.processes))
    gb = 1e9
    print(f"{rep['params'] / 1e9:.2f}B params, {rep['dtype']}, {rep['shards']} shards: checkpoint "
          f"{rep['checkpoint_bytes'] / gb:.2f} GB, load peak RSS increase {rep['load_peak_rss_increase'] / gb:.2f} GB, "
          f"ratio {rep['ratio']:.3f}, round trip {'ok' if rep['round_trip_ok'] else 'MISMATCH'}")
    if rep["sharded"]:
        print("per-shard load (load_hf_sharded), P processes x 1 CPU device, mesh fsdp=P; the reference is the "
              "whole load above, same run")
        print("processes | peak RSS increase / process GB | vs whole load | bytes read / process GB | own blocks GB")
        print("--- | --- | --- | --- | ---")
        for x in rep["sharded"]:
            print(f"{x['processes']} | {x['peak_rss_increase_max'] / gb:.2f} | "
                  f"{x['peak_rss_increase_max'] / rep['load_peak_rss_increase']:.2f}x | "
                  f"{x['bytes_read_max'] / gb:.2f} | "
                  f"{x['local_param_bytes_max'] / gb:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2))
    return 0 if rep["round_trip_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
