"""Weight sync per push: trainer params -> HF checkpoint on disk -> in-flight update of an SGLang-API server, against
the in-process engine's update of the same params, for the tiny model and a ~124M Llama, measured in one run.

    python -m benchmarks.bench_weight_sync                  # tiny and llama_100m, 3 pushes each
    python -m benchmarks.bench_weight_sync --presets tiny --pushes 5 --dtype bfloat16

Per push it times the export (:func:`scalerl_jax.models.save_hf_checkpoint` + tokenizer files), the HTTP push
(``pause_generation`` -> ``update_weights_from_disk`` -> ``continue_generation``, the server loading the
safetensors) and the whole :meth:`RemoteGenerator.update_weights`; the reference is
:meth:`JaxEngine.update_weights` with the params pytree (what the embedded engine does every step). The server is
one ``python -m scalerl_jax.serve`` started by :class:`~scalerl_jax.rollout.fleet.LocalFleet` (no router).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "llama_100m"], help="scalerl_jax.models presets")
    ap.add_argument("--pushes", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="exported tensor dtype")
    a = ap.parse_args()

    import jax
    import numpy as np

    from scalerl_jax.data.tokenizer_build import save_char_tokenizer
    from scalerl_jax.models import init_params, save_hf_checkpoint
    from scalerl_jax.models.presets import get_preset
    from scalerl_jax.rollout.client import RemoteGenerator, SGLangGenerator
    from scalerl_jax.rollout.engine import JaxEngine
    from scalerl_jax.rollout.fleet import LocalFleet

    rows = []
    for name in a.presets:
        cfg = get_preset(name)
        tmp = Path(tempfile.mkdtemp(prefix=f"bench_sync_{name}_"))
        params = jax.tree.map(np.asarray, init_params(cfg, jax.random.PRNGKey(0)))
        base = tmp / "base"
        save_hf_checkpoint(params, cfg, base)
        save_char_tokenizer(base)  # any tokenizer.json: the server only needs one to start
        engine = JaxEngine(cfg, params, max_batch=8, max_len=64)
        ref = []
        for v in range(1, a.pushes + 1):
            t0 = time.perf_counter()
            engine.update_weights(params, v)
            jax.block_until_ready(engine._current()[0])
            ref.append(time.perf_counter() - t0)
        with LocalFleet(base, 1, log_dir=tmp / "fleet", router=False, max_batch=8, max_len=64,
                        log=lambda s: None) as fleet:
            client = SGLangGenerator([fleet.url])
            remote = RemoteGenerator(client, cfg, export_dir=tmp / "weights", tokenizer_dir=base, dtype=a.dtype,
                                     fleet=fleet)
            total, export, push = [], [], []
            for v in range(1, a.pushes + 1):
                t0 = time.perf_counter()
                remote.update_weights(params, v)
                total.append(time.perf_counter() - t0)
                export.append(remote.sync["weight_sync_export_seconds"])
                push.append(remote.sync["weight_sync_seconds"] - remote.sync["weight_sync_export_seconds"])
            held = client.server_weight_versions()
            assert set(held.values()) == {str(a.pushes)}, held  # the server really holds the last push
            nbytes = remote.sync["weight_sync_bytes"]
            remote.close()
        med = statistics.median
        rows.append((name, cfg.num_params() / 1e6, nbytes / 1e6, med(export), med(push), med(total), med(ref),
                     min(total), max(total)))
    print(f"\nweight sync per push ({a.pushes} pushes, median; export dtype {a.dtype})\n")
    print("| model | params (M) | bytes (MB) | export s | HTTP push + load s | total s | in-process s | "
          "total / in-process | total range s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, p, b, e, h, t, r, lo, hi in rows:
        print(f"| {n} | {p:.1f} | {b:.1f} | {e:.3f} | {h:.3f} | {t:.3f} | {r:.4f} | {t / max(r, 1e-9):.0f}x | "
              f"{lo:.3f}-{hi:.3f} |")


if __name__ == "__main__":
    main()
