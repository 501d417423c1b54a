"""The one run path every preset walks: base model -> prompts -> generators -> trainer -> fit -> report.

    base model   an HF directory (config.json + safetensors + tokenizer.json): ``--model``, or the one the preset
                 makes (:mod:`experiments.base_models`); the architecture comes from its config.json, the preset
                 supplies the recipe and the numerics (dtypes, remat, attention chunk, MoE dispatch)
    prompts      jsonl (``--data``: question/answer rows, a prompt template or the tokenizer's chat template) or
                 the synthetic task; prompts over ``rollout.max_prompt_len`` tokens are dropped and counted
    generators   the embedded JAX engine in process, or SGLang-API servers over HTTP: ``--sglang-urls`` (a fleet
                 or its router) or ``--generators N`` (N local ``scalerl_jax.serve`` processes + a real
                 ``sglang-router``, started and stopped by the run); weights reach them as HF checkpoints pushed
                 in flight after every update (:class:`~scalerl_jax.rollout.client.remote.RemoteGenerator`)
    rewards      exact match (the synthetic task), math-verify (math sets), or the code sandbox (code prompts mixed
                 in with ``data.code_source``: a :class:`~scalerl_jax.rewards.code_pool.CodePool` the run owns and
                 closes; the isolation it runs under is written into config.json and summary.json)
    trainer      :class:`~scalerl_jax.train.trainer.RLTrainer` (PipelineRL-k / PPO-off-policy-k, checkpoints)

Inputs are checked before compute is spent: a model directory without tokenizer.json, a malformed jsonl row
(file:line), a template without ``{question}``, a ``data.val_size`` that leaves nothing to train on, an unreachable
server URL stop the run with an error naming them before anything is trained; what needs the model or the tokenizer
(budgets over the model's context, a missing chat template, an interruption text that does not fit
``max_new_tokens``, data with no prompt under the prompt budget) is checked as soon as it is loaded, before any
generator starts and before metrics.jsonl is written. Lengths: :mod:`experiments.budgets`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scalerl_jax.experiments import budgets
from scalerl_jax.experiments.base_models import BaseModel, prepare_base
from scalerl_jax.experiments.common import ExperimentPlan, write_report
from scalerl_jax.experiments.numerics import NUMERICS, model_from_checkpoint  # noqa: F401  (re-exported)
from scalerl_jax.experiments.preflight import check_programs

from scalerl_jax.config import ConfigError, ExperimentConfig, forecast_runs, generator_model

R = dataclasses.replace

# ---- inputs, checked before compute ------------------------------------------------------------------------


def check_urls(urls: tuple[str, ...], timeout_s: float = 10.0) -> None:
    """Every SGLang URL (a server or a router) answers ``GET /health`` with 200; else a ConfigError naming the
    URL."""
    import httpx

    for url in urls:
        u = url.rstrip("/")
        try:
            r = httpx.get(u + "/health", timeout=timeout_s)
        except httpx.HTTPError as e:
            raise ConfigError(f"--sglang-urls {url}: unreachable ({type(e).__name__}: {e}); start the SGLang "
                              "server or router first, or use --generators N to start local ones") from None
        if r.status_code != 200:
            raise ConfigError(f"--sglang-urls {url}: GET /health answered HTTP {r.status_code}: {r.text[:200]}")


def check_inputs(plan: ExperimentPlan) -> None:
    """Model directory, data file and server URLs, before any compute is spent."""
    from scalerl_jax.experiments.base_models import check_model_dir

    from scalerl_jax.data.jsonl import DataError, load_jsonl

    exp = plan.exp
    check_programs(exp)  # the router, servers and sandbox the run will start are installed (experiments/preflight.py)
    if plan.base_model:
        check_model_dir(plan.base_model)
    if exp.data.source == "jsonl" and exp.data.path:
        if not Path(exp.data.path).is_file():
            raise ConfigError(f"--data {exp.data.path}: no such file")
        try:
            rows, _ = load_jsonl(exp.data.path, skip_malformed=exp.data.skip_malformed,
                                 question_key=exp.data.question_key, answer_key=exp.data.answer_key)
        except DataError as e:
            raise ConfigError(f"--data: {e} (set data.skip_malformed=true to skip such rows)") from None
        if not rows:
            raise ConfigError(f"--data {exp.data.path}: no usable rows (every row was skipped as malformed, or the "
                              "file is empty)")
        budgets.check_split(exp, len({p.prompt for p in rows}), exp.data.path)
    elif exp.data.source == "jsonl" and (plan.base_kind != "word_arith" or plan.base_model):
        raise ConfigError(f"preset {exp.name!r} reads jsonl data{' beside --model' if plan.base_model else ''}: "
                          "pass --data FILE.jsonl (question/answer rows)")
    if exp.data.code_source == "jsonl":
        from scalerl_jax.data.code_tasks import load_code_tasks

        if not Path(exp.data.code_path).is_file():
            raise ConfigError(f"data.code_path {exp.data.code_path}: no such file")
        try:
            load_code_tasks(exp.data.code_path, skip_malformed=exp.data.skip_malformed)
        except DataError as e:
            raise ConfigError(f"data.code_path: {e} (set data.skip_malformed=true to skip such rows)") from None
    if exp.data.code_source != "none" and "{question}" not in exp.data.code_template:
        raise ConfigError(f"data.code_template must contain '{{question}}', got {exp.data.code_template!r}")
    if exp.data.source == "jsonl" and "{question}" not in exp.data.template:
        raise ConfigError(f"data.template must contain '{{question}}', got {exp.data.template!r}")
    ro = exp.rollout
    if ro.engine == "sglang" and not ro.sglang_urls and not ro.local_servers:
        raise ConfigError("rollout.engine='sglang' needs --sglang-urls URL [URL ...] or --generators N")
    budgets.check_completion_budget(exp)  # the interruption text's tokens are added once the tokenizer is loaded
    if ro.sglang_urls:
        check_urls(ro.sglang_urls)
    if exp.forecast.baseline:
        check_baseline(exp)


def check_baseline(exp: ExperimentConfig, log=print) -> None:
    """--baseline RUN_DIR: a run directory whose metrics.jsonl has enough evals on the forecast's compute axis to
    fit its ceiling (it may still be running). A baseline whose config.json names other data is used with a warning:
    comparing ceilings across tasks means little."""
    import warnings

    from scalerl_jax.scaling.io import load_run

    fc = exp.forecast
    base = Path(fc.baseline)
    if not (base / "metrics.jsonl").is_file():
        raise ConfigError(f"--baseline {base}: no metrics.jsonl there (give a run directory of the same task)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n = load_run(base, compute_key=fc.compute_key).compute.size
    except ValueError as e:
        raise ConfigError(f"--baseline: {e}") from None
    if n < fc.min_evals:
        raise ConfigError(f"--baseline {base}: {n} eval rows with {fc.compute_key!r}; its ceiling needs at least "
                          f"{fc.min_evals} (forecast.min_evals) to be fitted")
    try:
        theirs = json.loads((base / "config.json").read_text()).get("data", {})
    except (OSError, ValueError):
        theirs = {}
    ours = dataclasses.asdict(exp.data)
    differ = [k for k in ("source", "path", "code_source", "code_path") if k in theirs and theirs[k] != ours[k]]
    if differ:
        log(f"[forecast] warning: --baseline {base} ran on other data ({', '.join(f'data.{k}' for k in differ)} "
            "differ): its ceiling may not be comparable")


def check_tokenized(exp: ExperimentConfig, tok, base_dir: Path) -> None:
    """What needs the tokenizer: the chat template exists when asked for, and interruption length control fits
    ``max_new_tokens`` (thinking budget + the interruption text's tokens + answer budget)."""
    if exp.data.chat_template and getattr(tok, "chat_template", None) is None:
        raise ConfigError(f"data.chat_template=true but {base_dir} has no chat template (tokenizer_config.json "
                          "'chat_template' or chat_template.jinja)")
    lc = length_control(exp, tok.encode)
    if lc is not None:
        budgets.check_completion_budget(exp, len(lc.interruption_ids))


def checkpoint_steps_on_disk(run_dir: Path) -> list[int]:
    """The step directories under ``run_dir/checkpoints`` (read from the file system; nothing is restored)."""
    ck = run_dir / "checkpoints"
    return sorted(int(p.name) for p in ck.iterdir() if p.is_dir() and p.name.isdigit()) if ck.is_dir() else []


RUN_OUTPUTS = ("metrics.jsonl", "checkpoints", "tensorboard", "summary.json", "report.md", "fit", "weights",
               "forecast.log")


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, log=print) -> None:
    """An earlier run's outputs are never lost by accident: a fresh start in a directory that holds metrics or
    checkpoints is refused (``--resume`` continues it, ``--overwrite`` deletes them first, naming what it deletes);
    ``--resume`` with metrics but no checkpoint to continue from is refused the same way."""
    metrics = run_dir / "metrics.jsonl"
    rows = sum(1 for line in open(metrics) if line.strip()) if metrics.is_file() else 0
    steps = checkpoint_steps_on_disk(run_dir)
    if (resume and steps) or (not rows and not steps):
        return
    present = [run_dir / n for n in RUN_OUTPUTS if (run_dir / n).exists()]
    what = ", ".join(str(p) for p in present)
    if overwrite:
        import shutil

        log(f"[run] --overwrite: deleting the earlier run's {what}")
        for p in present:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return
    held = f"metrics.jsonl with {rows} rows" + (f" and checkpoints of steps {steps}" if steps else "")
    if resume:
        raise ConfigError(f"--resume: {run_dir} has no checkpoint to continue from, but holds {held} of an earlier "
                          f"run; pass --overwrite to start over (deletes {what}) or --out NEW_DIR")
    raise ConfigError(f"{run_dir} already holds an earlier run ({held}); pass --resume to continue it, --overwrite "
                      f"to start over (deletes {what}), or --out NEW_DIR")


# ---- prompts -----------------------------------------------------------------------------------------------


def load_prompts(exp: ExperimentConfig, tok, bos_id: int | None, log=print):
    """Training and validation problems rendered for ``tok`` (template or chat template), without the ones over
    the prompt budget (``rollout.max_prompt_len``, or for ``auto`` the one measured here:
    :func:`experiments.budgets.resolve_prompt_budget`); returns (PromptData, counts): ``train`` / ``val`` dropped,
    ``max_prompt_len`` (the budget applied), ``longest`` (the longest prompt before dropping, tokens) and ``rule``."""
    from scalerl_jax.data.jsonl import make_prompt
    from scalerl_jax.data.pipeline import drop_long_prompts, from_config

    dc = exp.data

    def renderer(template: str):
        if dc.chat_template:
            extra = {} if dc.enable_thinking is None else {"enable_thinking": dc.enable_thinking}
            return lambda q: tok.apply_chat_template([{"role": "user", "content": make_prompt(q, template)}], **extra)
        return lambda q: make_prompt(q, template)

    code_render = renderer(dc.code_template) if dc.code_source == "jsonl" else None
    source = dc.path or dc.source
    try:
        if dc.source in ("arith", "chain"):  # synthetic prompts are already model text
            data = from_config(dc, code_render=code_render)
        else:
            data = from_config(dc, template=renderer(dc.template), code_render=code_render)
    except ValueError as e:  # a split the data cannot give (the jsonl case is checked before compute)
        raise ConfigError(f"{source}: {e} (data.val_size {dc.val_size}, data.code_val_size {dc.code_val_size})"
                          ) from None

    lengths: dict[int, int] = {}
    for p in (*data.train, *data.val):
        ids = tok.encode(p.prompt)
        lengths[p.prompt_id] = len(ids) + (bos_id is not None and ids[:1] != [bos_id])
    budget, rule = budgets.resolve_prompt_budget(exp, list(lengths.values()))
    budgets.check_usable(exp, budget, [lengths[p.prompt_id] for p in data.train],
                         [lengths[p.prompt_id] for p in data.val], source)
    data, dropped = drop_long_prompts(data, lambda p: lengths[p.prompt_id], budget)
    dropped = {**dropped, "max_prompt_len": budget, "longest": max(lengths.values()), "rule": rule}
    if rule != "set":
        log(f"[data] rollout.max_prompt_len=auto: {budget} tokens ({rule[len('auto: '):]}); training rows "
            f"{budget} + {exp.rollout.max_new_tokens} = {budget + exp.rollout.max_new_tokens} tokens")
    if dropped["train"] or dropped["val"]:
        log(f"[data] dropped {dropped['train']} training and {dropped['val']} validation prompts longer than "
            f"rollout.max_prompt_len = {budget} tokens (never truncated)")
    if len(data.train) < exp.rollout.prompts_per_batch:
        log(f"[data] warning: {len(data.train)} training prompts, fewer than one batch of rollout.prompts_per_batch "
            f"= {exp.rollout.prompts_per_batch}: every batch repeats prompts")
    log(f"[data] {len(data.train)} training prompts, {len(data.val)} held out for validation "
        f"({dc.source}{': ' + dc.path if dc.path else ''})")
    if data.weights:
        n = {t: sum(p.task == t for p in data.train) for t in data.tasks}
        v = {t: sum(p.task == t for p in data.val) for t in data.tasks}
        log("[data] tasks: " + "; ".join(f"{t} {n[t]} train / {v[t]} val, weight {data.weights[t]:.2f}"
                                         for t in data.tasks))
    return data, dropped


# ---- the code reward's sandbox -----------------------------------------------------------------------------


def code_pool(exp: ExperimentConfig, log=print):
    """The run's :class:`~scalerl_jax.rewards.code_pool.CodePool` when code prompts are mixed in (None otherwise),
    and the sandbox metadata every run records: the isolation actually in use, or that no code runs. Programs run
    unsandboxed only when ``sandbox.isolation`` says ``none``; ``bwrap`` / ``rlimits`` refuse to start without it."""
    sb = exp.sandbox
    meta = {"configured": sb.isolation, "timeout_s": sb.timeout_s, "memory_mb": sb.memory_mb, "workers": sb.workers}
    if exp.data.code_source == "none":
        return None, {**meta, "isolation": "unused (no code prompts)"}
    from scalerl_jax.rewards.code_pool import CodePool
    from scalerl_jax.rewards.code_types import SandboxConfig
    from scalerl_jax.rewards.sandbox import SandboxError

    try:
        pool = CodePool(SandboxConfig(timeout_s=sb.timeout_s, cpu_s=sb.timeout_s, memory_mb=sb.memory_mb,
                                      isolation=sb.isolation, workers=sb.workers), max_error_rate=sb.max_error_rate)
    except SandboxError as e:
        raise ConfigError(f"sandbox.isolation={sb.isolation!r} cannot run here: {e}") from None
    log(f"[sandbox] code rewards run under {pool.sandbox.describe()} ({sb.workers} workers, {sb.timeout_s:g} s)")
    return pool, {**meta, "isolation": pool.isolation, "describe": pool.sandbox.describe()}


# ---- generators --------------------------------------------------------------------------------------------


@dataclass
class Generators:
    """The train and eval generators of a run, the generator devices to count, and what to close at the end."""

    train: Any
    eval: Any
    devices: int = 0  # 0: they share the trainer's devices
    fleet: Any = None
    stack: ExitStack = field(default_factory=ExitStack)

    def close(self) -> None:
        """Stop a local fleet first (so requests still in flight fail at once), then close the clients."""
        try:
            if self.fleet is not None:
                self.fleet.stop()
        finally:
            self.stack.close()


def length_control(exp: ExperimentConfig, encode):
    from scalerl_jax.rollout.protocol import LengthControl

    lc = exp.rollout.length
    if lc.kind != "interruption":
        return None
    if budgets.AUTO in (lc.think_end, lc.interruption_text):
        raise ConfigError("rollout.length.think_end / interruption_text 'auto' are settled from the tokenizer "
                          "(experiments.budgets.resolve_markers) before length control is built")
    return LengthControl(think_end_ids=tuple(encode(lc.think_end)),
                         interruption_ids=tuple(encode(lc.interruption_text)),
                         budget_lo=lc.think_budget_lo, budget_hi=lc.think_budget_hi, answer_budget=lc.answer_budget)


def reward_transform(exp: ExperimentConfig):
    lc = exp.rollout.length
    if lc.kind != "penalty":
        return None
    from scalerl_jax.rewards.length_penalty import length_penalty

    def transform(rewards: np.ndarray, completions) -> np.ndarray:
        lengths = np.asarray([len(c.token_ids) for c in completions], np.float32)
        return np.asarray(length_penalty(rewards, lengths, rewards > 0, lc.penalty_max_len, lc.penalty_cache))

    return transform


def build_generators(plan: ExperimentPlan, params, *, base_dir: Path | None, run_dir: Path, n_val: int,
                     length=None, log=print) -> Generators:
    """The generation back-end ``plan.exp.rollout`` asks for (see the module docstring)."""
    exp = plan.exp
    ro = exp.rollout
    if ro.engine == "embedded" and not ro.local_servers:
        import jax

        from scalerl_jax.rollout.engine import JaxEngine

        # params None: the engines get their first weights from the trainer's push (RLTrainer pushes at start)
        host = None if params is None else jax.tree.map(np.asarray, params)
        n_rows = ro.prompts_per_batch * ro.group_size
        gen_cfg = generator_model(exp)
        train = JaxEngine(gen_cfg, host, max_batch=n_rows, max_len=plan.seq_len, decode_chunk=ro.decode_chunk,
                          seed=exp.train.seed)
        ev = JaxEngine(gen_cfg, host, max_batch=min(1024, n_val * exp.train.eval_samples), max_len=plan.seq_len,
                       decode_chunk=ro.decode_chunk, seed=exp.train.seed + 1)
        return Generators(train, ev)
    from scalerl_jax.rollout.client import RemoteGenerator, SGLangGenerator

    if base_dir is None:
        raise ConfigError("an SGLang fleet needs the base model as an HF directory (with tokenizer.json)")
    gens = Generators(None, None)
    urls = tuple(ro.sglang_urls)
    try:
        if ro.local_servers:
            import jax

            from scalerl_jax.rollout.fleet import LocalFleet

            if any(d.platform != "cpu" for d in jax.devices()):
                raise ConfigError("--generators N starts our CPU test servers beside the trainer, which would share "
                                  "its accelerators; on GPU hosts start real SGLang servers (BUILD.md) and pass "
                                  "--sglang-urls")
            gens.fleet = LocalFleet(base_dir, ro.local_servers, log_dir=run_dir / "fleet",
                                    max_batch=ro.prompts_per_batch * ro.group_size, max_len=plan.seq_len,
                                    decode_chunk=ro.decode_chunk, seed=exp.train.seed, log=log,
                                    extra_server_args=(() if ro.generator_dtype == "same"
                                                       else ("--dtype", generator_model(exp).dtype)))
            gens.fleet.start()
            urls = (gens.fleet.url,)
        client = SGLangGenerator(list(urls), length=length, timeout_s=ro.request_timeout_s,
                                 concurrency=ro.client_concurrency, seed=exp.train.seed)
        gens.stack.callback(client.close)
        remote = RemoteGenerator(client, exp.model, export_dir=run_dir / "weights", tokenizer_dir=base_dir,
                                 keep=ro.keep_exports, dtype=ro.weight_dtype, fleet=gens.fleet, log=log)
        gens.train = gens.eval = remote  # one fleet: eval pushes are no-ops at the version already held
        gens.devices = remote.device_count()
    except BaseException:
        gens.close()
        raise
    log(f"[fleet] generating through {', '.join(urls)} ({gens.devices} generator device(s) counted in compute)")
    return gens


# ---- trainer -----------------------------------------------------------------------------------------------


def build_trainer(plan: ExperimentPlan, params, data, *, tok, generators: Generators | None = None,
                  base_dir: Path | None = None, resume: bool = False, score=None, log=print, channel=None,
                  on_batch=None, forecast=None):
    """An RLTrainer for ``plan`` over ``data``, tokenised by ``tok``, generating with ``generators`` (built here
    from ``plan.exp.rollout`` when None). ``params``: the base weights, an HF checkpoint directory (the trainer
    reads each process's shards from it) or a pytree of arrays."""
    from scalerl_jax.rewards import score as default_score
    from scalerl_jax.train.trainer import RLTrainer

    exp = plan.exp
    run_dir = Path(exp.out_dir)
    length = length_control(exp, tok.encode)
    on_disk = isinstance(params, (str, Path))
    gens = generators or build_generators(plan, None if on_disk else params, base_dir=base_dir, run_dir=run_dir,
                                          n_val=len(data.val), length=length, log=log)
    return RLTrainer(exp, params, data=data, encode=tok.encode, decode=tok.decode, score=score or default_score,
                     pad_id=tok.pad_id, eos_ids=tuple(tok.stop_ids), generator=gens.train, eval_generator=gens.eval,
                     length=length, seq_len=plan.seq_len, run_dir=run_dir, resume=resume,
                     bos_id=getattr(tok, "bos_id", None), reward_transform=reward_transform(exp),
                     generator_devices=gens.devices, log=log, channel=channel, on_batch=on_batch, forecast=forecast)


# ---- the end-to-end run ------------------------------------------------------------------------------------


def run_experiment(plan: ExperimentPlan, *, resume: bool = False, fit: bool = True, log=print,
                   warm_dir: Path | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Base model -> RL -> scaling fit -> report.md, in ``plan.exp.out_dir`` (see the module docstring).

    ``overwrite``: start over in a directory that holds an earlier run's outputs (:func:`check_run_dir`).
    ``warm_dir``: a warm start shared between runs (the leave-one-out variants of one seed). It is trained and
    saved there by the first run that needs it (with ``warmstart_key.json``) and loaded by the others.
    """
    from scalerl_jax import distributed as dist
    from scalerl_jax import hostmem
    from scalerl_jax.compile_cache import use_compile_cache

    use_compile_cache(log=log)  # before the first compile: a re-run loads its programs instead of compiling them
    log(f"[host] {hostmem.describe()}")
    if dist.process_count() > 1 and not dist.is_leader():
        import jax

        from scalerl_jax.train.core import follow_leader

        follow_leader(log=log)  # the leader (process 0) does everything below and drives this process's shards
        return {"ok": True, "follower": True, "process": jax.process_index()}
    channel = dist.Channel() if dist.process_count() > 1 else None
    try:
        out = _lead(plan, resume=resume, fit=fit, log=log, warm_dir=warm_dir, channel=channel, overwrite=overwrite)
    except BaseException as e:
        if channel is not None and not channel.closed:  # followers still waiting: release them with the reason
            channel.send("stop", {"error": f"{type(e).__name__}: {e}"})
        raise
    if channel is not None and not channel.closed:  # only now, after the fit and the report: the followers leave
        channel.send("stop", {"error": None})
    return out


def forecast_report(run_dir: Path, summary: dict, log=print) -> None:
    """The live forecast's history into ``summary`` ("forecast_history", "forecast_baseline") and its figure into
    ``run_dir/fit/forecast.png``."""
    from scalerl_jax.metrics import read_metrics
    from scalerl_jax.scaling.forecast import forecast_history

    rows = read_metrics(run_dir)
    forecasts = [r for r in rows if r.get("kind") == "forecast"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not forecasts:
        return
    key = forecasts[-1].get("compute_key", "device_hours")
    last = evals[-1] if evals else {}
    h = forecast_history(forecasts, last.get(key), last.get("val_reward"))
    summary["forecast_history"] = h
    if "P_A_gt_baseline" in forecasts[-1]:
        f = forecasts[-1]
        summary["forecast_baseline"] = {"dir": summary.get("baseline_dir"), **{
            k: f[k] for k in ("baseline_A_mean", "P_A_gt_baseline", "P_B_gt_baseline", "baseline_rule")}}
    try:
        from scalerl_jax.scaling.plots import plot_forecast, save

        save(plot_forecast(h, compute_label=key), run_dir / "fit", "forecast")
    except Exception as e:  # noqa: BLE001 -- a figure is never a reason to lose the run's summary
        log(f"[run] forecast figure failed: {type(e).__name__}: {e}")


def _lead(plan: ExperimentPlan, *, resume: bool, fit: bool, log, warm_dir: Path | None, channel,
          overwrite: bool = False) -> dict[str, Any]:
    t_start = time.time()
    run_dir = Path(plan.exp.out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_run_dir(run_dir, resume=resume, overwrite=overwrite, log=log)
    check_inputs(plan)
    live = None
    if forecast_runs(plan.exp):
        from scalerl_jax.scaling.live import LiveForecast

        # started now, so that its start-up (JAX import, the sampler's compilation) overlaps the warm start and the
        # model load instead of the first evals
        live = LiveForecast(run_dir, plan.exp.forecast, total_steps=plan.exp.train.steps, seed=plan.exp.train.seed,
                            log=log)
    try:
        return _train_and_report(plan, resume=resume, fit=fit, log=log, warm_dir=warm_dir, channel=channel,
                                 t_start=t_start, run_dir=run_dir, live=live)
    finally:
        if live is not None:
            live.close()


def _train_and_report(plan: ExperimentPlan, *, resume: bool, fit: bool, log, warm_dir: Path | None, channel,
                      t_start: float, run_dir: Path, live) -> dict[str, Any]:
    from scalerl_jax.data.tokenizer import HFTokenizer
    from scalerl_jax.models.hf_io import read_hf_config

    base: BaseModel = prepare_base(plan, run_dir, warm_dir=warm_dir, resume=resume, log=log)
    # the architecture only: the trainer reads the weights itself, each process only its devices' blocks
    _, ckpt_cfg = read_hf_config(base.dir, param_dtype=plan.exp.model.param_dtype)
    exp = plan.exp
    data_cfg = exp.data
    if base.data_path is not None and not exp.data.path:
        data_cfg = R(exp.data, source="jsonl", path=base.data_path)
    exp = R(exp, model=model_from_checkpoint(exp.model, ckpt_cfg), data=data_cfg)
    budgets.check_row_fits_model(exp)
    tok = HFTokenizer(str(base.dir))
    if tok.vocab_size > exp.model.vocab_size:
        raise ConfigError(f"{base.dir}: tokenizer.json has {tok.vocab_size} tokens but the model's vocab_size is "
                          f"{exp.model.vocab_size}")
    tok.model_vocab_size = exp.model.vocab_size  # ids past the tokenizer's are the checkpoint's padding rows
    exp = budgets.resolve_markers(exp, tok, log=log)
    check_tokenized(exp, tok, base.dir)
    data, dropped = load_prompts(exp, tok, tok.bos_id, log=log)
    asked = exp.rollout.max_prompt_len
    exp = R(exp, rollout=R(exp.rollout, max_prompt_len=dropped["max_prompt_len"]))  # auto: the measured budget
    plan = R(plan, exp=exp)
    pool, sandbox = code_pool(exp, log=log)
    try:
        (run_dir / "config.json").write_text(json.dumps({**dataclasses.asdict(exp), "base_model": str(base.dir),
                                                         "sandbox_active": sandbox, "max_prompt_len_asked": asked},
                                                        indent=2, default=str))
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    log(f"[base] {base.dir}: {exp.model.arch} {exp.model.num_params() / 1e6:.2f}M parameters, tokenizer of "
        f"{tok.vocab_size} tokens")
    if channel is not None:  # the followers load the same base weights and build the same train state
        from scalerl_jax.train.core import announce

        announce(channel, exp, base_dir=str(base.dir), seq_len=plan.seq_len, pad_id=tok.pad_id, resume=resume)
    with ExitStack() as stack:
        if pool is not None:
            stack.callback(pool.close)  # last out: after the trainer and the generators
        gens = build_generators(plan, None, base_dir=base.dir, run_dir=run_dir, n_val=len(data.val),
                                length=length_control(exp, tok.encode), log=log)
        stack.callback(gens.close)
        score = None
        if pool is not None:
            from scalerl_jax.rewards import score as default_score

            score = functools.partial(default_score, code_pool=pool)
        lc = exp.rollout.length
        watch = (budgets.ThinkEndWatch(lc.think_end, functools.partial(tok.decode, skip_special_tokens=False), log=log)
                 if lc.kind == "interruption" else None)
        trainer = build_trainer(plan, base.dir, data, tok=tok, generators=gens, resume=resume, log=log,
                                channel=channel, score=score, on_batch=watch, forecast=live)
        if watch is not None:
            watch.metrics = trainer.metrics
        failure: list[str] = []
        stack.callback(lambda: trainer.close(failure[0] if failure else None))
        trainer.metrics.write({"kind": "data", "step": int(trainer.state.step), "n_train": len(data.train),
                               "n_val": len(data.val), "dropped_long_prompts_train": dropped["train"],
                               "dropped_long_prompts_val": dropped["val"], "max_prompt_len": dropped["max_prompt_len"],
                               "max_prompt_len_rule": dropped["rule"], "longest_prompt": dropped["longest"],
                               "max_new_tokens": exp.rollout.max_new_tokens, "seq_len": plan.seq_len})
        try:
            summary = trainer.run()
        except BaseException as e:
            failure.append(f"{type(e).__name__}: {e}")
            raise
    summary.update(warmstart_seconds=base.seconds, warmstart_dir=str(base.dir), base_model=str(base.dir),
                   base_made=base.made, dropped_long_prompts={k: dropped[k] for k in ("train", "val")},
                   prompt_budget={k: dropped[k] for k in ("max_prompt_len", "rule", "longest")}, seq_len=plan.seq_len,
                   length_check=watch.row if watch is not None else None, n_train=len(data.train), n_val=len(data.val),
                   baseline_dir=exp.forecast.baseline,
                   sandbox={**sandbox, **({"runs": pool.stats()} if pool is not None else {})},
                   tasks={t: {"weight": (data.weights or {t: 1.0})[t], "n_train": sum(p.task == t for p in data.train),
                              "n_val": sum(p.task == t for p in data.val)} for t in data.tasks})
    forecast_report(run_dir, summary, log=log)
    fit_summary = None
    if fit:
        from scalerl_jax.scaling.report import fit_runs

        # a run stopped early by --stop-if-worse is fitted on all its evals (its first half holds too few)
        until = 1.0 if summary.get("stopped_early") else 0.5
        log(f"[run] fitting the sigmoid law on {'all' if until == 1.0 else 'the first half'} of the run's compute")
        try:
            fit_summary = fit_runs([run_dir], run_dir / "fit", fit_until=until, num_samples=1000, num_chains=4,
                                   compute_key=exp.forecast.compute_key)
        except Exception as e:  # noqa: BLE001 -- a failed fit must not lose the run; the report says why
            log(f"[run] scaling fit failed: {type(e).__name__}: {e}")
            fit_summary = {"error": f"{type(e).__name__}: {e}"}
    summary["total_seconds"] = time.time() - t_start
    summary["ok"] = True
    (run_dir / "summary.json").write_text(json.dumps({"run": summary, "fit": fit_summary}, indent=2, default=float))
    write_report(run_dir, plan, summary, fit_summary)
    return summary
