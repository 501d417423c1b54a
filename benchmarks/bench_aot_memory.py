"""Per-device memory of the llama3_8b RL train step, compiled ahead of time on simulated meshes.

    .venv/bin/python -m benchmarks.bench_aot_memory                              # 16, 32, 64 devices, 16k tokens
    .venv/bin/python -m benchmarks.bench_aot_memory --devices 16 --seq-len 8192 --json out.json

A thin wrapper over ``python -m scalerl_jax.aot`` (which does the work: abstract params, optimiser state and
batch, ``jit(...).lower(...).compile()``, ``compiled.memory_analysis()``). One sequence of ``--seq-len``
tokens per data-parallel shard; FSDP over all devices (``--tensor`` moves some onto a tensor axis).
Columns, all per device: params (FP32 master weights), opt (Adam moments), temp (activations, gathered
weights, gradients and scratch: XLA's temp buffer), peak = argument + output - aliased + temp, and the
compile time. Each device count runs in a fresh subprocess so it gets its own
``--xla_force_host_platform_device_count``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3_8b")
    ap.add_argument("--devices", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--tensor", type=int, default=1)
    ap.add_argument("--json", help="write all reports to this file")
    args = ap.parse_args(argv)

    from scalerl_jax.aot import format_table  # no jax device state is touched by the import

    reports = []
    for n in args.devices:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [sys.executable, "-m", "scalerl_jax.aot", "--preset", args.preset, "--devices", str(n),
                   "--seq-len", str(args.seq_len), "--tensor", str(args.tensor), "--json", str(out)]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if not out.exists():
                print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
                return 1
            reports.extend(json.loads(out.read_text()))
        print(f"[bench] {n} devices done", flush=True)
    print(format_table(reports))
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2))
    return 0 if all(r["fits_gb200"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
