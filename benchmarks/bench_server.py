"""Generation throughput through HTTP (our SGLang-API server + SGLangGenerator) vs the in-process engine.

Same model (a preset, randomly initialised with the same seed), same engine settings, same requests (no stop
tokens, so every completion has exactly ``max_new_tokens`` tokens). The in-process engine runs first, then a
server subprocess is started and driven by the client at several concurrencies. Prints a table of tokens/s
and the ratio to the in-process run.

    python -m benchmarks.bench_server                       # tiny preset, 64 prompts x 48 tokens
    python -m benchmarks.bench_server --preset llama_100m --prompts 16 --max-new 32 --max-batch 16
"""

from __future__ import annotations

import argparse
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

from scalerl_jax.models import get_preset, init_params
from scalerl_jax.rollout.client import SGLangGenerator
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def _requests(k: int, vocab: int, prompt_len: int, max_new: int, seed: int) -> list[GenerationRequest]:
    rng = np.random.default_rng(seed)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new)
    return [GenerationRequest(rng.integers(2, vocab, prompt_len).tolist(), sp, request_id=f"b{i}") for i in range(k)]


def _tokens(results) -> int:
    return sum(len(c.token_ids) for cs in results for c in cs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--decode-chunk", type=int, default=8)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--repeats", type=int, default=2, help="timed repeats per row (best is reported)")
    args = p.parse_args(argv)

    cfg = get_preset(args.preset)
    max_len = min(cfg.max_seq_len, args.prompt_len + args.max_new)
    reqs = _requests(args.prompts, cfg.vocab_size, args.prompt_len, args.max_new, seed=1)

    engine = JaxEngine(cfg, init_params(cfg, jax.random.PRNGKey(0)), max_batch=args.max_batch, max_len=max_len,
                       decode_chunk=args.decode_chunk)
    engine.generate(reqs)  # compile
    best = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        n_tok = _tokens(engine.generate(reqs))
        best = min(best, time.perf_counter() - t0)
    rows = [("in-process engine", "-", n_tok, best)]
    del engine

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalerl_jax.serve", "--preset", args.preset, "--init-seed", "0", "--port", str(port),
         "--max-batch", str(args.max_batch), "--max-len", str(max_len), "--decode-chunk", str(args.decode_chunk)],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; log: {log.name}")
            time.sleep(0.2)
        for conc in args.concurrency:
            with SGLangGenerator(url, timeout_s=600, concurrency=conc) as gen:
                gen.generate(reqs)  # compile the batch shapes this concurrency produces
                best = float("inf")
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    n_tok = _tokens(gen.generate(reqs))
                    best = min(best, time.perf_counter() - t0)
            rows.append(("HTTP server + client", str(conc), n_tok, best))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    ref = rows[0][2] / rows[0][3]
    print(f"\n{args.preset}: {args.prompts} prompts x {args.max_new} new tokens, max_batch {args.max_batch}, "
          f"decode_chunk {args.decode_chunk}, {os.cpu_count()} CPUs ({jax.default_backend()})")
    print(f"{'path':<22} {'concurrency':>11} {'tokens':>8} {'seconds':>9} {'tokens/s':>10} {'vs in-process':>14}")
    for name, conc, n, s in rows:
        print(f"{name:<22} {conc:>11} {n:>8} {s:>9.3f} {n / s:>10.0f} {n / s / ref:>14.2f}")


if __name__ == "__main__":
    main()
