"""ScaleRL on math: the tiny CPU default end to end, and the real 8B preset.

Launch::

    python -m experiments.math_8b --preset tiny                  # CPU default: warm start, RL, fit, report
    python -m experiments.math_8b --preset tiny --seed 1 --out runs/tiny_s1
    python -m experiments.math_8b --preset tiny --resume --out runs/tiny   # continue a killed run
    python -m experiments.math_8b --preset tiny --variant no_npr           # a leave-one-out variant
    python -m experiments.math_8b --preset 8b --dry-run                    # validate + AOT-compile the 8B step
    python -m experiments.math_8b --preset 8b --model /ckpt/llama3.1-8b --data polaris.jsonl \\
        --sglang-urls http://gen0:30000 http://gen1:30000               # on accelerators
    python -m experiments.math_8b --preset tiny --set train.lr=2e-4 --set rollout.k=4  # field overrides
    python -m scalerl_jax.launch --processes 2 --cpu-devices 2 -- experiments.math_8b --preset smoke  # 2 processes

Several trainer processes (one global mesh, process 0 generating, scoring and writing; BUILD.md "Multi-host"):
every process runs the same command with ``--coordinator HOST:PORT --num-processes P --process-id I``, or with
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` set, or as the tasks of an ``srun`` step.

The tiny preset (DESIGN.md "The tiny default"): a ~0.8M-parameter Llama over a 17-character vocabulary is
warm-started on the synthetic task ``a+b*c=`` (completion ``b*c=X;a+X=Y#Y``), then trained with every ScaleRL
component on: PipelineRL-8, CISPO (eps_max 5), FP32 LM head, prompt-level aggregation, batch advantage
normalisation, zero-variance filtering, No-Positive-Resampling and interruption length control (thinking marker
``#``, budget U[20, 26] tokens, answer budget 5). Evaluation rows go to metrics.jsonl; at the end the sigmoid law
is fitted on the first half of the run's compute and compared with what the second half reached (report.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from experiments.common import ExperimentPlan, apply_overrides
from experiments.presets import PRESETS, VARIANTS, build_plan


def main(argv: list[str] | None = None, *, presets: dict | None = None, real_preset: str = "8b",
         cpu_preset: str = "tiny", prog: str = "python -m experiments.math_8b", doc: str | None = None) -> int:
    presets = PRESETS if presets is None else presets
    ap = argparse.ArgumentParser(prog=prog, description=doc or __doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, choices=sorted(presets),
                    help=f"{cpu_preset} (CPU default), a CI-sized smoke preset, or {real_preset} (real; the default "
                         "when accelerators are present); for another paper recipe use --variant")
    ap.add_argument("--variant", default="scalerl", choices=sorted(VARIANTS),
                    help="leave-one-out variant of ScaleRL (one component swapped for its alternative) or a "
                         "baseline recipe: deepseek_grpo, qwen25_dapo, magistral, minimax")
    ap.add_argument("--out", default=None, help="run directory (default runs/<preset>[_<variant>]_s<seed>)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="RL steps (overrides the preset)")
    ap.add_argument("--resume", action="store_true", help="continue from the run directory's latest valid checkpoint")
    ap.add_argument("--dry-run", action="store_true", help="validate the configuration and AOT-compile the train "
                    "step on an abstract mesh (no accelerator, no weights), printing per-device memory")
    ap.add_argument("--model", default=None,
                    help="HF checkpoint dir of the base model (LlamaForCausalLM or Llama4ForCausalLM, with its "
                         "tokenizer.json): replaces the preset's own base model (no warm start); the architecture "
                         "comes from its config.json, the recipe from the preset")
    ap.add_argument("--data", default=None,
                    help="jsonl training data, one question/answer row per line (GSM8K, MATH-500 and Polaris field "
                         "layouts are detected); data.val_size rows are held out for validation; see also "
                         "--set data.template=... and --set data.chat_template=true")
    ap.add_argument("--sglang-urls", nargs="+", default=None, metavar="URL",
                    help="generate with these SGLang servers (or one sglang-router URL in front of them) instead of "
                         "the embedded engine; weights are pushed to them as HF checkpoints after every update")
    ap.add_argument("--generators", type=int, default=None, metavar="N",
                    help="start N local SGLang-API servers (python -m scalerl_jax.serve) behind a real "
                         "sglang-router for this run and stop them at exit; 0: the embedded in-process engine")
    ap.add_argument("--no-fit", action="store_true", help="skip the scaling fit and report at the end")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a config field, e.g. train.lr=2e-4, rollout.k=4, loss.kind=dapo (repeatable)")
    ap.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    ap.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                    help="multi-process run: process 0's address for jax.distributed (with --num-processes and "
                         "--process-id; default: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or "
                         "SLURM's variables inside srun)")
    ap.add_argument("--num-processes", type=int, default=None, metavar="P", help="multi-process run: processes")
    ap.add_argument("--process-id", type=int, default=None, metavar="I", help="multi-process run: this one's rank")
    ap.add_argument("--dist-timeout", type=int, default=300, metavar="S",
                    help="multi-process run: seconds to wait for every process at start-up; a process that stops "
                         "sending heartbeats for a fifth of this (at least 10 s) takes the others down")
    args = ap.parse_args(argv)
    from scalerl_jax import distributed as dist
    from scalerl_jax.config import ConfigError

    try:
        dcfg = dist.resolve(args.coordinator, args.num_processes, args.process_id, init_timeout_s=args.dist_timeout,
                            heartbeat_timeout_s=max(10, args.dist_timeout // 5))
    except ConfigError as e:
        ap.error(str(e))
    dist.initialize(dcfg)  # before any other JAX call

    preset = args.preset
    if preset is None:
        import jax

        preset = real_preset if any(d.platform != "cpu" for d in jax.devices()) else cpu_preset
    plan: ExperimentPlan = build_plan(preset, args.variant, seed=args.seed)
    exp = plan.exp
    if args.steps is not None:
        exp = dataclasses.replace(exp, train=dataclasses.replace(exp.train, steps=args.steps))
    if args.data:
        exp = dataclasses.replace(exp, data=dataclasses.replace(exp.data, source="jsonl", path=args.data))
    if args.sglang_urls and args.generators is not None:
        ap.error("give --sglang-urls (an existing fleet) or --generators N (start one), not both")
    if args.sglang_urls:
        exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, engine="sglang", local_servers=0,
                                                                   sglang_urls=tuple(args.sglang_urls)))
    if args.generators is not None:
        if args.generators < 0:
            ap.error(f"--generators must be >= 0, got {args.generators}")
        engine = "sglang" if args.generators else "embedded"
        exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, engine=engine, sglang_urls=(),
                                                                   local_servers=args.generators))
    exp = apply_overrides(exp, args.overrides)
    out = args.out or f"runs/{preset}{'' if args.variant == 'scalerl' else '_' + args.variant}_s{args.seed}"
    exp = dataclasses.replace(exp, out_dir=out)
    plan = dataclasses.replace(plan, exp=exp, base_model=args.model or plan.base_model)
    if args.print_config:
        print(json.dumps(dataclasses.asdict(exp), indent=2, default=str))
        return 0
    if args.dry_run:
        from experiments.common import dry_run

        return dry_run(plan)
    if plan.real and not any(d.platform != "cpu" for d in __import__("jax").devices()):
        print(f"[{prog.split('.')[-1]}] preset {preset!r} is the real {plan.exp.model.n_layers}-layer recipe and "
              f"needs accelerators; none are present. Run `{prog} --preset {cpu_preset}` on CPU, or "
              f"`--preset {preset} --dry-run` to validate and AOT-compile it here.", file=sys.stderr)
        return 2
    from experiments.run_path import run_experiment

    t0 = time.time()
    try:
        summary: dict[str, Any] = run_experiment(plan, resume=args.resume, fit=not args.no_fit)
    except ConfigError as e:
        print(f"[{prog.split('.')[-1]}] error: {e}", file=sys.stderr)
        return 2
    if summary.get("follower"):
        print(f"[math_8b] process {summary['process']} done in {time.time() - t0:.0f}s")
        return 0
    print(f"[math_8b] done in {time.time() - t0:.0f}s; run directory {Path(out).resolve()}")
    print(f"[math_8b] read {Path(out) / 'report.md'}")
    return 0 if summary.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
