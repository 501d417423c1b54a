"""``python -m scalerl_jax.serve``: the SGLang-API HTTP server for the embedded JAX engine.

Examples::

    python -m scalerl_jax.serve --preset tiny --port 30000            # random-init tiny model
    python -m scalerl_jax.serve --model runs/ckpt/step_100 --port 30001 --max-batch 64
    python -m scalerl_jax.serve --help                                # every flag, its type and default

The API (SGLang's native routes and our extension fields) is documented in
:mod:`scalerl_jax.rollout.server`. Put several servers behind ``sglang-router``::

    python -m sglang_router.launch_router --worker-urls http://127.0.0.1:30000 http://127.0.0.1:30001 \\
        --policy round_robin --host 127.0.0.1 --port 31000
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

DESCRIPTION = """\
Serve a Llama-shaped model from the embedded JAX engine over SGLang's native HTTP API (/generate,
/update_weights_from_disk, /pause_generation, /continue_generation, /get_weight_version, /health, /get_model_info,
...). Give exactly one of --preset and --model."""

_SOURCE = tyro.conf.create_mutex_group(required=True, title="model (exactly one)")


@dataclass(frozen=True)
class ServeArgs:
    """The server's flags."""

    preset: Annotated[str | None, _SOURCE, tyro.conf.arg(metavar="NAME")] = None
    """model preset from scalerl_jax.models.presets (tiny, llama_100m, 8b, tiny_moe, scout, ...), randomly
    initialised with --init-seed"""
    model: Annotated[str | None, _SOURCE, tyro.conf.arg(aliases=("--model-path",), metavar="DIR")] = None
    """HF checkpoint directory (config.json + safetensors, tokenizer.json): LlamaForCausalLM, Qwen2ForCausalLM,
    Qwen3ForCausalLM, Qwen3MoeForCausalLM or Llama4ForCausalLM"""
    init_seed: int = 0
    """PRNG seed of the random init (with --preset)"""
    host: str = "127.0.0.1"
    """address to bind"""
    port: int = 30000
    """port to bind"""
    max_batch: int = 64
    """most samples decoded together by the engine"""
    max_len: int | None = None
    """KV-cache length per sample (prompt + max_new_tokens); None: the model's max_seq_len"""
    decode_chunk: int = 8
    """decode steps per jitted call; pauses and weight swaps happen between chunks"""
    seed: int = 0
    """sampling seed of the engine"""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """compute and weight dtype of the engine (SGLang's --dtype); auto: the preset's, or for --model compute in
    the checkpoint's torch_dtype over float32 weights. The LM head keeps the model config's head_dtype"""
    weight_version: int = 0
    """version tag of the initial weights"""
    batch_wait_ms: float = 20.0
    """idle engine: start once requests have stopped arriving for this long (at most 10x this), so that a burst
    starts as one batch; later requests join the running batch"""
    debug_chunk_delay_ms: float = 0.0
    """testing aid: sleep this long after every decode chunk (to act on a running batch)"""
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    """uvicorn and server log level"""
    parent_pid: int | None = None
    """exit as soon as this process is no longer our parent (it died and we were re-parented): a fleet's servers
    must not outlive an experiment that was SIGKILLed"""
    print_config: bool = False
    """print the resolved flags as JSON and exit"""


def parse_args(argv: list[str] | None = None) -> ServeArgs:
    """The command line (``--help``): tyro over :class:`ServeArgs`; a wrong type or value exits naming the flag."""
    return tyro.cli(ServeArgs, args=argv, prog="python -m scalerl_jax.serve", description=DESCRIPTION)


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> threading.Thread:
    """Start a daemon thread that hard-exits this process once ``parent_pid`` is no longer its parent.

    Polling ``os.getppid()`` rather than ``prctl(PR_SET_PDEATHSIG)``: the death signal fires when the *thread*
    that forked us exits, which would kill a fleet's servers started from a short-lived thread; and comparing
    the parent pid cannot be fooled by pid reuse (an orphan is re-parented to init or a subreaper).
    """

    def run() -> None:
        while True:
            if os.getppid() != parent_pid:
                print(f"parent process {parent_pid} is gone: exiting", file=sys.stderr, flush=True)
                os._exit(3)  # no graceful shutdown: nobody is left to serve, and it must not hang
            time.sleep(interval_s)

    t = threading.Thread(target=run, name="parent-watchdog", daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    """Start the server; returns the exit status."""
    args = parse_args(argv)
    if args.print_config:
        print(json.dumps(dataclasses.asdict(args), indent=2))
        return 0
    if args.parent_pid is not None:
        watch_parent(args.parent_pid)  # before the slow imports and model load: the parent may die meanwhile
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import jax
    import uvicorn

    from scalerl_jax.compile_cache import use_compile_cache
    from scalerl_jax.models import init_params
    from scalerl_jax.models.hf_io import CheckpointError, load_hf_checkpoint
    from scalerl_jax.models.presets import get_preset
    from scalerl_jax.rollout.engine import JaxEngine
    from scalerl_jax.rollout.server import ServerInfo, create_app

    use_compile_cache(log=print)  # a restarted server loads its prefill and decode programs instead of compiling
    tokenizer = None
    tokenizer_path = None
    try:
        if args.preset:
            cfg = get_preset(args.preset)
            params = init_params(cfg, jax.random.PRNGKey(args.init_seed))
            model_path = f"preset:{args.preset}"
            if args.preset == "tiny":
                from scalerl_jax.data.tokenizer import CharTokenizer

                tokenizer = CharTokenizer()
        else:
            params, cfg = load_hf_checkpoint(args.model)
            model_path = str(Path(args.model).resolve())
            if (Path(args.model) / "tokenizer.json").exists():
                from scalerl_jax.data.tokenizer import HFTokenizer

                tokenizer = HFTokenizer(args.model)
                tokenizer.model_vocab_size = max(tokenizer.vocab_size, cfg.vocab_size)  # padding rows: no text
                tokenizer_path = model_path
            elif cfg.vocab_size == 17:
                from scalerl_jax.data.tokenizer import CharTokenizer

                tokenizer = CharTokenizer()
    except (KeyError, CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dtype != "auto":
        cfg = dataclasses.replace(cfg, dtype=args.dtype, param_dtype=args.dtype)
    engine = JaxEngine(cfg, params, max_batch=args.max_batch, max_len=args.max_len or cfg.max_seq_len,
                       decode_chunk=args.decode_chunk, seed=args.seed, version=args.weight_version)
    app = create_app(engine, ServerInfo(model_path, tokenizer_path), tokenizer=tokenizer,
                     batch_wait_s=args.batch_wait_ms / 1000.0, chunk_delay_s=args.debug_chunk_delay_ms / 1000.0)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
