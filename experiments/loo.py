"""Leave-one-out ablations of ScaleRL (and the paper's baseline recipes), with one comparison report.

Launch::

    python -m experiments.loo --preset tiny                       # ScaleRL + every leave-one-out variant, seed 0
    python -m experiments.loo --preset tiny --seeds 3 --variants scalerl no_npr bf16_head
    python -m experiments.loo --preset smoke --variants scalerl ppo_off_policy --out runs/loo_smoke
    python -m experiments.loo --preset tiny --variants scalerl dapo --set train.lr=1e-4 --out runs/loo_lr1e-4
    python -m experiments.loo --preset small --model DIR --data FILE.jsonl --generators 2 --variants scalerl gspo

``--model``, ``--data``, ``--sglang-urls`` and ``--generators`` act as in ``experiments.math_8b``: every variant is a
run of the same path on that base model and data. Runs go one after another into ``<out>/<variant>_s<seed>``. A run
there is reused only when its config.json equals the planned one (``experiments.store.config_differences``): a
finished run is skipped and an interrupted one resumes from its checkpoint, so the command can simply be re-issued; a
run of another config (``--steps``, ``--set``, another ``--model``) is moved to ``<out>/superseded/`` and run
again, and the command says which fields differ. With a preset's own base model, all variants of one
seed start RL from one supervised warm start, ``<out>/warmstart_s<seed>`` (trained once; the paper's variants
likewise share a base model), so only the RL differs between them. At the end the
sigmoid law is fitted to every run (on its whole compute) and
``<out>/comparison/comparison.md`` tabulates the end reward, A, B, C_mid with 90 % intervals and
P(A_ScaleRL > A_variant), P(B_ScaleRL > B_variant) against ScaleRL of the same seed; with several seeds, each
variant's A and B averaged over its seeds and P(ScaleRL's average > the variant's). The same folder holds the
overlaid curves, the ceiling densities and every fit's report.md. ``--fit-until 0.5`` (the paper's half-compute
protocol; finished runs are not rerun) writes ``<out>/comparison_until0.5`` with each run's prediction of its last
eval from the first half, its error and whether the 90 % interval covered it.

The results store (``--store``, default ``results/<name of --out>``; experiments/store.py): each finished run's
small files (config, metrics, summary, report, figures; no checkpoints or weights) are copied there as it finishes
(``--commit``: and git-committed), with the comparison beside them. A planned run found finished in the store with
the same config is not run again, so a study committed from one machine continues on another from a clone, and
its comparison is rebuilt from the stored files. Cost on a 2-core CPU: about the tiny run's
RL time per variant and seed, plus one warm start per seed (docs/results/loo_tiny.md).
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
from scalerl_jax.experiments.cli import (
    Flattened,
    VariantName,
    apply_run_flags,
    cli_error,
    first_pass,
    parse_cli,
    preset_help,
)
from scalerl_jax.experiments.presets import LOO_VARIANTS, PRESETS, VARIANTS, ExperimentPlan, build_plan
from scalerl_jax.experiments.report import compare
from scalerl_jax.experiments.run_path import run_experiment
from scalerl_jax.experiments.store import (
    commit_run,
    default_store,
    move_aside,
    run_state,
    store_comparison,
    store_run,
    stored_differences,
)

from scalerl_jax.config import ConfigError, ExperimentConfig

ComputeKey = Literal["flops", "device_hours"]


@dataclass(frozen=True)
class LooArgs:
    """The flags of a leave-one-out study; ``exp`` holds the config of each run (every field a flag), parsed once
    per variant and seed with that run's config as the defaults."""

    preset: Annotated[str, tyro.conf.arg(metavar="NAME")] = "tiny"
    """size preset of every run (one of those listed above)"""
    seeds: int = 1
    """seeds per variant (FIRST_SEED..FIRST_SEED+N-1)"""
    first_seed: Annotated[int, tyro.conf.arg(metavar="FIRST_SEED")] = 0
    """the first seed: more seeds of a recipe studied earlier, without running the earlier ones again"""
    variants: Annotated[tuple[VariantName, ...], tyro.conf.arg(metavar="VARIANT [VARIANT ...]")] = (
        "scalerl", *LOO_VARIANTS)
    """runs to make and compare: ScaleRL and its leave-one-out swaps, or any of the variants"""
    out: str | None = None
    """output directory (default runs/loo_<preset>)"""
    steps: int | None = None
    """RL steps per run (overrides the preset)"""
    model: str | None = None
    """HF checkpoint dir of the base model every run starts from (no warm start), as in experiments.math_8b"""
    data: str | None = None
    """jsonl training data of every run (question/answer rows), as in experiments.math_8b"""
    sglang_urls: Annotated[tuple[str, ...] | None, tyro.conf.arg(metavar="URL [URL ...]")] = None
    """generate with these SGLang servers (or one sglang-router URL in front of them), one run after another"""
    generators: Annotated[int | None, tyro.conf.arg(metavar="N")] = None
    """each run starts N local SGLang-API servers behind a real sglang-router and stops them at its end; 0: the
    embedded in-process engine"""
    compute_key: tuple[ComputeKey, ...] = ("flops", "device_hours")
    """compute axes to compare on; the first goes to <out>/comparison, others to <out>/comparison_<key>. FLOPs (train
    + generation) are counted, so they do not depend on how loaded the machine was; device-hours (wall time minus
    evals) also credit PipelineRL's overlap of generation and training, but a busy machine inflates them"""
    fit_until: float = 1.0
    """fraction of each run's compute the sigmoid is fitted on (1.0: the whole run, for comparing variants; 0.5: the
    paper's half-compute protocol)"""
    store: Annotated[str, tyro.conf.arg(metavar="DIR|auto|none")] = "auto"
    """results store (experiments/store.py): each finished run's small files are copied to DIR/<run>, and a planned
    run found finished there with the same config is not run again; auto: results/<name of --out> in the working
    directory (the repository); none: no store"""
    commit: bool = False
    """git-commit each run's stored files as it finishes (a long study continued on another machine from a clone)"""
    print_config: bool = False
    """print every run's resolved configuration as JSON and exit"""
    set: Annotated[tuple[str, ...], tyro.conf.arg(metavar="FIELD=VALUE"), tyro.conf.UseAppendAction] = ()
    """alias of a field's flag (--set train.lr=1e-4 is --train.lr 1e-4); a field flag sets that field in every run
    after its variant is applied, so setting the field a variant swaps undoes that variant"""
    exp: Annotated[ExperimentConfig, Flattened] = dataclasses.field(default_factory=ExperimentConfig)


def parse_runs(argv: list[str], prog: str = "python -m experiments.loo") -> tuple[LooArgs, dict[tuple[str, int], Any]]:
    """Parse the command line once per (variant, seed) with that run's plan as the defaults: the study's flags and
    each run's ExperimentPlan (field flags applied). Every run is checked here, before any of them starts."""
    import argparse

    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--variants", nargs="+", default=["scalerl", *LOO_VARIANTS])
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--first-seed", default="0")
    preset, _, _ = first_pass(argv, PRESETS, prog)
    first, _ = ap.parse_known_args(argv)
    seeds = int(first.seeds) if first.seeds.isdigit() else 1
    first_seed = int(first.first_seed) if first.first_seed.isdigit() else 0
    variants = [v for v in first.variants if v in VARIANTS] or ["scalerl"]
    description = f"{__doc__}\n\n{preset_help(PRESETS, VARIANTS, LOO_VARIANTS)}"
    args, plans = None, {}
    for variant in variants:
        for seed in range(first_seed, first_seed + max(seeds, 1)):
            plan = build_plan(preset or "tiny", variant, seed=seed)
            args = parse_cli(LooArgs, LooArgs(preset=preset or "tiny", exp=plan.exp), argv, prog=prog,
                             description=description)
            plans[variant, seed] = apply_run_flags(plan, args, prog)
    return args, plans


def _from_store(store: Path, name: str, plan: ExperimentPlan) -> Path | None:
    """The stored copy of run ``name`` when it finished with the planned config, else None (said why)."""
    kept, diffs = stored_differences(store, name, plan)
    if kept is None:
        return None
    if diffs:
        print(f"[loo] {name}: the stored run {kept} differs from the planned one ({'; '.join(diffs)}); running it")
        return None
    print(f"[loo] {name}: finished in the results store with the same config ({kept}), not running it again")
    return kept


def _keep(run_dir: Path, store: Path, commit: bool) -> None:
    """Copy a finished run into the store (a stored run of another config is moved to ``<store>/superseded``)."""
    earlier = store / run_dir.name
    if earlier.exists():
        moved = move_aside(earlier, store / "superseded")
        print(f"[loo] {run_dir.name}: the store's earlier copy moved to {moved}")
    kept = store_run(run_dir, store)
    print(f"[loo] {run_dir.name}: stored its small files in {kept}", flush=True)
    if commit and commit_run(kept):
        print(f"[loo] {run_dir.name}: committed {kept}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); returns the exit status."""
    args, plans = parse_runs(list(sys.argv[1:] if argv is None else argv))
    if args.first_seed < 0 or args.seeds < 1:
        cli_error("python -m experiments.loo", f"--seeds is a count of at least 1 and --first-seed a seed >= 0, got "
                  f"--seeds {args.seeds} --first-seed {args.first_seed}")
    if not 0 < args.fit_until <= 1:
        cli_error("python -m experiments.loo", f"--fit-until is a fraction of each run's compute in (0, 1], got "
                  f"{args.fit_until}")
    if args.print_config:
        print(json.dumps({f"{v}_s{s}": dataclasses.asdict(p.exp) for (v, s), p in plans.items()}, indent=2))
        return 0
    from scalerl_jax.checkpoint import ResumeError

    out = Path(args.out or f"runs/loo_{args.preset}")
    out.mkdir(parents=True, exist_ok=True)
    store = None if args.store == "none" else default_store(out) if args.store == "auto" else Path(args.store)
    if store is not None:
        print(f"[loo] results store: {store} (--store none: no store)")
    run_dirs = []
    t0 = time.time()
    for variant in args.variants:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run_dir = out / f"{variant}_s{seed}"
            run_dirs.append(run_dir)
            plan = plans[variant, seed]
            plan = dataclasses.replace(plan, exp=dataclasses.replace(plan.exp, out_dir=str(run_dir)))
            state, why = run_state(run_dir, plan)
            if state != "finished" and store is not None:
                kept = _from_store(store, run_dir.name, plan)
                if kept is not None:
                    run_dirs[-1] = kept
                    continue
            if state == "finished":
                print(f"[loo] {run_dir.name}: finished earlier with the same config, skipping")
                if store is not None:
                    kept, diffs = stored_differences(store, run_dir.name, plan)
                    if kept is None or diffs:
                        _keep(run_dir, store, args.commit)
                continue
            if state == "replace":
                moved = move_aside(run_dir, out / "superseded")
                print(f"[loo] {run_dir.name}: the run there differs from the planned one ({'; '.join(why)}); moved "
                      f"it to {moved} and running it again", flush=True)
            print(f"[loo] running {run_dir.name} ({time.time() - t0:.0f}s elapsed)", flush=True)
            # every variant of one seed starts RL from the same supervised warm start (trained once, by the first);
            # an unfinished run of the same config continues from its last checkpoint, one killed before its first
            # starts over
            try:
                run_experiment(plan, resume=state == "resume", fit=False, overwrite=True,
                               warm_dir=out / f"warmstart_s{seed}")
            except ConfigError as e:
                print(f"[loo] {run_dir.name}: error: {e}", file=sys.stderr)
                return 2
            except ResumeError as e:
                print(f"[loo] {run_dir.name}: error: resuming its checkpoints: {e}; move {run_dir} aside to start "
                      "it over", file=sys.stderr)
                return 1
            if store is not None:
                _keep(run_dir, store, args.commit)
    # a first-part fit (--fit-until 0.5) gets folders of its own, so it does not overwrite the whole-run comparison
    tail = "" if args.fit_until == 1 else f"_until{args.fit_until:g}"
    dirs = [out / (f"comparison{tail}" if i == 0 else f"comparison{tail}_{key}")
            for i, key in enumerate(args.compute_key)]
    summaries = [compare(run_dirs, d, fit_until=args.fit_until, compute_key=key)
                 for d, key in zip(dirs, args.compute_key)]
    summary = summaries[0]
    (dirs[0] / "loo_summary.json").write_text(json.dumps({"runs": [str(d) for d in run_dirs],
                                                          "seconds": time.time() - t0}, indent=2))
    if store is not None:
        for d in dirs:  # the comparison's table and figures beside the stored runs (rebuilt by re-issuing the command)
            store_comparison(d, store / d.name)
    print(f"[loo] {len(run_dirs)} runs in {time.time() - t0:.0f}s; report {dirs[0] / 'comparison.md'}")
    if not summary["runs"]:
        print("[loo] no run could be fitted (each needs 5 evals in its fit window); comparison.md says why per run",
              file=sys.stderr)
    return 0 if summary["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
