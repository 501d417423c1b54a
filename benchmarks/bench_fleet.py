"""A fleet of one server vs the in-process engine: generation tokens/s at equal batch, and their ratio.

For each model, one random checkpoint is written and loaded by both sides with the same engine settings:

- in process: ``JaxEngine.generate(requests)``, one call for the whole batch (what the trainer does);
- fleet: one ``python -m scalerl_jax.serve --model CKPT`` subprocess driven over HTTP by
  :class:`~scalerl_jax.rollout.client.sglang.SGLangGenerator`, one ``/generate`` per prompt (``n`` samples each)
  sent concurrently, so the server's continuous batching has to put them back into one batch.

The workload is the tiny RL batch shape (32 prompts x 8 samples, 6-10 prompt tokens, sampled at temperature 1,
no stop token so every completion has exactly ``--max-new`` tokens). Both sides are compiled first (untimed);
then the timed runs alternate (engine, fleet, engine, fleet, ...) so that both see the same machine load, and
each pair gives one ratio. Prints a table with the median and the range over ``--repeats`` pairs.

    python -m benchmarks.bench_fleet                          # tiny and a 4-layer d256 model
    python -m benchmarks.bench_fleet --models tiny --repeats 5
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jax
import numpy as np

from scalerl_jax.models import get_preset, init_params, save_hf_checkpoint
from scalerl_jax.rollout.client import SGLangGenerator
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "tiny": lambda: get_preset("tiny"),  # 4 layers, d 128, ~0.8M parameters
    "d256": lambda: dataclasses.replace(get_preset("tiny"), d_model=256, n_heads=8, n_kv_heads=4, ffn_dim=1024),
}


def _requests(k: int, n: int, vocab: int, max_new: int, seed: int) -> list[GenerationRequest]:
    rng = np.random.default_rng(seed)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new, n=n)
    return [GenerationRequest(rng.integers(2, vocab, int(rng.integers(6, 11))).tolist(), sp, request_id=f"b{i}")
            for i in range(k)]


def _tokens(results) -> int:
    return sum(len(c.token_ids) for cs in results for c in cs)


def _timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    n_tok = _tokens(fn())
    return time.perf_counter() - t0, n_tok


def _start_server(ckpt: Path, args, max_len: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:  # a free loopback port, closed again so that the server can bind it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "scalerl_jax.serve", "--model", str(ckpt), "--port", str(port),
             "--max-batch", str(args.max_batch), "--max-len", str(max_len), "--decode-chunk", str(args.decode_chunk),
             *([] if args.batch_wait_ms is None else ["--batch-wait-ms", str(args.batch_wait_ms)])],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start; log: {log_path}")
        time.sleep(0.2)


def bench_model(name: str, args, tmp: Path) -> dict:
    """Alternating timed runs of the in-process engine and the one-server fleet on model ``name``."""
    cfg = MODELS[name]()
    ckpt = tmp / name
    save_hf_checkpoint(init_params(cfg, jax.random.PRNGKey(0)), cfg, ckpt)
    max_len = min(cfg.max_seq_len, 10 + args.max_new)
    reqs = _requests(args.prompts, args.samples, cfg.vocab_size, args.max_new, seed=1)
    engine = JaxEngine.from_hf(ckpt, max_batch=args.max_batch, max_len=max_len, decode_chunk=args.decode_chunk)
    proc, url = _start_server(ckpt, args, max_len, tmp / f"{name}-server.log")
    eng_s, fleet_s = [], []
    try:
        with SGLangGenerator(url, timeout_s=600, concurrency=args.prompts) as gen:
            for _ in range(args.warmup):  # compile every shape either side will see
                engine.generate(reqs)
                gen.generate(reqs)
            for _ in range(args.repeats):
                t, n_tok = _timed(lambda: engine.generate(reqs))
                eng_s.append(t)
                t, n_fleet = _timed(lambda: gen.generate(reqs))
                fleet_s.append(t)
                assert n_fleet == n_tok == args.prompts * args.samples * args.max_new, (n_fleet, n_tok)
        stats = httpx.get(url + "/stats", timeout=10).json()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    eng_tps, fleet_tps = n_tok / np.array(eng_s), n_tok / np.array(fleet_s)
    return {"model": name, "params": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(engine._params)),
            "tokens": n_tok, "engine": eng_tps, "fleet": fleet_tps, "ratio": fleet_tps / eng_tps,
            "max_running_rows": stats.get("max_running_rows"), "chunks": stats.get("decode_chunks")}


def _fmt(a: np.ndarray, spec: str) -> str:
    return f"{np.median(a):{spec}} [{a.min():{spec}}-{a.max():{spec}}]"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny,d256", help=f"comma-separated, from {sorted(MODELS)}")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8, help="n per prompt")
    p.add_argument("--max-new", type=int, default=24)
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--decode-chunk", type=int, default=8)
    p.add_argument("--batch-wait-ms", type=float, default=None, help="the server's --batch-wait-ms (default: its own)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds of both sides (compilation)")
    p.add_argument("--repeats", type=int, default=5, help="timed (engine, fleet) pairs per model")
    args = p.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            rows.append(bench_model(name, args, Path(d)))
    print(f"\n{args.prompts} prompts x {args.samples} samples x {args.max_new} new tokens, max_batch "
          f"{args.max_batch}, decode_chunk {args.decode_chunk}; {os.cpu_count()} CPUs ({jax.default_backend()}); "
          f"median [min-max] of {args.repeats} alternating pairs")
    print(f"{'model':<6} {'params':>8} {'tokens':>7} {'in-process tok/s':>22} {'1-server fleet tok/s':>22} "
          f"{'fleet / in-process':>20} {'max rows':>8}")
    for r in rows:
        print(f"{r['model']:<6} {r['params'] / 1e6:>7.2f}M {r['tokens']:>7} {_fmt(r['engine'], '.0f'):>22} "
              f"{_fmt(r['fleet'], '.0f'):>22} {_fmt(r['ratio'], '.2f'):>20} {r['max_running_rows']:>8}")


if __name__ == "__main__":
    main()
