"""ScaleRL on math: the tiny CPU default end to end, and the real 8B preset.

Launch::

    python -m experiments.math_8b --preset tiny                  # CPU default: warm start, RL, fit, report
    python -m experiments.math_8b --preset tiny --seed 1 --out runs/tiny_s1
    python -m experiments.math_8b --preset tiny --resume --out runs/tiny   # continue a killed run
    python -m experiments.math_8b --preset tiny --variant no_npr           # a leave-one-out variant
    python -m experiments.math_8b --preset 8b --dry-run                    # validate + AOT-compile the 8B step
    python -m experiments.math_8b --preset 8b --model /ckpt/llama3.1-8b --data polaris.jsonl \\
        --sglang-urls http://gen0:30000 http://gen1:30000               # on accelerators
    python -m experiments.math_8b --preset tiny --train.lr 2e-4 --rollout.k 4           # any config field
    python -m experiments.math_8b --preset tiny --set train.lr=2e-4 --set data.npr=false  # the same, as --set
    python -m scalerl_jax.launch --processes 2 --cpu-devices 2 -- experiments.math_8b --preset smoke  # 2 processes

Several trainer processes (one global mesh, process 0 generating, scoring and writing; BUILD.md "Multi-host"):
every process runs the same command with ``--coordinator HOST:PORT --num-processes P --process-id I``, or with
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` set, or as the tasks of an ``srun`` step.

The tiny preset (DESIGN.md "The tiny default"): a ~1M-parameter (0.99M) Llama over a 17-character vocabulary is
warm-started on the synthetic task ``a+b*c=`` (completion ``b*c=X;a+X=Y#Y``), then trained with every ScaleRL
component on: PipelineRL-8, CISPO (eps_max 5), FP32 LM head, prompt-level aggregation, batch advantage
normalisation, zero-variance filtering, No-Positive-Resampling and interruption length control (thinking marker
``#``, budget U[20, 26] tokens, answer budget 5). Evaluation rows go to metrics.jsonl; at the end the sigmoid law
is fitted on the first half of the run's compute and compared with what the second half reached (report.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro
from scalerl_jax.experiments.common import ExperimentPlan, Flattened, cli_error, parse_cli, preset_help
from scalerl_jax.experiments.presets import LOO_VARIANTS, PRESETS, VARIANTS, build_plan

from scalerl_jax.config import ConfigError, ExperimentConfig

VariantName = Literal[tuple(VARIANTS)]  # type: ignore[valid-type]


@dataclass(frozen=True)
class RunArgs:
    """The flags of a run; ``exp`` holds the preset's config, every field of it a flag (``--train.lr 2e-4``)."""

    preset: Annotated[str | None, tyro.conf.arg(metavar="NAME")] = None
    """size preset (one of those listed above), read before everything else: it decides every default below (none
    given: the CPU preset, or the real one when accelerators are present)"""
    variant: VariantName = "scalerl"
    """leave-one-out variant of ScaleRL (one component swapped for its alternative) or a baseline recipe"""
    out: str | None = None
    """run directory; the same as --out-dir, whose default is runs/<preset>[_<variant>]_s<seed>"""
    seed: int = 0
    """seed of the run: train.seed and data.seed of the preset"""
    steps: int | None = None
    """RL steps (overrides the preset's train.steps)"""
    resume: bool = False
    """continue from the run directory's latest valid checkpoint (when checkpoints exist and none restores, the run
    stops naming each one and why; metrics.jsonl is left untouched)"""
    overwrite: bool = False
    """start over in a run directory that holds an earlier run: deletes its metrics.jsonl, checkpoints/,
    tensorboard/, weights/, fit/, summary.json and report.md first (without it such a directory is refused)"""
    dry_run: bool = False
    """validate the configuration and AOT-compile the train step on an abstract mesh (no accelerator, no weights),
    printing per-device memory"""
    devices: Annotated[int | None, tyro.conf.arg(metavar="N")] = None
    """trainer devices the dry run compiles for (default: the preset's), e.g. 8 for one 8-GPU node"""
    device_memory_gb: Annotated[float | None, tyro.conf.arg(metavar="M")] = None
    """memory per device in GB the dry run checks the init and step peaks against (default 186, a GB200; H100 80,
    H200 141)"""
    model: str | None = None
    """HF checkpoint dir of the base model (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM
    or Llama4ForCausalLM, with its tokenizer.json): replaces
    the preset's own base model (no warm start); the architecture comes from its config.json, the recipe from the
    preset"""
    data: str | None = None
    """jsonl training data, one question/answer row per line (GSM8K, MATH-500 and Polaris field layouts are
    detected); data.val_size rows are held out for validation; see also --data.template and --data.chat-template"""
    sglang_urls: Annotated[tuple[str, ...] | None, tyro.conf.arg(metavar="URL [URL ...]")] = None
    """generate with these SGLang servers (or one sglang-router URL in front of them) instead of the embedded engine;
    weights are pushed to them as HF checkpoints after every update"""
    generators: Annotated[int | None, tyro.conf.arg(metavar="N")] = None
    """start N local SGLang-API servers (python -m scalerl_jax.serve) behind a real sglang-router for this run and
    stop them at exit; 0: the embedded in-process engine"""
    fit: bool = True
    """fit the scaling law and write the report at the end (--no-fit skips both)"""
    baseline: Annotated[str | None, tyro.conf.arg(metavar="RUN_DIR")] = None
    """a run of the same task (finished or still running) to compare with: each live forecast row adds
    P(A > A_baseline) and P(B > B_baseline), shown in the progress line (same as --forecast.baseline)"""
    stop_if_worse: Annotated[float | None, tyro.conf.arg(metavar="P")] = None
    """stop the run once P(A < A_baseline) >= P, after at least --forecast.stop-min-evals evals (needs --baseline);
    the run ends normally, with its fit and report, and says why in summary.json and report.md"""
    print_config: bool = False
    """print the resolved configuration as JSON and exit"""
    set: Annotated[tuple[str, ...], tyro.conf.arg(metavar="FIELD=VALUE"), tyro.conf.UseAppendAction] = ()
    """alias of a field's flag: --set train.lr=2e-4 is --train.lr 2e-4, --set data.npr=false is --data.no-npr"""
    coordinator: Annotated[str | None, tyro.conf.arg(metavar="HOST:PORT")] = None
    """multi-process run: process 0's address for jax.distributed (with --num-processes and --process-id; default:
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, or SLURM's variables inside srun)"""
    num_processes: Annotated[int | None, tyro.conf.arg(metavar="P")] = None
    """multi-process run: processes"""
    process_id: Annotated[int | None, tyro.conf.arg(metavar="I")] = None
    """multi-process run: this one's rank"""
    dist_timeout: Annotated[int, tyro.conf.arg(metavar="S")] = 300
    """multi-process run: seconds to wait for every process at start-up"""
    heartbeat_timeout: Annotated[int, tyro.conf.arg(metavar="S")] = 300
    """multi-process run: a process that sends no heartbeat for this long is declared dead and the run ends; keep it
    well above the longest stall of a healthy process (compile, checkpoint save, a loaded machine; each process
    logs its stalls); a process that exits is noticed at once by the launcher or srun --kill-on-bad-exit"""
    exp: Annotated[ExperimentConfig, Flattened] = dataclasses.field(default_factory=ExperimentConfig)


def first_pass(argv: list[str], presets: dict, prog: str) -> tuple[str | None, str, int]:
    """--preset, --variant and --seed, read before the rest: together they decide every other default. A preset that
    does not exist exits naming the ones that do; a bad variant or seed falls back to the default here and tyro's
    full parse then reports it with the allowed values."""
    import argparse

    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--preset", "--variant", "--seed"):
        ap.add_argument(flag)
    known, _ = ap.parse_known_args(argv)
    if known.preset is not None and known.preset not in presets:
        cli_error(prog, f"--preset {known.preset!r}: choose one of {', '.join(presets)}")
    seed = int(known.seed) if known.seed and known.seed.lstrip("-").isdigit() else 0
    return known.preset, known.variant if known.variant in VARIANTS else "scalerl", seed


def parse_run_args(argv: list[str], preset: str, variant: str, seed: int, *, presets: dict, prog: str,
                   doc: str | None) -> tuple[RunArgs, ExperimentPlan]:
    """Parse the command line with ``preset``'s plan (its ``variant``, ``seed``) as every default."""
    plan: ExperimentPlan = build_plan(preset, variant, seed=seed, presets=presets)
    out = f"runs/{preset}{'' if variant == 'scalerl' else '_' + variant}_s{seed}"
    default = RunArgs(preset=preset, variant=variant, seed=seed, exp=dataclasses.replace(plan.exp, out_dir=out))
    description = (f"{doc or __doc__}\n\n{preset_help(presets, VARIANTS, LOO_VARIANTS)}\n\nDefaults below: --preset "
                   f"{preset} --variant {variant} --seed {seed}. Every config field is a flag (--train.lr 2e-4); "
                   "--set train.lr=2e-4 is the same.")
    return parse_cli(RunArgs, default, argv, prog=prog, description=description), plan


def apply_run_flags(plan: ExperimentPlan, args: Any, prog: str) -> ExperimentPlan:
    """``plan`` with the parsed config ``args.exp`` and the run flags every entry point shares applied to it:
    ``--steps``, ``--data``, ``--sglang-urls``, ``--generators`` and ``--model`` (the base model). ``args`` is any
    parsed flags object with those fields (:class:`RunArgs`, ``experiments.loo.LooArgs``); a bad combination exits
    with status 2."""
    exp = args.exp
    if args.sglang_urls and args.generators is not None:
        cli_error(prog, "give --sglang-urls (an existing fleet) or --generators N (start one), not both")
    if args.generators is not None and args.generators < 0:
        cli_error(prog, f"--generators must be >= 0, got {args.generators}")
    try:
        if args.steps is not None:
            exp = dataclasses.replace(exp, train=dataclasses.replace(exp.train, steps=args.steps))
        if args.data:
            exp = dataclasses.replace(exp, data=dataclasses.replace(exp.data, source="jsonl", path=args.data))
        if args.sglang_urls:
            exp = dataclasses.replace(exp, rollout=dataclasses.replace(
                exp.rollout, engine="sglang", local_servers=0, sglang_urls=tuple(args.sglang_urls)))
        if args.generators is not None:
            exp = dataclasses.replace(exp, rollout=dataclasses.replace(
                exp.rollout, engine="sglang" if args.generators else "embedded", sglang_urls=(),
                local_servers=args.generators))
        baseline, stop = getattr(args, "baseline", None), getattr(args, "stop_if_worse", None)
        if baseline is not None or stop is not None:
            exp = dataclasses.replace(exp, forecast=dataclasses.replace(
                exp.forecast, baseline=baseline if baseline is not None else exp.forecast.baseline,
                stop_if_worse=stop if stop is not None else exp.forecast.stop_if_worse))
    except ConfigError as e:
        cli_error(prog, str(e))
    return dataclasses.replace(plan, exp=exp, base_model=args.model or plan.base_model)


def _on_accelerators() -> bool:
    import jax

    return any(d.platform != "cpu" for d in jax.devices())


def main(argv: list[str] | None = None, *, presets: dict | None = None, real_preset: str = "8b",
         cpu_preset: str = "tiny", prog: str = "python -m experiments.math_8b", doc: str | None = None) -> int:
    """The command line (``--help``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    presets = PRESETS if presets is None else presets
    preset, variant, seed = first_pass(argv, presets, prog)
    # without --preset the default is the real preset on accelerators, known only once JAX has started (after
    # jax.distributed's start-up): the command is checked against the CPU preset's defaults first, then parsed again
    args, plan = parse_run_args(argv, preset or cpu_preset, variant, seed, presets=presets, prog=prog, doc=doc)
    from scalerl_jax import distributed as dist

    if not args.print_config:
        try:
            dcfg = dist.resolve(args.coordinator, args.num_processes, args.process_id,
                                init_timeout_s=args.dist_timeout, heartbeat_timeout_s=args.heartbeat_timeout)
        except ConfigError as e:
            cli_error(prog, str(e))
        dist.initialize(dcfg)  # before any other JAX call
    if preset is None:
        preset = real_preset if _on_accelerators() else cpu_preset
        if preset != cpu_preset:
            args, plan = parse_run_args(argv, preset, variant, seed, presets=presets, prog=prog, doc=doc)
    plan = apply_run_flags(plan, args, prog)
    out = args.out or plan.exp.out_dir
    exp = dataclasses.replace(plan.exp, out_dir=out)
    plan = dataclasses.replace(plan, exp=exp)
    if args.print_config:
        print(json.dumps(dataclasses.asdict(exp), indent=2, default=str))
        return 0
    if args.dry_run:
        from scalerl_jax.experiments.common import dry_run

        return dry_run(plan, devices=args.devices, device_memory_gb=args.device_memory_gb)
    if plan.real and not _on_accelerators():
        print(f"[{prog.split('.')[-1]}] preset {preset!r} is the real {plan.exp.model.n_layers}-layer recipe and "
              f"needs accelerators; none are present. Run `{prog} --preset {cpu_preset}` on CPU, or "
              f"`--preset {preset} --dry-run` to validate and AOT-compile it here.", file=sys.stderr)
        return 2
    from scalerl_jax.experiments.run_path import run_experiment

    from scalerl_jax.checkpoint import ResumeError

    t0 = time.time()
    try:
        summary: dict[str, Any] = run_experiment(plan, resume=args.resume, fit=args.fit, overwrite=args.overwrite)
    except ConfigError as e:
        print(f"[{prog.split('.')[-1]}] error: {e}", file=sys.stderr)
        return 2
    except ResumeError as e:
        print(f"[{prog.split('.')[-1]}] error: --resume: {e}; metrics.jsonl was left as it was (--overwrite starts "
              "over)", file=sys.stderr)
        return 1
    if summary.get("follower"):
        print(f"[math_8b] process {summary['process']} done in {time.time() - t0:.0f}s")
        return 0
    print(f"[math_8b] done in {time.time() - t0:.0f}s; run directory {Path(out).resolve()}")
    print(f"[math_8b] read {Path(out) / 'report.md'}")
    return 0 if summary.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
