"""What every experiment shares: the plan dataclass, the command line (tyro over the config dataclasses), the
warm-start key, the dry run and the run report."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import tyro

from scalerl_jax.config import ConfigError, ExperimentConfig

T = TypeVar("T")


@dataclass(frozen=True)
class ExperimentPlan:
    """An ExperimentConfig plus what the run needs around it (warm start, lengths, the base model)."""

    exp: ExperimentConfig
    real: bool = False  # needs accelerators (the 8B preset)
    warm_steps: int = 0  # supervised warm-start steps before RL (tiny); 0 = start from base_model
    warm_batch: int = 128
    warm_lr: float = 3e-3
    warm_warmup: int = 50
    warm_unmarked_frac: float = 0.0  # warm-start targets that never mark a final answer (see tiny_plan)
    #: rows of the preset's own supervised warm start (its base model; unused with --model): the preset's budgets,
    #: fixed apart from the RL run's so that --rollout.* flags and max_prompt_len=auto reuse the same warm start
    warm_seq_len: int = 40
    base_model: str | None = None  # HF checkpoint dir of the starting policy (--model); None: the preset makes it
    base_kind: str = "none"  # how the preset makes its base model: "char_arith", "char_chain", "word_arith"
    n_problems: int = 14400  # word_arith: problems written to the preset's jsonl; char_chain: warm-start chains
    arith_b_max: int = 19  # word_arith: a + b * c with b <= this (19: a small multiplication table)
    bpe_vocab: int = 512  # word_arith: BPE vocabulary trained on that text
    n_trainer_devices: int = 1
    variant: str = "scalerl"

    @property
    def seq_len(self) -> int:
        """Tokens per training row: ``rollout.max_prompt_len + rollout.max_new_tokens``, the one source of every
        length the run allocates (train batch, generator KV caches). ``max_prompt_len="auto"`` is measured from
        the data when the run loads it (:func:`experiments.budgets.resolve_prompt_budget`); before that there is
        no row length."""
        ro = self.exp.rollout
        if ro.max_prompt_len == "auto":
            raise ConfigError("rollout.max_prompt_len=auto has no value before the data is measured")
        return ro.max_prompt_len + ro.max_new_tokens


# ---- the command line: tyro over the frozen config dataclasses ---------------------------------------------

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


# ---- the end-to-end run ------------------------------------------------------------------------------------


WARM_HEAD_DTYPE = "float32"  # the supervised warm start always trains with ScaleRL's FP32 head


def warm_start_key(plan: ExperimentPlan) -> dict[str, Any]:
    """Everything the supervised warm start depends on, as JSON: two plans with equal keys start RL from the same
    weights. The warm start trains with an FP32 LM head whatever the RL recipe's ``head_dtype``, so the
    ``bf16_head`` variant shares ScaleRL's warm start (as the paper's variants share one base model)."""
    exp = plan.exp
    model = {k: v for k, v in dataclasses.asdict(exp.model).items() if k != "head_dtype"}  # always WARM_HEAD_DTYPE
    return json.loads(json.dumps({
        "model": model, "data": {"source": exp.data.source, "seed": exp.data.seed, "n_train": exp.data.n_train,
                                 "val_size": exp.data.val_size,
                                 **({"code_source": exp.data.code_source, "code_val_size": exp.data.code_val_size}
                                    if exp.data.code_source != "none" else {}),
                                 **({"chain_depths": [exp.data.chain_depth_lo, exp.data.chain_depth_hi]}
                                    if exp.data.source == "chain" else {}),
                                 **({"arith_b_max": exp.data.arith_b_max}
                                    if exp.data.source == "arith" and exp.data.arith_b_max != 99 else {})},
        "seed": exp.train.seed, "seq_len": plan.warm_seq_len, "steps": plan.warm_steps, "batch": plan.warm_batch,
        "lr": plan.warm_lr, "warmup": plan.warm_warmup, "unmarked_frac": plan.warm_unmarked_frac,
        "base_kind": plan.base_kind,
        **({"n_problems": plan.n_problems, "bpe_vocab": plan.bpe_vocab, "b_max": plan.arith_b_max,
            "template": exp.data.template} if plan.base_kind == "word_arith" else {}),
        **({"n_problems": plan.n_problems} if plan.base_kind == "char_chain" else {})},
        default=str))


def _json_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted paths where two JSON values differ (``model.d_model``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in _json_diff(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    return [] if a == b else [path or "<root>"]


def _shared_warm_start(plan: ExperimentPlan, shared: Path) -> Path | None:
    """The shared warm start's directory if it was finished earlier for the same key; raises if its key differs."""
    key_file = shared / "warmstart_key.json"
    if not (shared / "config.json").exists() or not key_file.exists():
        return None
    have, want = json.loads(key_file.read_text()), warm_start_key(plan)
    if have != want:
        raise ConfigError(f"shared warm start {shared} was made for different settings (differs in: "
                          f"{', '.join(_json_diff(have, want))}); use another --out for these settings (the runs "
                          "already in this one started from that warm start)")
    return shared


def write_report(run_dir: Path, plan: ExperimentPlan, summary: dict, fit_summary: dict | None) -> None:
    """report.md: what ran, the reward curve, the fit and how its half-compute prediction held up."""
    from scalerl_jax.metrics import read_metrics

    exp = plan.exp
    evals = read_metrics(run_dir, "eval")
    lines = [f"# {exp.name}: ScaleRL run report", "",
             f"Run directory `{run_dir}`. Variant `{plan.variant}`. Model {exp.model.num_params() / 1e6:.2f}M params, "
             f"loss {exp.loss.kind} (aggregation {exp.loss.aggregation}, normalisation {exp.loss.normalization}, "
             f"zero-variance filter {exp.loss.filter_zero_variance}), {exp.rollout.mode} k={exp.rollout.k}, "
             f"{exp.rollout.prompts_per_batch} prompts x {exp.rollout.group_size} samples, LM head "
             f"{exp.model.head_dtype}, NPR {exp.data.npr}, length control {exp.rollout.length.kind}.", "",
             "## What happened", "",
             (f"- Base model: `{plan.base_model}` (given with --model; no warm start)." if plan.base_model else
              f"- Warm start: {plan.warm_steps} supervised steps "
              + (f"({summary['warmstart_seconds']:.0f}s)" if summary.get("warmstart_seconds")
                 else f"(reused from `{summary.get('warmstart_dir', 'warmstart')}`)")
              + (f"; {plan.warm_unmarked_frac:.0%} of its targets work the scratchpad but commit to no answer or "
                 "to the wrong one (the preset's docstring says how), so the warm-started policy often computes the "
                 "answer without committing to it: what RL has to learn." if plan.warm_unmarked_frac else ".")),
             f"- Data: {summary.get('n_train', '?')} training prompts, {summary.get('n_val', '?')} validation "
             f"prompts ({exp.data.source}{' `' + exp.data.path + '`' if exp.data.path else ''}); prompt budget "
             f"{exp.rollout.max_prompt_len} tokens"
             + (f" (rollout.max_prompt_len={summary['prompt_budget']['rule']}; the longest prompt has "
                f"{summary['prompt_budget']['longest']} tokens)" if summary.get("prompt_budget", {}).get("rule", "set")
                != "set" else "")
             + f", {exp.rollout.max_new_tokens} completion tokens, training rows of {plan.seq_len} tokens; prompts "
             f"dropped as longer than the prompt budget: {summary.get('dropped_long_prompts', {}).get('train', 0)} "
             f"train, {summary.get('dropped_long_prompts', {}).get('val', 0)} validation.",
             "- Generators: " + (f"SGLang-API fleet ({summary.get('generator_devices', 0)} generator devices "
                                  f"counted in compute beside {summary.get('trainer_devices', 1)} trainer devices; "
                                  f"{summary.get('weight_pushes', 0)} weight pushes, last one "
                                  f"{summary.get('weight_sync_bytes', 0) / 1e6:.1f} MB)."
                                  if summary.get("generator_devices") else "the embedded JAX engine (in process)."),
             f"- RL: {summary['steps']} steps in {summary['wall_seconds']:.0f}s wall; compute "
             f"{summary['device_hours']:.4f} device-hours; {summary['gen_tokens']} generated tokens.",
             f"- Trainer busy {summary['trainer_busy_fraction']:.0%}, generator busy "
             f"{summary['generator_busy_fraction']:.0%} of the RL wall time"
             + (" (they share the CPU)." if not summary.get("generator_devices") else "."),
             f"- Filtered zero-variance groups: {summary['filtered_groups']}; prompts removed by No-Positive-"
             f"Resampling: {summary['npr']['n_removed']}; skipped steps: {summary['skipped_steps']}; batches dropped "
             f"as too stale: {summary['dropped_stale_batches']}.", ""]
    if len(summary.get("tasks", {})) > 1:
        at = next(i for i, line in enumerate(lines) if line.startswith("- Generators: "))
        lines.insert(at, "- Tasks: " + "; ".join(f"{t} {v['n_train']} train / {v['n_val']} validation prompts, "
                                            f"{v['weight']:.0%} of each batch" for t, v in summary["tasks"].items())
                     + ".")
    if summary.get("sandbox"):
        sb = summary["sandbox"]
        lines.insert(-1, f"- Code sandbox: {sb.get('describe', sb['isolation'])} (sandbox.isolation="
                         f"{sb['configured']!r})" + (f"; {sb['runs']['runs']} programs run, "
                                                     f"{sb['runs'].get('timeout', 0)} timeouts, "
                                                     f"{sb['runs']['sandbox_error']} sandbox errors."
                                                     if "runs" in sb else "."))
    if evals:
        keys = ["val_reward", *sorted({k for e in evals for k in e if k.startswith("val_reward_")})]
        names = {k: "all" if k == "val_reward" else k[len("val_reward_"):] for k in keys}
        lines += ["## Validation reward (mean pass rate)", ""]
        for k in keys:
            r0, r1 = evals[0].get(k, float("nan")), evals[-1].get(k, float("nan"))
            best = max(e.get(k, float("nan")) for e in evals)
            lines.append(f"- {names[k] if len(keys) > 1 else 'Validation'}: start {r0:.3f} -> end {r1:.3f} "
                         f"({(r1 - r0) * 100:+.1f} points); best {best:.3f}.")
        lines += ["", "| step | device-hours | " + " | ".join(f"val reward ({names[k]})" if len(keys) > 1
                                                             else "val reward" for k in keys) + " |",
                  "|---|---|" + "---|" * len(keys)]
        lines += [f"| {e['step']} | {e['device_hours']:.5f} | "
                  + " | ".join(f"{e.get(k, float('nan')):.3f}" for k in keys) + " |" for e in evals]
        lines.append("")
    if fit_summary and "runs" in fit_summary:
        for name, e in fit_summary["runs"].items():
            b = e["bayes"]["summary"] if "summary" in e["bayes"] else e["bayes"]
            p = e["prediction"]
            what = e.get("reward_key", "val_reward")
            part = ("all" if fit_summary.get("settings", {}).get("fit_until") == 1.0 else "first half") + " of compute"
            key = e.get("compute_key", "device_hours")
            lines += [f"## Scaling fit of {'val_reward' if what == 'val_reward' else what} (`{name}`, {part})", "",
                      f"Fitted on {e['n_fit']} eval points up to {_compute(e['fit_until_compute'], key)}.", ""]
            for k in ("A", "B", "C_mid"):
                if k in b:
                    s = b[k]
                    lines.append(f"- {k}: mean {s['mean']:.4g}, 90% interval [{s['lo']:.4g}, {s['hi']:.4g}]")
            lines += ["", f"Predicted reward at {_compute(e['target_compute'], key)}: {p['mean']:.3f} "
                      f"(90% interval [{p['lo']:.3f}, {p['hi']:.3f}]); grid fit {p['grid']:.3f}."]
            if "held_out" in e:
                h = e["held_out"]
                covered = p["lo"] <= h["observed_nearest_target"] <= p["hi"]
                lines.append(f"Measured at the end: {h['observed_nearest_target']:.3f}; error "
                             f"{h['error_nearest_target']:+.3f}; {'inside' if covered else 'outside'} the 90% "
                             f"interval. Over all {h['n']} held-out points: mean |error| {h['mean_abs_error']:.3f}, "
                             f"{h['fraction_in_90']:.0%} inside their 90% intervals.")
            lines += ["", "Plots and the fit's own report: `fit/` (fit_*.png, A_posteriors.png, efficiency.png).", ""]
    elif fit_summary:
        lines += ["## Scaling fit", "", f"The fit failed: {fit_summary.get('error')}", ""]
    lines += forecast_lines(summary)
    (run_dir / "report.md").write_text("\n".join(lines))


def _compute(c: float, key: str) -> str:
    """A compute value with its unit, for report.md (device-hours are small numbers on a CPU run; FLOPs large)."""
    return f"{c:.5f} device-hours" if key == "device_hours" else f"{c:.4g} {key}"


def forecast_lines(summary: dict) -> list[str]:
    """report.md's section on the live forecast: how it moved, the baseline comparison, an early stop's reason."""
    h, f = summary.get("forecast_history"), summary.get("forecast") or {}
    lines = []
    if summary.get("stopped_early"):
        lines += ["## Stopped early", "", f"The run {summary['stopped_early']}.", ""]
    if not h:
        return lines
    lines += ["## The forecast while it ran", "",
              f"{h['n']} refits of the law on every eval so far (refit process: {f.get('fit_seconds', 0):.0f}s, "
              f"{f.get('share_of_wall', 0):.1%} of the RL wall time; {f.get('skipped_for_budget', 0)} evals' refits "
              "skipped for the time budget). Last forecast: A "
              f"{h['A_mean'][-1]:.3f} [{h['A_lo'][-1]:.3f}, {h['A_hi'][-1]:.3f}], predicted final reward "
              f"{h['R_target_mean'][-1]:.3f} [{h['R_target_lo'][-1]:.3f}, {h['R_target_hi'][-1]:.3f}] at "
              f"{h['target_compute'][-1]:.4g}."]
    if h.get("final_reward") is not None:
        held = (f"every forecast from {h['held_from_compute']:.4g} on ({h['held_from_fraction']:.0%} of the run's "
                "compute) held it in its 90 % interval of the final eval's measured value" if
                h.get("held_from_compute") is not None else "the last forecast's 90 % interval of the final eval's "
                f"measured value, [{h['R_obs_lo'][-1]:.3f}, {h['R_obs_hi'][-1]:.3f}], did not hold it")
        lines.append(f"Observed final reward {h['final_reward']:.3f} at {h['final_compute']:.4g}: {held}.")
    if summary.get("forecast_baseline"):
        b = summary["forecast_baseline"]
        lines.append(f"Against the baseline `{b['dir']}` (A {b['baseline_A_mean']:.3f}): P(A > A_baseline) = "
                     f"{b['P_A_gt_baseline']:.3f}, P(B > B_baseline) = {b['P_B_gt_baseline']:.3f} "
                     f"(rule: {b['baseline_rule']}).")
    lines += ["", "![forecast](fit/forecast.png)", ""]
    return lines


# ---- dry run of a real preset ------------------------------------------------------------------------------


def dry_run(plan: ExperimentPlan, *, devices: int | None = None, device_memory_gb: float | None = None) -> int:
    """Validate the configuration and AOT-compile the train state's initialisation and the RL train step on an
    abstract mesh (subprocess with simulated CPU devices when no accelerators are present), printing per-device
    memory. ``devices`` (default: the preset's trainer devices) and ``device_memory_gb`` (default: a GB200's)
    describe the user's own topology."""
    if devices is not None:
        plan = dataclasses.replace(plan, n_trainer_devices=int(devices))
    import os
    import subprocess
    import sys

    from scalerl_jax.experiments.budgets import check_completion_budget, check_row_fits_model

    exp = plan.exp
    try:
        check_row_fits_model(exp)
        check_completion_budget(exp)
    except ConfigError as e:
        print(f"[dry-run] error: {e}")
        return 2
    if exp.rollout.max_prompt_len == "auto":  # no data here: compile for the longest prompt the model's context allows
        cap = exp.model.max_seq_len - exp.rollout.max_new_tokens
        print(f"[dry-run] rollout.max_prompt_len=auto is measured from the data; compiling for its cap {cap} "
              "(model.max_seq_len - rollout.max_new_tokens)")
        plan = dataclasses.replace(plan, exp=dataclasses.replace(
            exp, rollout=dataclasses.replace(exp.rollout, max_prompt_len=cap)))
        exp = plan.exp
    print(f"[dry-run] {exp.name}: model {exp.model.num_params() / 1e9:.2f}B params, batch "
          f"{exp.rollout.prompts_per_batch} x {exp.rollout.group_size}, lr {exp.train.lr} (warm-up "
          f"{exp.train.warmup_steps}), adam eps {exp.train.adam_eps}, wd {exp.train.weight_decay}, "
          f"{exp.loss.kind} eps_max {exp.loss.eps_max}, {exp.rollout.mode}-{exp.rollout.k}, thinking budget "
          f"U[{exp.rollout.length.think_budget_lo}, {exp.rollout.length.think_budget_hi}] + "
          f"{exp.rollout.length.answer_budget} answer, seq {plan.seq_len}")
    n_rows = exp.rollout.prompts_per_batch * exp.rollout.group_size
    dp = plan.n_trainer_devices // max(exp.mesh.tensor, 1)  # batch axes: data x fsdp x expert
    if n_rows % (exp.train.microbatches * dp):
        print(f"[dry-run] error: {n_rows} rows do not split into {exp.train.microbatches} micro-batches x {dp} shards")
        return 2
    # the resolved configuration itself goes to the compiler: loss, head dtype, model fields, micro-batches, mesh
    out = Path(exp.out_dir) / "dry_run"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(exp), indent=2))
    cmd = [sys.executable, "-m", "scalerl_jax.aot", "--config", str(out / "config.json"), "--devices",
           str(plan.n_trainer_devices), "--seq-len", str(plan.seq_len),
           "--seqs-per-shard", str(n_rows // (exp.train.microbatches * dp)), "--json", str(out / "aot.json")]
    if device_memory_gb is not None:
        cmd += ["--device-memory-gb", str(device_memory_gb)]
    return subprocess.call(cmd, env=dict(os.environ))
