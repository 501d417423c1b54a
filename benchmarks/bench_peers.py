"""Our RL loop against two peer GRPO trainers, TRL and Tunix, seconds per RL step, back to back in one invocation.

All three sides train the ``small`` preset's warm start (a ~1.1M-parameter Llama with a byte-level BPE tokenizer,
saved as an HF directory, and its jsonl of word problems; built once into ``--out/warmstart_small`` and reused) on
the same batch, 32 prompts x 8 samples, at most 36 new tokens, temperature 1, the preset's learning rate, Adam with
the gradient clipped at 1, no KL term, math-verify rewards on the ``\\boxed{}`` answer, each at its best thread
setting on a 2-core CPU:

- ours: ``python -m experiments.math_8b --preset small`` with the embedded engine, as benchmarks/bench_trl.py runs
  it (``loop_seconds`` of its train rows; PipelineRL: generation overlapped with training).
- TRL: ``GRPOTrainer``, as benchmarks/bench_trl.py runs it (CISPO, HF ``generate``), ``--trl-threads`` torch threads
  (default 2), glibc huge pages ``--trl-hugepages`` (default off).
- Tunix: Google's JAX library, ``GRPOLearner`` on an ``RLCluster`` whose actor and rollout share the one CPU
  device, its Llama-3 model loaded from the warm start's safetensors (logits checked against transformers'
  ``LlamaForCausalLM`` first; Tunix 0.1.7's attention ignores ``ModelConfig.rope_theta``, so the run binds the
  checkpoint's theta into its ``apply_rope``: without that the logits differ by ~10), its vanilla sampler with
  the warm start's tokenizer, ``num_generations=8``, ``beta=0`` (no reference model). Tunix 0.1.7 has no CISPO
  (its policy losses: ``grpo``, ``ppo``): its default GRPO loss. It runs in its own process, with XLA's default
  threads and glibc huge pages, as ours (``--tunix-xla-flags`` adds XLA flags).

Per side the mean s/step over steps ``--skip``+1..``--steps`` (compilation and warm-up left out), every step's
time (generation, scoring and the update; one optimizer step each), the ratio to ours, and what the side does:
whether generation overlaps training, whether groups whose 8 rewards are all equal are left out of the step, the
policy loss. TRL and Tunix are not project dependencies: install each into its own directory, without their
dependencies (jax, optax, orbax, transformers and torch come from .venv; nothing may bring another jax):

    .venv/bin/python -m pip install --target runs/peers/trl --no-deps trl==1.16.0 accelerate==1.16.0 \\
        datasets==4.4.1 dill==0.4.1 multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1
    .venv/bin/python -m pip install --target runs/peers/tunix --no-deps google-tunix==0.1.7 flax==0.12.8 \\
        qwix==0.1.8 google-metrax==0.2.4 clu==0.0.12 jaxtyping==0.3.11 wadler-lindig==0.1.8 omegaconf==2.4.0 \\
        treescope==0.1.10 ml-collections==1.1.0 wrapt==2.5.2 sentencepiece==0.2.3 perfetto==0.59.1 pandas==3.1.1

    .venv/bin/python -m benchmarks.bench_peers                      # 20 steps per side, means over steps 5..20
    .venv/bin/python -m benchmarks.bench_peers --steps 3 --skip 1 --sides tunix --out runs/peers_trial --json peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scalerl_jax.benchmarks import machine
from scalerl_jax.benchmarks.bench_trl import NO_EVALS, OURS_SETS, ROOT, hidden_flags, run_trl

PIP = ".venv/bin/python -m pip install --no-deps --target"
INSTALL = {  # as in the docstring
    "trl": f"{PIP} runs/peers/trl trl==1.16.0 accelerate==1.16.0 datasets==4.4.1 dill==0.4.1 multiprocess==0.70.19 "
           "pandas==3.1.1 pyarrow==26.0.1",
    "tunix": f"{PIP} runs/peers/tunix google-tunix==0.1.7 flax==0.12.8 qwix==0.1.8 google-metrax==0.2.4 clu==0.0.12 "
             "jaxtyping==0.3.11 wadler-lindig==0.1.8 omegaconf==2.4.0 treescope==0.1.10 ml-collections==1.1.0 "
             "wrapt==2.5.2 sentencepiece==0.2.3 perfetto==0.59.1 pandas==3.1.1"}
PROBE = {"trl": "import trl; print(trl.__version__)",
         "tunix": "import tunix, tunix.rl.grpo.grpo_learner, tunix.models.llama3.params; print(tunix.__version__)"}
PARITY_TOL = 1e-4


def _parity(model, hf_dir: str, ids: list[int]) -> float:
    """Max |logit difference| between the Tunix model and transformers' LlamaForCausalLM on ``ids``."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
    n = len(ids)
    out, _ = model(jnp.array([ids]), jnp.arange(n)[None], None, jnp.tril(jnp.ones((n, n), bool))[None])
    return float(np.max(np.abs(np.asarray(out) - ref)))


def _tunix_child(a: argparse.Namespace) -> None:
    """Runs inside its own process: Tunix's GRPOLearner for ``a.steps`` steps; prints one JSON line of step times."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import tunix
    from transformers import AutoTokenizer
    from tunix.models.llama3 import model as llama3
    from tunix.models.llama3 import params as llama3_params
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner
    from tunix.rl.rollout.base_rollout import RolloutConfig

    from scalerl_jax.data.jsonl import extract_gold, make_prompt
    from scalerl_jax.rewards.math import MathVerifier

    hf = json.loads((Path(a.model) / "config.json").read_text())
    theta = float((hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0)))
    cfg = llama3.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=theta, norm_eps=hf["rms_norm_eps"],
        weight_tying=hf["tie_word_embeddings"])
    # Tunix 0.1.7's attention calls apply_rope without ModelConfig.rope_theta (its default, 1e6, would apply)
    llama3.apply_rope = functools.partial(llama3.apply_rope, rope_theta=theta)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    model = llama3_params.create_model_from_safe_tensors(a.model, cfg, mesh, dtype=jnp.float32)
    tok = AutoTokenizer.from_pretrained(a.model)

    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
    rows = rows[: a.prompts * (a.steps + 1)]
    prompts = [make_prompt(r["question"], a.template) for r in rows]
    answers = [extract_gold(str(r["answer"])) for r in rows]
    ids = [tok.bos_token_id, *tok.encode(f"{prompts[0]} {rows[0]['answer']}")]  # the sampler prepends bos too
    parity = _parity(model, a.model, ids)
    print(f"TUNIX_PARITY max |logits - HF LlamaForCausalLM| = {parity:.2e} over {len(ids)} tokens", flush=True)
    if not parity <= PARITY_TOL:
        sys.exit(f"bench_peers: Tunix's Llama-3 does not match HF's logits ({parity:.2e} > {PARITY_TOL})")

    verifier, rewards = MathVerifier(), []

    def math_reward(prompts, completions, answer, **_):
        r = [verifier.reward(c, str(g)) for c, g in zip(completions, answer)]
        rewards.append(float(np.mean(r)))
        return r

    train = rlc.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0),
                                    optax.adamw(a.lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)),
        eval_every_n_steps=10**9, max_steps=a.steps)
    rollout = RolloutConfig(max_tokens_to_generate=a.max_new, temperature=1.0, top_p=1.0, top_k=None,
                            max_prompt_length=a.max_prompt, kv_cache_size=a.max_prompt + a.max_new)
    cluster = rlc.RLCluster(actor=model, reference=None, tokenizer=tok, cluster_config=rlc.ClusterConfig(
        role_to_mesh={r: mesh for r in (rlc.Role.ACTOR, rlc.Role.REFERENCE, rlc.Role.ROLLOUT)},
        rollout_engine="vanilla", offload_to_cpu=False, training_config=train, rollout_config=rollout))
    learner = GRPOLearner(rl_cluster=cluster, reward_fns=math_reward,
                          algo_config=GRPOConfig(num_generations=a.group, num_iterations=1, beta=0.0))
    # the clock starts when the first global step begins (model, data and tokenizer loading not counted, as TRL's
    # callback); each step ends when the next begins or training ends: generation, scoring, the update, bookkeeping
    times: list[float] = []
    step = learner._run_global_step

    def timed_step(*args, **kw):
        rollout.seed = len(times)  # the sampler's key (PRNGKey(0) at every step when left None)
        times.append(time.perf_counter())
        step(*args, **kw)

    learner._run_global_step = timed_step
    batches = [{"prompts": np.array(prompts[i: i + a.prompts]), "answer": np.array(answers[i: i + a.prompts])}
               for i in range(0, len(prompts), a.prompts)]
    learner.train(batches)
    times.append(time.perf_counter())
    verifier.close()
    try:
        length = cluster._rl_metrics_logger.get_metric_history("completions", "mean_length", "train").tolist()
    except (ValueError, AttributeError):
        length = []
    print("TUNIX_INFO " + json.dumps({"version": tunix.__version__, "parity": parity, "reward_mean": rewards,
                                      "completion_len": length}), flush=True)
    print("TUNIX_STEPS " + json.dumps([b - a_ for a_, b in zip(times, times[1:])]), flush=True)


def _site_env(site: str) -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false",
            **({"PYTHONPATH": str(Path(site).resolve())} if site else {})}


def run_tunix(a: argparse.Namespace, model: Path, data: Path, template: str, lr: float) -> tuple[list[float], dict]:
    cmd = [sys.executable, "-m", "scalerl_jax.benchmarks.bench_peers", "--tunix-child", "--model", str(model),
           "--data", str(data), "--template", template, "--steps", str(a.steps), "--prompts", str(a.prompts),
           "--group", str(a.group), "--max-new", str(a.max_new), "--max-prompt", str(a.max_prompt), "--lr", repr(lr)]
    env = _site_env(a.tunix_site)
    if a.tunix_xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {a.tunix_xla_flags}".strip()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    found = {k: next((x.split(" ", 1)[1] for x in proc.stdout.splitlines() if x.startswith(k + " ")), None)
             for k in ("TUNIX_STEPS", "TUNIX_INFO", "TUNIX_PARITY")}
    if proc.returncode or found["TUNIX_STEPS"] is None:
        sys.exit(f"bench_peers: the Tunix run failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                 f"{proc.stderr[-4000:]}")
    print(f"[bench_peers] Tunix: {found['TUNIX_PARITY']}", flush=True)
    return json.loads(found["TUNIX_STEPS"]), json.loads(found["TUNIX_INFO"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="RL steps per side")
    ap.add_argument("--skip", type=int, default=4, help="first steps of each side left out of the means")
    ap.add_argument("--sides", nargs="+", choices=["ours", "trl", "tunix"], default=["ours", "trl", "tunix"])
    ap.add_argument("--out", default="runs/bench_peers", help="run directories and the shared warm start")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    ap.add_argument("--trl-site", default="runs/peers/trl", help="TRL's --target directory ('': the environment's)")
    ap.add_argument("--tunix-site", default="runs/peers/tunix", help="Tunix's --target directory ('': the env's)")
    ap.add_argument("--trl-threads", type=int, default=2, help="torch threads of the TRL run")
    ap.add_argument("--trl-hugepages", choices=["off", "on"], default="off", help="glibc huge pages for TRL")
    ap.add_argument("--tunix-xla-flags", default="", help="added to XLA_FLAGS of the Tunix run (default: XLA's own "
                    "threads, as ours), e.g. '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'")
    # the Tunix child process's own flags
    ap.add_argument("--tunix-child", action="store_true", help=argparse.SUPPRESS)
    hidden_flags(ap, (("--model", str), ("--data", str), ("--template", str), ("--prompts", int), ("--group", int),
                      ("--max-new", int), ("--max-prompt", int), ("--lr", float)))
    a = ap.parse_args(argv)
    if a.tunix_child:
        return _tunix_child(a)
    if a.steps <= a.skip:
        ap.error(f"--steps ({a.steps}) must exceed --skip ({a.skip})")
    versions = {}
    for side in (s for s in ("trl", "tunix") if s in a.sides):  # each peer must import where its run will look
        site = a.trl_site if side == "trl" else a.tunix_site
        probe = subprocess.run([sys.executable, "-c", PROBE[side]], env=_site_env(site), capture_output=True,
                               text=True)
        if probe.returncode:
            ap.error(f"{side} is not importable with PYTHONPATH={site or '(unchanged)'} "
                     f"({(probe.stderr.strip().splitlines() or ['?'])[-1]}); install it with: {INSTALL[side]} "
                     f"(or point --{side}-site at its directory)")
        versions[side] = probe.stdout.strip()

    from scalerl_jax.benchmarks.bench_loop import breakdown, run_preset
    from scalerl_jax.experiments.presets import small_plan

    facts = machine.describe()  # first: the load before any side runs
    print(machine.header(facts) + "".join(f"; {k} {v} (its own process)" for k, v in versions.items()), flush=True)
    exp = small_plan(0).exp  # the batch, learning rate, eps_max and template all sides use
    out = Path(a.out)
    a.prompts, a.group = exp.rollout.prompts_per_batch, exp.rollout.group_size
    a.max_new, a.max_prompt = exp.rollout.max_new_tokens, exp.rollout.max_prompt_len
    runs: dict[str, dict] = {}
    if "ours" in a.sides:
        print(f"[bench_peers] ours: small preset, embedded engine, {a.steps} steps", flush=True)
        rows, _ = run_preset("small", a.steps, out, OURS_SETS)
        ro, lo = exp.rollout, exp.loss
        overlap = (f"yes (PipelineRL, <= {ro.k} steps off-policy)" if ro.mode == "pipeline" else "no")
        runs["ours (JAX, embedded)"] = {
            "steps": [r["loop_seconds"] for r in rows if r.get("kind") == "train"],
            "mean": breakdown(rows, a.skip, NO_EVALS)["loop_seconds"], "overlap": overlap,
            "filter": "yes" if lo.filter_zero_variance else "no",
            "loss": f"{lo.kind.upper()} (eps_max {lo.eps_max}), {lo.aggregation}-level mean"}
    warm = out / "warmstart_small"
    data = next(warm.glob("*.jsonl"), None)
    if data is None:
        ap.error(f"no warm start in {warm}: run once with --sides ours (it builds it), or point --out at one")
    if "trl" in a.sides:
        hp = a.trl_hugepages == "on"
        print(f"[bench_peers] TRL {versions['trl']}: {a.trl_threads} torch thread(s), huge pages "
              f"{a.trl_hugepages}, {a.steps} steps", flush=True)
        saved = os.environ.get("PYTHONPATH")
        if a.trl_site:
            os.environ["PYTHONPATH"] = str(Path(a.trl_site).resolve())  # run_trl's child inherits this environment
        try:
            steps = run_trl(a, warm, data, exp.data.template, a.trl_threads, exp.train.lr, exp.loss.eps_max, hp)
        finally:
            os.environ.pop("PYTHONPATH", None)
            if saved is not None:
                os.environ["PYTHONPATH"] = saved
        runs[f"TRL {versions['trl']} ({a.trl_threads}t)"] = {
            "steps": steps, "overlap": "no (generate, score, update in turn)", "filter": "no (advantage 0, kept)",
            "loss": f"CISPO (loss_type='cispo', epsilon_high {exp.loss.eps_max}), token-mean"}
    tunix_info = {}
    if "tunix" in a.sides:
        print(f"[bench_peers] Tunix {versions['tunix']}: GRPOLearner, 1 CPU device, {a.steps} steps", flush=True)
        steps, tunix_info = run_tunix(a, warm, data, exp.data.template, exp.train.lr)
        runs[f"Tunix {versions['tunix']}"] = {
            "steps": steps, "overlap": "no (actor and rollout share the one mesh)", "filter": "no (advantage 0, kept)",
            "loss": "GRPO default, no CISPO in Tunix 0.1.7 (PPO clip eps 0.2, 1 iteration; seq-mean-token-mean)"}
    for r in runs.values():
        r.setdefault("mean", statistics.mean(r["steps"][a.skip:]))

    print(f"\nbatch: {a.prompts} prompts x {a.group} samples, <= {a.max_new} new tokens, temperature 1, lr "
          f"{exp.train.lr:g}, no KL; means over steps {a.skip + 1}..{a.steps}")
    base = next((r["mean"] for k, r in runs.items() if k.startswith("ours")), None)
    print(f"\n{'side':<22} {'s/step':>7} {'/ ours':>7}  {'gen. overlapped':<42} {'zero-var. groups out':<22} loss")
    for name, r in runs.items():
        ratio = f"{r['mean'] / base:.2f}x" if base and not name.startswith("ours") else ""
        print(f"{name:<22} {r['mean']:>7.2f} {ratio:>7}  {r['overlap']:<42} {r['filter']:<22} {r['loss']}")
    print("\nsteps (s):")
    for name, r in runs.items():
        print(f"  {name:<20} {' '.join(f'{s:.2f}' for s in r['steps'])}")
    if "ours" in a.sides and exp.rollout.length.kind == "interruption":
        print(f"ours: {exp.rollout.length.kind} length control (think budget {exp.rollout.length.think_budget_lo}-"
              f"{exp.rollout.length.think_budget_hi} tokens, then {exp.rollout.length.interruption_text!r}); "
              "TRL and Tunix sample to eos or the token limit")
    if tunix_info:
        print(f"Tunix: logits vs HF max |diff| {tunix_info['parity']:.1e}; per step: mean reward "
              f"{' '.join(f'{x:+.2f}' for x in tunix_info['reward_mean'])}, mean completion tokens "
              f"{' '.join(f'{x:.1f}' for x in tunix_info['completion_len'])}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "batch": {"prompts": a.prompts, "group": a.group, "max_new": a.max_new}, "skip": a.skip,
            "machine": facts, "versions": versions, "sides": runs, "tunix": tunix_info,
            "ratio_to_ours": {k: r["mean"] / base for k, r in runs.items() if base}}, indent=2))


if __name__ == "__main__":
    main()
