"""One-command GPU check: kernel tests compiled on the GPU, train-step MFU, engine decode speed, kernels vs their
references; one table, also written as JSON.

    bash benchmarks/gpu_check.sh --out gpu_check.json         # one GPU, about 10 minutes
    bash benchmarks/gpu_check.sh --cpu-smoke --out x.json     # every section at tiny sizes on CPU
    bash benchmarks/offline_image_venv.sh --out x.json        # the CPU smoke inside a copy of the GPU image's Python

Sections, in this order. Each runs in its own process with its own timeout (``benchmarks/gpu_check_driver.py``):
one that would not fit the time left is reported as skipped; one that fails, crashes or times out is an error row
and the rest still run; the JSON is rewritten after every section, so a run stopped from outside keeps what
finished. The exit status is 1 if any row is an error.

1. ``kernel_tests``: ``pytest tests/test_kernel_*.py`` (every kernel test file, found by pattern) with
   ``SCALERL_PALLAS_INTERPRET=0`` on the GPU, so the Pallas kernels are compiled, not interpreted (``1`` in the
   CPU smoke run), and ``JAX_DEFAULT_MATMUL_PRECISION=highest`` so that the float32 references the kernels are
   compared with are IEEE float32, not TF32. One row per test file; a file that cannot be collected (an import
   missing on the machine) is one error row and the other files still run.
2. ``device``: backend, device kind, the bf16 dense peak assumed for MFU (a datasheet table: H100 / H200 SXM
   989 TFLOP/s; a device not in the table uses the measured matmul rate instead) and the measured rate of a
   ``--matmul-n`` cubed matmul (bf16 on GPU, float32 on CPU). Without a GPU backend (and not ``--cpu-smoke``) it
   is an error and the later sections do not run.
3. ``train``: the project's RL train step (``rl_loss`` with CISPO, ``make_train_step`` + ``jit_train_step`` on a
   one-device mesh, AdamW, state donated) for ``--train-model`` (Llama-3.2-1B shapes) in bf16 compute with the
   float32 LM head at the preset's ``head_matmul_impl``, ``--train-batch`` x ``--train-seq`` tokens per step
   (2 x 4096 = 8k). MFU (6N basis) =
   6 N tokens / step time / peak, N = the parameters that take part in a matmul per token (layers + LM head; the
   embedding lookup is not a matmul; a tied embedding counts once, as the head), = ``flops_per_token(0) / 2``.
   ``mfu_with_attention`` adds causal attention's FLOPs (3 x ``ModelConfig.flops_per_token(T)``). Memory: XLA's
   ``memory_analysis()`` of the compiled step and, where the device reports it, its peak bytes in use.
4. ``decode`` (one process per model): the embedded engine (``JaxEngine``) generating ``--decode-new`` greedy
   tokens after ``--decode-prompt``-token prompts for ``--decode-batch`` rows, random weights stored in bf16, FP32
   head, no stop token (every row generates exactly ``--decode-new`` tokens), for a 1B- and an 8B-shaped model;
   tokens/s = generated tokens / wall time of ``generate`` (prefill included), best of ``--decode-reps`` after a
   warm-up.
5. ``impl``: every ``ModelConfig`` field named ``*_impl`` whose choices include ``"reference"`` (today
   ``attention_impl`` and ``head_matmul_impl``: the FP32 head's matmul at IEEE float32 or as
   float32 sums of bf16 products, ``scalerl_jax/models/head_matmul.py``), each non-reference choice against
   ``"reference"`` on the same model cut to ``--impl-layers`` layers: the RL loss's value and gradient
   (jitted), median time, compiled temp memory, and the loss's relative difference from the reference. A choice
   the config or the backend refuses (``ValueError``; in the CPU smoke run any failure, since GPU-only kernels
   cannot run there) is reported as ``unavailable`` with the reason.

Everything imported here and by the kernel tests is on the GPU machines' offline image (jax, numpy, optax,
orbax-checkpoint, numpyro, chex, flax, safetensors, pytest); ``benchmarks/offline_image_venv.sh`` rehearses the
CPU smoke run in a virtual environment holding only those. On one H200 every section ran in 363 s of a 420 s
budget (docs/results/gpu_check.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
import typing
from pathlib import Path

from scalerl_jax.benchmarks.gpu_check_driver import run_check
from scalerl_jax.benchmarks.gpu_check_report import GPU, IMPL_CHOICE_MIN_S, SMOKE, Budget, Report, Sizes

# Dense bf16 tensor-core peaks (NVIDIA datasheets, SXM parts, no sparsity), matched against jax's device_kind.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "B200": 2250e12, "GB200": 2500e12}


# --quick: this check's share of one 10-minute GPU slot beside benchmarks/gpu_rl.sh (--budget-s 300), each script's
# start-up (python, the package check, jax's first import) included
QUICK_BUDGET_S = 270.0


def quick(sizes: Sizes) -> Sizes:
    """``sizes`` for a second run: the 1B decode only, fewer timed repetitions (the sections and shapes unchanged)."""
    return dataclasses.replace(sizes, decode_models=sizes.decode_models[:1], train_steps=min(sizes.train_steps, 3),
                               decode_reps=1, impl_reps=min(sizes.impl_reps, 3))


def _median_time(fn, reps: int) -> float:
    """Median wall seconds of ``fn()`` (which must block until its results are ready), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _model_cfg(name: str, sizes: Sizes, **overrides):
    """The preset ``name`` with ``overrides``; in the CPU smoke run cut to tiny widths (same structure: GQA,
    tied or untied head, llama3 RoPE) so every code path runs in seconds."""
    from scalerl_jax.models.presets import get_preset

    cfg = get_preset(name)
    if sizes.shrink:
        cfg = dataclasses.replace(cfg, vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                  ffn_dim=64, attn_chunk=16)
    return dataclasses.replace(cfg, **overrides)


# ---- 2. device and peak ---------------------------------------------------------------------------------


def device_peak(rep: Report, sizes: Sizes, gpu: bool) -> float:
    """Record the device, measure a matmul, return the peak FLOP/s that MFU is computed against."""
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    if gpu and dev.platform != "gpu":
        raise RuntimeError(f"no GPU backend: jax.devices() = {jax.devices()}; use --cpu-smoke on a CPU")
    rep.meta.update(backend=jax.default_backend(), device_kind=dev.device_kind, n_devices=jax.device_count(),
                    jax_version=jax.__version__)
    dt = jnp.bfloat16 if dev.platform == "gpu" else jnp.float32
    n = sizes.matmul_n
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dt)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dt)
    mm = jax.jit(jnp.matmul)
    t = min(_median_time(lambda: mm(a, b).block_until_ready(), 3) for _ in range(2))
    measured = 2.0 * n**3 / t
    rep.add("device", f"matmul {n}^3 {jnp.dtype(dt).name}", measured / 1e12, "TFLOP/s", dev.device_kind)
    peak, source = measured, "measured matmul (device not in the datasheet table)"
    for kind, p in PEAK_BF16.items():
        if dev.platform == "gpu" and kind.lower() in dev.device_kind.lower():
            peak, source = p, f"datasheet dense bf16 peak of {kind}"
    rep.meta.update(peak_flops=peak, peak_source=source)
    rep.add("device", "peak assumed for MFU", peak / 1e12, "TFLOP/s", source)
    return peak


def _peak_bytes() -> float | None:
    import jax

    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


# ---- 3. train-step MFU ----------------------------------------------------------------------------------


def rl_batch(vocab: int, B: int, T: int, seed: int = 0) -> dict:
    """A synthetic RL batch: a quarter of each row prompt, the rest sampled completion, groups of 2 rows."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mask = np.zeros((B, T), np.float32)
    mask[:, T // 4:] = 1.0
    return {
        "tokens": rng.integers(0, vocab, (B, T)).astype(np.int32), "loss_mask": mask,
        "gen_logp": (mask * rng.uniform(-6.0, -0.5, (B, T))).astype(np.float32),
        "staleness": np.zeros((B, T), np.int32), "advantages": rng.choice([-1.0, 1.0], B).astype(np.float32),
        "rewards": rng.choice([-1.0, 1.0], B).astype(np.float32), "group_ids": (np.arange(B) // 2).astype(np.int32),
        "truncated": np.zeros(B, np.float32),
    }


def train_mfu(rep: Report, sizes: Sizes, peak: float | None, remat: bool) -> None:
    """``peak`` None (the device section failed): step time, tokens/s and memory, no MFU rows."""
    import jax

    from scalerl_jax import sharding as shd
    from scalerl_jax.config import LossConfig, MeshConfig, TrainConfig
    from scalerl_jax.models import init_params
    from scalerl_jax.train.optim import make_optimizer
    from scalerl_jax.train.rl import rl_loss
    from scalerl_jax.train.step import init_train_state, jit_train_step, make_train_step, state_shardings

    B, T = sizes.train_batch, sizes.train_seq
    cfg = _model_cfg(sizes.train_model, sizes, dtype="bfloat16", head_dtype="float32", remat=remat)
    optimizer = make_optimizer(TrainConfig(lr=1e-6, warmup_steps=0, schedule="constant"))
    mesh = shd.make_mesh(MeshConfig())
    _, state_sh = state_shardings(cfg, optimizer, mesh)
    batch = rl_batch(cfg.vocab_size, B, T)
    batch_sh = shd.batch_shardings(batch, mesh)
    step = jit_train_step(make_train_step(rl_loss(cfg, LossConfig()), optimizer), state_sh, batch_sh, mesh)
    state = jax.device_put(init_train_state(init_params(cfg, jax.random.key(0)), optimizer), state_sh)
    placed = jax.device_put(batch, batch_sh)
    t0 = time.perf_counter()
    compiled = step.lower(state, placed).compile()
    compile_s = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    times, losses = [], []
    for i in range(sizes.train_steps + 1):  # the first call is a warm-up
        t0 = time.perf_counter()
        state, m = compiled(state, placed)
        losses.append(float(m["loss"]))  # blocks until the step is done
        if i:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens = B * T
    n_matmul = cfg.flops_per_token(0) / 2
    name = f"{sizes.train_model} {B}x{T} bf16, fp32 head, remat={remat}"
    rep.meta["train"] = {"model": sizes.train_model, "params": cfg.num_params(), "n_matmul_params": n_matmul,
                         "tokens_per_step": tokens, "step_s": step_s, "flops_per_token_fwd": cfg.flops_per_token(T)}
    rep.add("train", "step time", step_s, "s", f"{name}; median of {len(times)}; compile {compile_s:.1f} s")
    rep.add("train", "tokens/s", tokens / step_s, "tok/s", name)
    if peak:
        rep.add("train", "MFU (6N)", 6 * n_matmul * tokens / step_s / peak, "fraction",
                f"N = {n_matmul / 1e6:,.1f}M matmul params; peak {peak / 1e12:.3g} TFLOP/s")
        rep.add("train", "MFU with attention", 3 * cfg.flops_per_token(T) * tokens / step_s / peak, "fraction",
                "3 x flops_per_token(T): matmuls + causal attention")
    else:
        rep.add("train", "MFU", None, detail="no peak FLOP/s (the device section did not report one)",
                status="skipped")
    rep.add("train", "compiled temp memory", ma.temp_size_in_bytes / 2**30, "GiB",
            f"args {ma.argument_size_in_bytes / 2**30:.2f} GiB")
    peak_b = _peak_bytes()
    if peak_b is not None:
        rep.add("train", "device peak bytes in use", peak_b / 2**30, "GiB", "memory_stats(), process so far")
    if not all(math.isfinite(x) for x in losses):
        rep.add("train", "loss", losses[-1], "", "non-finite loss", status="error")
    del state, compiled


# ---- 4. engine decode ------------------------------------------------------------------------------------


def decode_speed(rep: Report, sizes: Sizes, model: str) -> None:
    import jax
    import numpy as np

    from scalerl_jax.models import init_params
    from scalerl_jax.rollout.engine import JaxEngine
    from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams

    B, P, new = sizes.decode_batch, sizes.decode_prompt, sizes.decode_new
    cfg = _model_cfg(model, sizes, dtype="bfloat16", param_dtype="bfloat16", head_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    eng = JaxEngine(cfg, params, max_batch=B, max_len=P + new, decode_chunk=sizes.decode_chunk)
    del params
    prompts = np.random.default_rng(0).integers(3, cfg.vocab_size, (B, P))
    reqs = [GenerationRequest(prompt_ids=p.tolist(), params=SamplingParams(temperature=0.0, max_new_tokens=new))
            for p in prompts]
    n_tok = []

    def run():
        out = eng.generate(reqs)
        n_tok.append(sum(len(o[0].token_ids) for o in out))

    t0 = time.perf_counter()
    run()  # compiles prefill and the decode chunk
    first_s = time.perf_counter() - t0
    best = min(_timed(run) for _ in range(sizes.decode_reps))
    if n_tok[-1] != B * new:
        raise RuntimeError(f"decode {model}: expected {B * new} tokens, got {n_tok[-1]}")
    rep.add("decode", f"{model} tokens/s", B * new / best, "tok/s",
            f"{cfg.num_params() / 1e6:,.1f}M params bf16; batch {B}, prompt {P}, {new} new; best of "
            f"{sizes.decode_reps}; first call (compile) {first_s:.1f} s")
    rep.add("decode", f"{model} ms per decode step", 1e3 * best / new, "ms", "whole batch, prefill included")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- 5. kernels vs references ----------------------------------------------------------------------------


def impl_fields() -> dict[str, tuple[str, ...]]:
    """``ModelConfig`` fields named ``*_impl`` that have a ``"reference"`` choice -> their other choices."""
    from scalerl_jax.config import ModelConfig

    hints = typing.get_type_hints(ModelConfig)
    out = {}
    for f in dataclasses.fields(ModelConfig):
        choices = typing.get_args(hints[f.name])
        if f.name.endswith("_impl") and "reference" in choices:
            out[f.name] = tuple(c for c in choices if c != "reference")
    return out


def _loss_and_grad(cfg, params, batch):
    import jax

    from scalerl_jax.config import LossConfig
    from scalerl_jax.train.rl import rl_loss

    fn = jax.jit(jax.value_and_grad(rl_loss(cfg, LossConfig()), has_aux=True))
    compiled = fn.lower(params, batch).compile()
    (loss, _), grads = compiled(params, batch)
    return compiled, float(loss), grads


def _grad_rel_diff(g, g_ref) -> float:
    """The largest per-leaf max |g - g_ref| / max |g_ref|."""
    import jax
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
               / max(float(np.max(np.abs(np.asarray(b, np.float32)))), 1e-30)
               for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)))


def compare_impls(rep: Report, sizes: Sizes, budget: Budget, strict: bool) -> None:
    import jax

    from scalerl_jax.config import ConfigError
    from scalerl_jax.models import init_params

    base = _model_cfg(sizes.train_model, sizes, dtype="bfloat16", head_dtype="float32", remat=False)
    every = impl_fields()
    unknown = sorted(set(sizes.impl_fields or ()) - set(every))
    if unknown:
        raise ValueError(f"--impl-fields: no ModelConfig field {unknown} with a reference choice "
                         f"(have {sorted(every)})")
    fields = every if sizes.impl_fields is None else {f: every[f] for f in sizes.impl_fields}
    # the reference of every switch, whatever the preset chooses
    base = dataclasses.replace(base, n_layers=sizes.impl_layers, **{f: "reference" for f in every})
    params = init_params(base, jax.random.key(0))
    batch = jax.device_put(rl_batch(base.vocab_size, sizes.impl_batch, sizes.impl_seq))
    shape = f"{sizes.train_model} cut to {sizes.impl_layers} layers, {sizes.impl_batch}x{sizes.impl_seq}"
    rep.meta["impl_fields"] = {k: list(v) for k, v in fields.items()}
    c, loss_ref, g_ref = _loss_and_grad(base, params, batch)
    t_ref = _median_time(lambda: jax.block_until_ready(c(params, batch)), sizes.impl_reps)
    mem_ref = c.memory_analysis().temp_size_in_bytes
    rep.add("impl", "reference value+grad", t_ref * 1e3, "ms", shape)
    rep.add("impl", "reference temp memory", mem_ref / 2**20, "MiB", "compiled")
    # The yardstick for the loss differences below: what rounding the activations to bf16 moves this loss by (the
    # reference again with float32 compute). The synthetic batch's advantages are +-1 at random, so the RL loss is a
    # difference of sums of per-token terms and its relative change amplifies each term's bf16 rounding; a kernel
    # whose difference is of this size differs by bf16 rounding, not by a bug.
    _, loss_f32, g_f32 = _loss_and_grad(dataclasses.replace(base, dtype="float32"), params, batch)
    rep.add("impl", "reference at float32 compute: loss rel. diff",
            abs(loss_f32 - loss_ref) / max(abs(loss_ref), 1e-30), "",
            f"max grad rel. diff {_grad_rel_diff(g_f32, g_ref):.2e}; the bf16 yardstick for the rows below")
    for field, choices in fields.items():
        for choice in choices:
            name = f"{field}={choice}"
            if budget.left() < IMPL_CHOICE_MIN_S:
                rep.add("impl", name, None, detail="skipped: out of time budget", status="skipped")
                continue
            try:
                cfg = dataclasses.replace(base, **{field: choice})
            except ConfigError as e:
                rep.add("impl", name, None, detail=f"unavailable: {e}", status="unavailable")
                continue
            try:
                c, loss, g = _loss_and_grad(cfg, params, batch)
            except Exception as e:  # noqa: BLE001
                # A backend without the kernel refuses with a ValueError naming the field. On a CPU any failure of a
                # non-reference choice is reported as unavailable (GPU-only kernels such as cuDNN's cannot run
                # there); on the GPU only a refusal is, and anything else is an error.
                if strict and not isinstance(e, (ValueError, NotImplementedError)):
                    raise
                rep.add("impl", name, None, detail=f"unavailable: {type(e).__name__}: {e}"[:400],
                        status="unavailable")
                continue
            t = _median_time(lambda: jax.block_until_ready(c(params, batch)), sizes.impl_reps)
            mem = c.memory_analysis().temp_size_in_bytes
            gdiff = _grad_rel_diff(g, g_ref)
            rep.add("impl", f"{name} value+grad", t * 1e3, "ms", f"{t_ref / t:.2f}x the reference's speed")
            rep.add("impl", f"{name} temp memory", mem / 2**20, "MiB", f"{mem / max(mem_ref, 1):.3f}x the reference")
            rep.add("impl", f"{name} loss rel. diff", abs(loss - loss_ref) / max(abs(loss_ref), 1e-30), "",
                    f"max grad rel. diff (per leaf, vs its max) {gdiff:.2e}")


# ---- one section in this process (the driver, benchmarks/gpu_check_driver.py, starts one per section) -------


def run_one_section(section: str, arg: str | None, sizes: Sizes, gpu: bool, timeout_s: float, remat: bool,
                    peak: float | None, out: Path) -> int:
    """Run one section, writing its rows and metadata to ``out`` after every row; an exception is an error row."""
    rep = Report(sink=out, write_every_row=True)
    budget = Budget(timeout_s)
    try:
        if section == "device":
            device_peak(rep, sizes, gpu)
        elif section == "train":
            train_mfu(rep, sizes, peak, remat)
        elif section == "decode":
            decode_speed(rep, sizes, arg or sizes.decode_models[0])
        elif section == "impl":
            compare_impls(rep, sizes, budget, strict=gpu)
        else:
            raise ValueError(f"--section must be device, train, decode or impl, got {section!r}")
    except Exception as e:  # noqa: BLE001 - every failure becomes a row
        rep.error(section, f"{section} {arg}" if arg else section, e)
    rep.write()
    return 1 if any(r["status"] == "error" for r in rep.rows) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU: every code path, in seconds")
    ap.add_argument("--out", default="gpu_check.json", help="JSON file for the table and metadata, rewritten "
                    "after every section")
    ap.add_argument("--budget-s", type=float, default=None, help="wall budget for all sections (default 540; "
                    f"{QUICK_BUDGET_S:.0f} with --quick)")
    ap.add_argument("--quick", action="store_true", help="a second run beside benchmarks/gpu_rl.sh in one 10-minute "
                    "slot: the 1B decode only, fewer repetitions, --budget-s "
                    f"{QUICK_BUDGET_S:.0f} (programs compiled by the first run come from JAX's persistent cache)")
    ap.add_argument("--remat", action="store_true", help="rematerialise layers in the train-step MFU run")
    for f in dataclasses.fields(Sizes):
        if f.name not in ("shrink", "decode_models", "kernel_tests_k", "impl_fields"):
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(GPU, f.name)), default=None)
    ap.add_argument("--decode-models", nargs="+", default=None)
    ap.add_argument("--impl-fields", nargs="*", default=None, metavar="FIELD",
                    help="the *_impl fields the impl section compares (default: every one; none given: only the "
                         "reference and its float32-compute yardstick)")
    # one section in this process (what the driver starts)
    ap.add_argument("--section", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--section-arg", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--section-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--section-timeout-s", type=float, default=540.0, help=argparse.SUPPRESS)
    ap.add_argument("--sizes-json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--peak-flops", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sizes_json:
        raw = json.loads(args.sizes_json)
        sizes = Sizes(**{**raw, "decode_models": tuple(raw["decode_models"]),
                         "impl_fields": None if raw.get("impl_fields") is None else tuple(raw["impl_fields"])})
    else:
        sizes = SMOKE if args.cpu_smoke else GPU
        if args.quick:
            sizes = quick(sizes)
        sizes = dataclasses.replace(sizes, **{f.name: getattr(args, f.name) for f in dataclasses.fields(Sizes)
                                              if getattr(args, f.name, None) is not None})
        sizes = dataclasses.replace(sizes, decode_models=tuple(sizes.decode_models),
                                    impl_fields=None if sizes.impl_fields is None else tuple(sizes.impl_fields))
    if args.section:
        if not args.section_out:
            ap.error("--section needs --section-out")
        return run_one_section(args.section, args.section_arg, sizes, not args.cpu_smoke, args.section_timeout_s,
                               args.remat, args.peak_flops, Path(args.section_out))
    budget_s = args.budget_s if args.budget_s is not None else QUICK_BUDGET_S if args.quick else 540.0
    rep = run_check(sizes, gpu=not args.cpu_smoke, budget_s=budget_s, remat=args.remat, out=Path(args.out))
    rep.meta["quick"] = args.quick
    rep.write()
    print("\n" + rep.table())
    print("\n" + rep.summary())
    print(f"\nwrote {args.out}; wall {rep.meta['wall_s']:.0f} s")
    return 1 if any(r["status"] == "error" for r in rep.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
