"""Train-step configurations for throughput on one GPU, each compiled ahead of time with its per-device peak.

    .venv/bin/python -m benchmarks.throughput_configs                     # llama3_1b, 8k..64k tokens, remat on/off
    .venv/bin/python -m benchmarks.throughput_configs --tokens 8192 16384 --json out.json

The GPU run's train step (the Llama-3.2-1B shapes of ``benchmarks/gpu_check.sh`` and ``benchmarks/gpu_rl.sh``, one
device, CISPO, AdamW, FP32 head) is compiled by :func:`scalerl_jax.aot.aot_compile` (the dry run's own code: abstract
params, optimiser state and batch; ``compiled.memory_analysis()``) for every combination of

- tokens per micro-batch (``--tokens``, as ``--seq-len`` x sequences; 8k to 64k),
- the layer remat policy: ``remat=True`` saves nothing inside a layer (each layer's input only, recomputed in the
  backward pass), ``remat=False`` saves every residual,
- the FP32 head's matmul (``--head-matmul``: ``reference``, IEEE float32; ``bf16x3``, tensor-core sums),

and checked against one 80 GB (H100) and one 141 GB (H200) device: a configuration fits when both its init and step
peaks are under 90 % of the device's memory, as the dry run decides. The peak is XLA:CPU's buffer assignment for the
same program (the dry run's proxy: the GPU compiler fuses differently, and cuDNN / Pallas attention cannot be
compiled for the CPU backend, so every row uses ``attention_impl="reference"``). FLOPs per step: ``6 N tokens``
plus causal attention (``ModelConfig.flops_per_token``), for the MFU a GPU run would divide by.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

DEVICES_GB = {"H100 80 GB": 80.0, "H200 141 GB": 141.0}


def configs(tokens: list[int], seq_len: int, head_matmul: list[str]) -> list[dict]:
    """The grid: every (tokens per micro-batch, remat, head matmul) with ``tokens`` a multiple of ``seq_len``."""
    out = []
    for t, remat, hm in itertools.product(tokens, (True, False), head_matmul):
        if t % seq_len:
            raise ValueError(f"--tokens {t} is not a multiple of --seq-len {seq_len}")
        out.append({"tokens": t, "seqs": t // seq_len, "remat": remat, "head_matmul_impl": hm})
    return out


def compile_one(preset: str, seq_len: int, c: dict) -> dict:
    """One configuration's AOT report (bytes per device), with the fit against each device of ``DEVICES_GB``."""
    from scalerl_jax.aot import aot_compile
    from scalerl_jax.models.presets import get_preset

    cfg = dataclasses.replace(get_preset(preset), remat=c["remat"], head_matmul_impl=c["head_matmul_impl"],
                              attention_impl="reference", max_seq_len=max(seq_len, 8192))
    t0 = time.perf_counter()
    r = aot_compile(cfg, 1, seq_len=seq_len, seqs_per_shard=c["seqs"])
    peak = max(r["peak_bytes"], r["init_peak_bytes"])
    flops = cfg.flops_per_token(seq_len) * c["tokens"] * 3  # forward + backward (x3 of the forward's)
    return {**c, "preset": preset, "seq_len": seq_len, "step_peak_gb": r["peak_bytes"] / 1e9,
            "init_peak_gb": r["init_peak_bytes"] / 1e9, "temp_gb": r["temp_bytes"] / 1e9,
            "fits": {name: peak < 0.9 * gb * 1e9 for name, gb in DEVICES_GB.items()},
            "step_tflops": flops / 1e12, "compile_s": time.perf_counter() - t0}


def table(rows: list[dict]) -> str:
    head = ["tokens / micro-batch", "remat", "head matmul", "step peak GB", "init peak GB", "temp GB",
            *DEVICES_GB, "TFLOP / step", "compile s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        fits = ["fits" if r["fits"][d] else "does not fit" for d in DEVICES_GB]
        lines.append("| " + " | ".join([
            f"{r['tokens']:,} ({r['seqs']} x {r['seq_len']})", "layer input only" if r["remat"] else "everything",
            r["head_matmul_impl"], f"{r['step_peak_gb']:.1f}", f"{r['init_peak_gb']:.1f}", f"{r['temp_gb']:.1f}",
            *fits, f"{r['step_tflops']:.0f}", f"{r['compile_s']:.0f}"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3_1b", help="model preset (default: the GPU run's Llama-3.2-1B shapes)")
    ap.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768, 65536],
                    help="tokens per micro-batch (multiples of --seq-len)")
    ap.add_argument("--head-matmul", nargs="+", default=["reference", "bf16x3"],
                    help="ModelConfig.head_matmul_impl choices to compile")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    try:
        grid = configs(args.tokens, args.seq_len, args.head_matmul)
    except ValueError as e:
        ap.error(str(e))
    from scalerl_jax.benchmarks.machine import describe, header

    print(header(describe(matmul=False)), flush=True)
    rows = []
    for c in grid:
        rows.append(compile_one(args.preset, args.seq_len, c))
        r = rows[-1]
        print(f"[throughput] {r['tokens']} tokens, remat {r['remat']}, {r['head_matmul_impl']}: step peak "
              f"{r['step_peak_gb']:.1f} GB, init {r['init_peak_gb']:.1f} GB ({r['compile_s']:.0f} s)", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
