"""The command line of every entry point: tyro over the frozen config dataclasses, the ``--set`` alias, the flags
of a run (:class:`RunArgs`) and the run command that ``experiments.math_8b`` and ``experiments.scout_moe`` share.

``--preset``, ``--variant`` and ``--seed`` are read first (:func:`first_pass`): they decide every other default, so
the full parse (:func:`parse_run_args`) runs with the preset's plan as its defaults and ``--help`` shows them. The
run flags every entry point shares (``--steps``, ``--data``, ``--model``, ``--sglang-urls``, ``--generators``) are
applied to the plan by :func:`apply_run_flags`; ``experiments.loo`` parses its own flags with the same functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import tyro
from scalerl_jax.experiments.presets import LOO_VARIANTS, PRESETS, VARIANTS, ExperimentPlan, build_plan

from scalerl_jax.config import ConfigError, ExperimentConfig

T = TypeVar("T")
VariantName = Literal[tuple(VARIANTS)]  # type: ignore[valid-type]

#: tyro settings shared by every entry point: an optional nested config (``model.rope_scaling``) is set through its
#: fields when the preset has one and stays None otherwise, instead of becoming a pair of subcommands
TYRO_MARKERS = (tyro.conf.AvoidSubcommands,)
#: a nested config whose fields are flags of their own: --train.lr, not --exp.train.lr
Flattened = tyro.conf.arg(name="")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def cli_error(prog: str, msg: str) -> NoReturn:
    """Print ``prog: error: msg`` to stderr and exit with status 2 (argparse's convention for a bad command line)."""
    print(f"{prog}: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _field_type(root: type, path: str, prog: str) -> Any:
    """The annotated type of the dotted field ``path`` (``data.chat_template``) under the dataclass ``root``; a
    missing field exits naming it and the fields that exist."""
    typ: Any = root
    for i, name in enumerate(path.split(".")):
        cls = next((t for t in (typ, *typing.get_args(typ)) if dataclasses.is_dataclass(t)), None)
        hints = typing.get_type_hints(cls) if cls is not None else {}
        if name not in hints:
            where = f"{cls.__name__} has no field {name!r} (fields: {', '.join(hints)})" if cls is not None else (
                f"{'.'.join(path.split('.')[:i])} is not a config section")
            cli_error(prog, f"--set {path}=...: {where}")
        typ = hints[name]
    return typ


def expand_set(argv: list[str], root: type = ExperimentConfig, prog: str = "") -> list[str]:
    """Rewrite every ``--set a.b=v`` (the stable alias) into tyro's flag for field ``a.b`` of ``root``: ``--a.b v``;
    a boolean becomes ``--a.b`` or ``--a.no-b`` (from true/false, yes/no, on/off, 1/0), a tuple's comma-separated
    items become separate values and ``none`` becomes None where the field allows it. tyro then checks the value."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a != "--set" and not a.startswith("--set="):
            out.append(a)
            continue
        ov = a[len("--set="):] if a.startswith("--set=") else next(it, "")
        if "=" not in ov:
            cli_error(prog, f"--set {ov!r}: expected FIELD=VALUE, e.g. --set train.lr=2e-4")
        path, value = ov.split("=", 1)
        typ = _field_type(root, path, prog)
        options = typing.get_args(typ) if typing.get_origin(typ) in (typing.Union, types.UnionType) else (typ,)
        if value.lower() == "none" and type(None) in options:
            out += [f"--{path}", "None"]
        elif bool in options:
            if value.lower() not in _TRUE + _FALSE:
                cli_error(prog, f"--set {path}={value}: {path} is a bool, give one of {', '.join(_TRUE + _FALSE)}")
            head, _, last = path.rpartition(".")
            out.append(f"--{path}" if value.lower() in _TRUE else f"--{head}{'.' if head else ''}no-{last}")
        elif any(typing.get_origin(t) is tuple for t in options):
            out += [f"--{path}", *(v for v in value.split(",") if v)]
        else:
            out += [f"--{path}", value]
    return out


def parse_cli(cls: type[T], default: T, argv: list[str], *, prog: str, description: str | None) -> T:
    """Parse ``argv`` with tyro into ``cls`` (a frozen dataclass of flags with an ``exp: ExperimentConfig`` whose
    fields are flags of their own), ``default`` supplying every default: the preset's config, so ``--help`` shows
    it. ``--set FIELD=VALUE`` is an alias of the field's flag. A wrong type, a value outside a field's choices or an
    unknown flag exits with status 2 and a message naming the flag and what it accepts."""
    return tyro.cli(cls, default=default, args=expand_set(argv, prog=prog), prog=prog, description=description,
                    config=TYRO_MARKERS)


def preset_help(presets: dict[str, Callable], variants: dict, loo_variants: tuple[str, ...]) -> str:
    """The presets (first line of each one's docstring) and variants, for an entry point's ``--help``."""
    lines = ["Presets (--preset NAME; a preset decides every default below):"]
    for name, fn in presets.items():
        first = " ".join((fn.__doc__ or "").split("\n\n")[0].split())  # its first paragraph, on one line
        lines.append(f"  {name:10s} {textwrap.shorten(first.split('. ')[0].rstrip('.') + '.', 105)}")
    baselines = [v for v in variants if v not in (*loo_variants, "scalerl")]
    lines += ["", (f"Variants (--variant NAME): scalerl (the recipe); leave-one-out swaps {', '.join(loo_variants)}; "
              f"baselines {', '.join(baselines)}.")]
    return "\n".join(lines)



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
    description = (f"{doc or ''}\n\n{preset_help(presets, VARIANTS, LOO_VARIANTS)}\n\nDefaults below: --preset "
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


def run_command(argv: list[str] | None, *, presets: dict | None = None, real_preset: str = "8b",
                cpu_preset: str = "tiny", prog: str = "python -m experiments.math_8b", doc: str | None = None) -> int:
    """One run from the command line (``--help``): parse, then print the config, dry-run, or run the path and write
    report.md; returns the exit status. Messages start with the entry point's name (``[math_8b]``, ``[scout_moe]``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = prog.split(".")[-1]
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
        from scalerl_jax.experiments.run_path import dry_run

        return dry_run(plan, devices=args.devices, device_memory_gb=args.device_memory_gb)
    if plan.real and not _on_accelerators():
        print(f"[{name}] preset {preset!r} is the real {plan.exp.model.n_layers}-layer recipe and "
              f"needs accelerators; none are present. Run `{prog} --preset {cpu_preset}` on CPU, or "
              f"`--preset {preset} --dry-run` to validate and AOT-compile it here.", file=sys.stderr)
        return 2
    from scalerl_jax.experiments.run_path import run_experiment

    from scalerl_jax.checkpoint import ResumeError

    t0 = time.time()
    try:
        summary: dict[str, Any] = run_experiment(plan, resume=args.resume, fit=args.fit, overwrite=args.overwrite)
    except ConfigError as e:
        print(f"[{name}] error: {e}", file=sys.stderr)
        return 2
    except ResumeError as e:
        print(f"[{name}] error: --resume: {e}; metrics.jsonl was left as it was (--overwrite starts "
              "over)", file=sys.stderr)
        return 1
    if summary.get("follower"):
        print(f"[{name}] process {summary['process']} done in {time.time() - t0:.0f}s")
        return 0
    print(f"[{name}] done in {time.time() - t0:.0f}s; run directory {Path(out).resolve()}")
    print(f"[{name}] read {Path(out) / 'report.md'}")
    return 0 if summary.get("ok", True) else 1

