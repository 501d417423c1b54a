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
from scalerl_jax.experiments.base_models import BaseModel, check_model_dir, prepare_base
from scalerl_jax.experiments.numerics import model_from_checkpoint
from scalerl_jax.experiments.preflight import check_programs
from scalerl_jax.experiments.presets import ExperimentPlan
from scalerl_jax.experiments.report import write_report
from scalerl_jax.experiments.store import FINISHED, check_run_dir

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


def check_tokenizer(exp: ExperimentConfig, tok, base_dir: Path) -> None:
    """What needs the tokenizer besides the lengths (:func:`experiments.budgets.settle`): the chat template exists
    when asked for, and the tokenizer's vocabulary fits the model's."""
    if exp.data.chat_template and getattr(tok, "chat_template", None) is None:
        raise ConfigError(f"data.chat_template=true but {base_dir} has no chat template (tokenizer_config.json "
                          "'chat_template' or chat_template.jinja)")
    if tok.vocab_size > exp.model.vocab_size:
        raise ConfigError(f"{base_dir}: tokenizer.json has {tok.vocab_size} tokens but the model's vocab_size is "
                          f"{exp.model.vocab_size}")



# ---- prompts -----------------------------------------------------------------------------------------------


def load_prompts(exp: ExperimentConfig, tok):
    """Training and validation problems rendered for ``tok`` (template or chat template), all of them: the prompt
    budget is applied by :func:`experiments.budgets.settle`, which measures them."""
    from scalerl_jax.data.jsonl import make_prompt
    from scalerl_jax.data.pipeline import from_config

    dc = exp.data

    def renderer(template: str):
        if dc.chat_template:
            extra = {} if dc.enable_thinking is None else {"enable_thinking": dc.enable_thinking}
            return lambda q: tok.apply_chat_template([{"role": "user", "content": make_prompt(q, template)}], **extra)
        return lambda q: make_prompt(q, template)

    code_render = renderer(dc.code_template) if dc.code_source == "jsonl" else None
    try:
        if dc.source in ("arith", "chain"):  # synthetic prompts are already model text
            return from_config(dc, code_render=code_render)
        return from_config(dc, template=renderer(dc.template), code_render=code_render)
    except ValueError as e:  # a split the data cannot give (the jsonl case is checked before compute)
        raise ConfigError(f"{dc.path or dc.source}: {e} (data.val_size {dc.val_size}, data.code_val_size "
                          f"{dc.code_val_size})") from None


def log_prompts(exp: ExperimentConfig, data, log=print) -> None:
    """What the run trains and validates on, after the prompt budget."""
    dc = exp.data
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
    """The train and eval generators of a run, the length control they generate under (the trainer's too), the
    generator devices to count, and what to close at the end."""

    train: Any
    eval: Any
    length: Any = None  # the run's LengthControl (experiments.budgets.settle), None without interruption
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
        return Generators(train, ev, length)
    from scalerl_jax.rollout.client import RemoteGenerator, SGLangGenerator

    if base_dir is None:
        raise ConfigError("an SGLang fleet needs the base model as an HF directory (with tokenizer.json)")
    gens = Generators(None, None, length)
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
    length = budgets.length_control(exp, tok.encode) if generators is None else generators.length
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
    tok = HFTokenizer(str(base.dir))
    check_tokenizer(exp, tok, base.dir)
    tok.model_vocab_size = exp.model.vocab_size  # ids past the tokenizer's are the checkpoint's padding rows
    asked = exp.rollout.max_prompt_len
    # every length of the run, in one call: context, markers, length control, completion and prompt budgets
    settled = budgets.settle(exp, tok, load_prompts(exp, tok), log=log)
    exp, length, data, dropped = settled.exp, settled.length, settled.data, settled.dropped
    log_prompts(exp, data, log=log)
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
                                length=length, log=log)
        stack.callback(gens.close)
        score = None
        if pool is not None:
            from scalerl_jax.rewards import score as default_score

            score = functools.partial(default_score, code_pool=pool)
        watch = settled.watch
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
    write_report(run_dir, plan, summary, fit_summary, log=log)  # with the live forecast's history and figure
    # the last file the run writes: it marks the run finished (experiments.store.is_finished)
    (run_dir / FINISHED).write_text(json.dumps({"run": summary, "fit": fit_summary}, indent=2, default=float))
    return summary


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

    exp = plan.exp
    try:
        budgets.check_config(exp)
    except ConfigError as e:
        print(f"[dry-run] error: {e}")
        return 2
    if exp.rollout.max_prompt_len == "auto":  # no data here: compile for the longest prompt the model's context allows
        cap = budgets.prompt_cap(exp)
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
