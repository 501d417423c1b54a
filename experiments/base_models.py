"""The base model a run starts from: the user's HF directory (``--model``), or one a preset makes for itself.

Either way the result is the same kind of directory (config.json + safetensors + tokenizer.json +
tokenizer_config.json), and the rest of the run path reads only that directory: one path for every preset.

Presets that make their own (``ExperimentPlan.base_kind``):

- ``char_arith`` (tiny, smoke, the MoE twins): the 17-symbol character tokenizer and a supervised warm start on
  the synthetic task ``a+b*c=`` (DESIGN.md "The tiny default").
- ``char_mathcode`` (tiny_mathcode): a 24-symbol character tokenizer (the 17 above plus ``-x(),:f``) and a
  supervised warm start on the same arithmetic and the synthetic code task ``f(0)=b,f(1)=c:`` in equal parts
  (:mod:`scalerl_jax.data.code_synth`).
- ``char_chain`` (tiny_chain): the same 17-symbol tokenizer and a supervised warm start on addition chains
  ``a+b+c+...=`` of the run's depths (:mod:`scalerl_jax.data.chain`), on ``n_problems`` chains of the run's own
  training stream (it begins with the RL pool; never a validation chain).
- ``word_arith`` (small): the same arithmetic written as English word problems with ``\\boxed{}`` answers
  (:mod:`scalerl_jax.data.word_arith`) in a jsonl file, a byte-level BPE trained on that text with the
  ``tokenizers`` library, and a supervised warm start on the question/answer rows: a small Llama that then goes
  through ``--model``/``--data``/math-verify/SGLang-fleet exactly as a user's model would.

A warm start is reused when the run is resumed, or when ``warm_dir`` (shared by the leave-one-out variants of one
seed) holds one made for the same settings (``warmstart_key.json``; a mismatch is refused, naming the fields).
Across runs, every warm start a run makes is also kept in a cache by its key (:func:`warm_cache_dir`, default
``~/.cache/scalerl_jax/warmstarts/<hash of the key and of the code that makes it>``), and a later run with the same
key copies it instead of training it again (the seed is in the key: each seed has its own).
``SCALERL_WARMSTART_CACHE=0`` turns the cache off; ``SCALERL_WARMSTART_CACHE=DIR`` moves it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl_jax.experiments.presets import ExperimentPlan

from scalerl_jax.config import ConfigError

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


def shared_warm_start(plan: ExperimentPlan, shared: Path) -> Path | None:
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


@dataclass(frozen=True)
class BaseModel:
    """Where the run's starting policy is, and the data a preset made beside it (None: the plan's own data)."""

    dir: Path
    data_path: str | None = None
    seconds: float = 0.0  # time spent making it (0: given, or reused)
    made: bool = False  # made by this run (a warm start ran)


def check_model_dir(path: str | Path, flag: str = "--model") -> Path:
    """An HF checkpoint directory the run can use, or a :class:`ConfigError` naming what is missing, before any
    compute is spent."""
    from scalerl_jax.models.hf_io import CheckpointError, config_from_hf

    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{flag} {path}: not a directory (expected an HF checkpoint directory with config.json, "
                          "*.safetensors and tokenizer.json)")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ConfigError(f"{flag} {path}: no config.json in the directory")
    try:
        config_from_hf(json.loads(cfg.read_text()), str(cfg))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg}: invalid JSON ({e})") from e
    except CheckpointError as e:
        raise ConfigError(str(e)) from e
    if not list(p.glob("*.safetensors")):
        raise ConfigError(f"{flag} {path}: no *.safetensors weights in the directory")
    if not (p / "tokenizer.json").is_file():
        raise ConfigError(f"{flag} {path}: no tokenizer.json in the directory (the run needs the tokenizer the "
                          "model was trained with; save it beside the weights, e.g. tokenizer.save_pretrained(DIR))")
    return p


def prepare_base(plan: ExperimentPlan, run_dir: Path, *, warm_dir: Path | None = None, resume: bool = False,
                 log=print) -> BaseModel:
    """The run's base model directory: ``plan.base_model`` when given, else the one the preset makes (trained
    now, or reused from ``run_dir/warmstart`` on resume, or from ``warm_dir`` when shared)."""
    if plan.base_model:
        return BaseModel(check_model_dir(plan.base_model))
    if plan.base_kind == "none":
        raise ConfigError(f"preset {plan.exp.name!r} does not make its own base model: pass --model HF_DIR (an HF "
                          "checkpoint directory with its tokenizer.json)")
    ws_dir = Path(warm_dir) if warm_dir is not None else run_dir / "warmstart"
    data_path = str(ws_dir / "word_arith.jsonl") if plan.base_kind == "word_arith" else None
    shared = shared_warm_start(plan, ws_dir) if warm_dir is not None else None
    # a shared warm start is reused only once its key file marks it finished and matching
    if shared is not None or (warm_dir is None and resume and (ws_dir / "tokenizer.json").exists()
                              and (ws_dir / "config.json").exists()):
        log(f"[base] reusing the warm start in {ws_dir}")
        return BaseModel(ws_dir, data_path)
    if plan.base_kind not in ("char_arith", "char_mathcode", "char_chain", "word_arith"):
        raise ConfigError(f"ExperimentPlan.base_kind: unknown {plan.base_kind!r}")
    key = warm_start_key(plan)
    cached = cached_warm_start(key)
    if cached is not None:
        if ws_dir.exists():
            shutil.rmtree(ws_dir)
        shutil.copytree(cached, ws_dir)
        log(f"[base] reusing the warm start made earlier with the same settings ({cached}; "
            "SCALERL_WARMSTART_CACHE=0 trains it again)")
        return BaseModel(check_model_dir(ws_dir, "base model"), data_path)
    t0 = time.time()
    if plan.base_kind == "word_arith":
        _make_word_arith(plan, ws_dir, run_dir, log)
    else:
        _make_char_arith(plan, ws_dir, run_dir, log)
    # written last: its presence marks the warm start finished (shared by the variants of a study, and cached)
    (ws_dir / "warmstart_key.json").write_text(json.dumps(key, indent=2))
    _cache_warm_start(ws_dir, key, log)
    # from here on the made directory is treated exactly like one given with --model
    return BaseModel(check_model_dir(ws_dir, "base model"), data_path, seconds=time.time() - t0, made=True)


def warm_cache_dir() -> Path | None:
    """The cache of finished warm starts: ``SCALERL_WARMSTART_CACHE`` (``0``: none), else
    ``$XDG_CACHE_HOME/scalerl_jax/warmstarts`` (default ``~/.cache/scalerl_jax/warmstarts``)."""
    env = os.environ.get("SCALERL_WARMSTART_CACHE", "").strip()
    if env.lower() in ("0", "false", "no", "off"):
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scalerl_jax" / "warmstarts"


#: the code a warm start depends on (packages and modules, by import name): a change in any of their files makes the
#: cached warm starts stale. This module holds the key, the makers and WARM_HEAD_DTYPE; scalerl_jax.config the
#: defaults of what the makers build (the warm start's TrainConfig); sharding and kernels are what the model's layers
#: call. tests/test_base_models.py checks that a warm start imports no other module of the project.
WARM_CODE = ("scalerl_jax.config", "scalerl_jax.sharding", "scalerl_jax.kernels", "scalerl_jax.data",
             "scalerl_jax.models", "scalerl_jax.train", "scalerl_jax.experiments.base_models")


def code_digest() -> str:
    """sha256 over the files of :data:`WARM_CODE`, each named by its path inside the package, so that a wheel
    install and a checkout of the same code agree."""
    h = hashlib.sha256()
    for name in WARM_CODE:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"the warm start's code {name} is not importable")
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if spec.submodule_search_locations else [origin]
        for f in files:
            h.update(f"{name}:{f.relative_to(origin.parent).as_posix()}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cache_name(key: dict) -> str:
    """The cache folder of a warm start made with ``key`` (:func:`warm_start_key`): a hash of the settings and of
    the code that trains on them (:func:`code_digest`)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode() + code_digest().encode()).hexdigest()[:16]


def cached_warm_start(key: dict) -> Path | None:
    """The cached warm start made with ``key`` (its key file equal, not just its hash), or None."""
    root = warm_cache_dir()
    d = root / cache_name(key) if root is not None else None
    try:
        if d is None or json.loads((d / "warmstart_key.json").read_text()) != key:
            return None
    except (OSError, ValueError):
        return None
    return d


def _cache_warm_start(ws_dir: Path, key: dict, log) -> None:
    """Copy a finished warm start into the cache (a temporary folder renamed into place: a killed copy is never
    mistaken for a finished one). A cache that cannot be written is reported and skipped."""
    root = warm_cache_dir()
    if root is None:
        return
    dest = root / cache_name(key)
    tmp = root / f".{dest.name}.{os.getpid()}.partial"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(ws_dir, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"[base] the warm start was not cached ({root}: {e}); the next run with these settings trains it again")


WARM_PER_TASK = 20000  # char_mathcode: warm-start problems per task (the code task's are repeated to match)


def _make_char_arith(plan: ExperimentPlan, ws_dir: Path, run_dir: Path, log) -> None:
    from scalerl_jax.data.code_synth import FX_SYMBOLS
    from scalerl_jax.data.pipeline import build_prompt_data, code_split
    from scalerl_jax.data.tokenizer import CHAR_SYMBOLS, HFTokenizer
    from scalerl_jax.data.tokenizer_build import save_char_tokenizer
    from scalerl_jax.models.hf_io import save_hf_checkpoint
    from scalerl_jax.train.warmstart import warm_start

    exp = plan.exp
    code = plan.base_kind == "char_mathcode"
    if code != (exp.data.code_source == "synthetic"):
        raise ConfigError(f"base_kind {plan.base_kind!r} with data.code_source={exp.data.code_source!r}: the "
                          "character base models know the synthetic code task only as 'char_mathcode' (its "
                          "vocabulary) with code_source='synthetic'")
    source = "chain" if plan.base_kind == "char_chain" else "arith"
    if exp.data.source != source:
        raise ConfigError(f"base_kind {plan.base_kind!r} warm-starts on data.source={source!r}, but the run's "
                          f"data.source is {exp.data.source!r}")
    save_char_tokenizer(ws_dir, model_max_length=exp.model.max_seq_len, symbols=FX_SYMBOLS if code else CHAR_SYMBOLS)
    tok = HFTokenizer(str(ws_dir))
    # chains: a longer prefix of the run's own training stream (the RL pool comes first; never a validation chain)
    n_train = max(plan.n_problems, exp.data.n_train or 0) if source == "chain" else exp.data.n_train
    data = build_prompt_data(source, val_size=exp.data.val_size, seed=exp.data.seed, n_train=n_train,
                             chain_depths=(exp.data.chain_depth_lo, exp.data.chain_depth_hi),
                             arith_b_max=exp.data.arith_b_max)
    problems = data.train
    if code:  # both tasks in equal parts; the RL run's own splits, so the warm start never sees a validation prompt
        code_train, _ = code_split("synthetic", val_size=exp.data.code_val_size, seed=exp.data.seed)
        n = min(len(problems), WARM_PER_TASK)
        problems = problems[:n] + (code_train * -(-n // len(code_train)))[:n]
    log(f"[base] supervised warm start: {plan.warm_steps} steps x {plan.warm_batch} on {len(problems)} synthetic "
        f"{source} problems{' (half arithmetic, half code)' if code else ''}")
    params = warm_start(dataclasses.replace(exp.model, head_dtype=WARM_HEAD_DTYPE), problems, encode=tok.encode,
                        eos_id=tok.eos_id, pad_id=tok.pad_id, seq_len=plan.warm_seq_len, steps=plan.warm_steps,
                        batch_size=plan.warm_batch, lr=plan.warm_lr, warmup=plan.warm_warmup, seed=exp.train.seed,
                        log=log, log_path=run_dir / "warmstart.jsonl", unmarked_frac=plan.warm_unmarked_frac)
    save_hf_checkpoint(params, exp.model, ws_dir)  # a real HF checkpoint: the RL run's base model


def word_arith_model(plan: ExperimentPlan, tok) -> object:
    """The preset's model config with the vocabulary and special ids of the tokenizer trained for it."""
    return dataclasses.replace(plan.exp.model, vocab_size=tok.vocab_size, bos_token_id=tok.bos_id,
                               eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)


def _make_word_arith(plan: ExperimentPlan, ws_dir: Path, run_dir: Path, log) -> None:
    from scalerl_jax.data.pipeline import build_prompt_data
    from scalerl_jax.data.tokenizer import HFTokenizer
    from scalerl_jax.data.tokenizer_build import train_bpe_tokenizer
    from scalerl_jax.data.word_arith import box_the_product, corpus, word_arith_rows, write_jsonl
    from scalerl_jax.models.hf_io import save_hf_checkpoint
    from scalerl_jax.train.warmstart import warm_start

    exp = plan.exp
    ws_dir.mkdir(parents=True, exist_ok=True)
    rows = word_arith_rows(plan.n_problems, seed=exp.data.seed, b_max=plan.arith_b_max)
    data_path = write_jsonl(rows, ws_dir / "word_arith.jsonl")
    train_bpe_tokenizer(corpus(rows, exp.data.template), ws_dir, vocab_size=plan.bpe_vocab,
                        model_max_length=plan.warm_seq_len)
    tok = HFTokenizer(str(ws_dir))
    mcfg = word_arith_model(plan, tok)
    # the RL run's own split of the same file: the warm start never sees a validation problem
    data = build_prompt_data("jsonl", path=str(data_path), val_size=exp.data.val_size, seed=exp.data.seed,
                             template=exp.data.template)
    log(f"[base] wrote {len(rows)} word problems to {data_path}; BPE tokenizer of {tok.vocab_size} tokens; "
        f"supervised warm start: {plan.warm_steps} steps x {plan.warm_batch} on {len(data.train)} problems "
        f"({mcfg.num_params() / 1e6:.2f}M parameters)")
    params = warm_start(dataclasses.replace(mcfg, head_dtype=WARM_HEAD_DTYPE), data.train, encode=tok.encode,
                        eos_id=tok.eos_id, pad_id=tok.pad_id, seq_len=plan.warm_seq_len, steps=plan.warm_steps,
                        batch_size=plan.warm_batch, lr=plan.warm_lr, warmup=plan.warm_warmup, seed=exp.train.seed,
                        log=log, log_path=run_dir / "warmstart.jsonl", unmarked_frac=plan.warm_unmarked_frac,
                        unmark=box_the_product)
    save_hf_checkpoint(params, mcfg, ws_dir)
