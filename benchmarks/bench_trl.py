"""Our RL loop against TRL's ``GRPOTrainer``, seconds per step at equal batch, back to back in one invocation.

Both sides train the ``small`` preset's model on its data: the preset's warm start (a ~1.1M-parameter Llama with a
byte-level BPE tokenizer, saved as an HF directory, and its jsonl of word problems; built once into
``--out/warmstart_small`` and reused) and the same batch, 32 prompts x 8 samples, at most 36 new tokens,
temperature 1, CISPO, the preset's learning rate, math-verify rewards on the ``\\boxed{}`` answer.

- Ours: ``python -m experiments.math_8b --preset small`` with the embedded engine in the trainer's process
  (``rollout.engine=embedded``; the preset's own fleet of local servers is not timed here), read from its train
  rows (``loop_seconds``: the trainer's wall time per step; PipelineRL, generation overlapped).
- TRL: ``GRPOTrainer`` with ``per_device_train_batch_size=256``, ``num_generations=8`` (one optimizer step per
  32 x 8 batch, as ours), ``loss_type="cispo"`` with ``epsilon_high`` = the preset's ``eps_max``, ``beta=0``, on the
  CPU, generation by HF ``generate``, once per ``--torch-threads`` setting and ``--trl-hugepages`` setting (glibc's
  huge-page tunable off and on: ours runs with it, scalerl_jax/hostmem.py), each in its own process; seconds per
  step from a callback at every optimizer step (generation, scoring and the update: TRL runs them in turn).

The first ``--skip`` steps of each side (compilation, warm-up) are left out of the means. TRL is a test-only
dependency, not in the requirements: ``pip install trl==1.16.0 datasets==4.4.1`` first (it brings accelerate, pandas,
pyarrow; datasets 5.2.0 could not fingerprint a dataset beside pyarrow here: "Can't pickle <class 'MonthDayNano'>").

    .venv/bin/python -m benchmarks.bench_trl      # 10 steps per side; TRL at 1 and 2 threads, huge pages off and on
    .venv/bin/python -m benchmarks.bench_trl --steps 6 --torch-threads 1 --json trl.json
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

from scalerl_jax import hostmem

ROOT = Path(__file__).resolve().parents[1]
NO_EVALS = 100000  # eval_every past the run's end: only the step-0 eval, outside the timed steps
OURS_SETS = ["rollout.engine=embedded", "rollout.local_servers=0", f"train.eval_every={NO_EVALS}"]


def _trl_child(a: argparse.Namespace) -> None:
    """Runs inside its own process: TRL's GRPOTrainer for ``a.steps`` steps; prints one JSON line of step times."""
    import torch

    torch.set_num_threads(a.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scalerl_jax.data.jsonl import make_prompt
    from scalerl_jax.rewards.math import MathVerifier

    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
    data = Dataset.from_list([{"prompt": make_prompt(r["question"], a.template), "answer": str(r["answer"])}
                              for r in rows[: a.prompts * (a.steps + 2)]])
    verifier = MathVerifier()

    def reward(completions, answer, **_):
        return [verifier.reward(c, g) for c, g in zip(completions, answer)]

    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not times:
                times.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter())

    cfg = GRPOConfig(
        output_dir=a.trl_out, per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
        max_completion_length=a.max_new, temperature=1.0, loss_type="cispo", epsilon_high=a.eps_max, beta=0.0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, max_steps=a.steps, use_cpu=True,
        bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=a.seed, disable_tqdm=True,
        dataloader_num_workers=0, gradient_checkpointing=False,  # TRL turns it on by default; ours does not remat
    )
    tok = AutoTokenizer.from_pretrained(a.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=[StepTimes()])
    # TRL starts the callback's clock when the first step begins, so the first interval holds that step alone:
    # the model, data and tokenizer loading above are not counted on either side
    trainer.train()
    verifier.close()
    print("TRL_STEPS " + json.dumps([b - a_ for a_, b in zip(times, times[1:])]), flush=True)


def run_trl(a: argparse.Namespace, model: Path, data: Path, template: str, threads: int, lr: float,
            eps_max: float, hugepages: bool) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    if not hugepages:  # the child starts without glibc's huge-page tunable (scalerl_jax/hostmem.py)
        env[hostmem.OPT_OUT] = "0"
        env["GLIBC_TUNABLES"] = ":".join(t for t in env.get("GLIBC_TUNABLES", "").split(":")
                                         if t and not t.startswith("glibc.malloc.hugetlb"))
    else:
        env.pop(hostmem.OPT_OUT, None)
    cmd = [sys.executable, "-m", "scalerl_jax.benchmarks.bench_trl", "--trl-child", "--model", str(model),
           "--data", str(data),
           "--template", template, "--threads", str(threads), "--steps", str(a.steps), "--prompts", str(a.prompts),
           "--group", str(a.group), "--max-new", str(a.max_new), "--lr", repr(lr), "--eps-max", repr(eps_max),
           "--trl-out", str(Path(a.out) / f"trl_{threads}t")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TRL_STEPS ")), None)
    if proc.returncode or line is None:
        sys.exit(f"bench_trl: the TRL run at {threads} thread(s) failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-3000:]}")
    return json.loads(line.split(" ", 1)[1])


def hidden_flags(ap: argparse.ArgumentParser, flags) -> None:
    """A child process's own flags, ``(name, type)`` pairs, kept out of ``--help`` (0 or "" when not given)."""
    for flag, kind in flags:
        ap.add_argument(flag, type=kind, default=0 if kind is not str else "", help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="RL steps per side")
    ap.add_argument("--skip", type=int, default=2, help="first steps of each side left out of the means")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2], help="TRL runs, one per setting")
    ap.add_argument("--trl-hugepages", choices=["off", "on", "both"], default="both",
                    help="TRL runs with glibc's huge-page tunable off, on, or each (scalerl_jax/hostmem.py)")
    ap.add_argument("--out", default="runs/bench_trl", help="run directories and the shared warm start")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    # the TRL child process's own flags
    ap.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    hidden_flags(ap, (("--model", str), ("--data", str), ("--template", str), ("--threads", int), ("--prompts", int),
                      ("--group", int), ("--max-new", int), ("--lr", float), ("--eps-max", float), ("--trl-out", str),
                      ("--seed", int)))
    a = ap.parse_args(argv)
    if a.trl_child:
        return _trl_child(a)
    if a.steps <= a.skip:
        ap.error(f"--steps ({a.steps}) must exceed --skip ({a.skip})")
    try:
        import trl  # noqa: F401
    except ImportError:
        ap.error("TRL is not installed: pip install trl==1.16.0 datasets==4.4.1 (a test-only dependency)")

    from scalerl_jax.benchmarks.bench_loop import breakdown, cv, run_preset, spread_line
    from scalerl_jax.experiments.presets import small_plan

    exp = small_plan(0).exp  # the batch, learning rate, eps_max and template both sides use
    out = Path(a.out)
    print(f"[bench_trl] ours: small preset, embedded engine, {a.steps} steps", flush=True)
    t0 = time.perf_counter()
    rows, _ = run_preset("small", a.steps, out, OURS_SETS)
    ours = breakdown(rows, a.skip, NO_EVALS)
    ours_steps = [r["loop_seconds"] for r in rows if r.get("kind") == "train"]
    ours_mean = ours["loop_seconds"]  # the mean over the steps after --skip
    print(f"[bench_trl] ours: {ours_mean:.2f} s/step ({time.perf_counter() - t0:.0f} s in all)", flush=True)
    warm = out / "warmstart_small"
    data = next(warm.glob("*.jsonl"))
    a.prompts, a.group, a.max_new = exp.rollout.prompts_per_batch, exp.rollout.group_size, exp.rollout.max_new_tokens
    trl_runs = {}
    for threads in a.torch_threads:
        for hp in {"off": [False], "on": [True], "both": [False, True]}[a.trl_hugepages]:
            name = f"{threads}t" + (" huge pages" if hp else "")
            print(f"[bench_trl] TRL {trl.__version__}: {threads} torch thread(s), huge pages {'on' if hp else 'off'}, "
                  f"{a.steps} steps", flush=True)
            steps = run_trl(a, warm, data, exp.data.template, threads, exp.train.lr, exp.loss.eps_max, hp)
            trl_runs[name] = steps
            print(f"[bench_trl] TRL {name}: {statistics.mean(steps[a.skip:]):.2f} s/step", flush=True)
    print(f"\nbatch: {a.prompts} prompts x {a.group} samples, <= {a.max_new} new tokens; "
          f"means over steps {a.skip + 1}..{a.steps}")
    facts = machine.describe()
    print(machine.header(facts))
    print(f"ours: {hostmem.describe()}")
    print(f"{'run':<24} {'s/step':>8} {'TRL / ours':>10}   steps (s)")
    print(f"{'ours (embedded, JAX)':<24} {ours_mean:>8.2f} {'':>10}   {' '.join(f'{s:.2f}' for s in ours_steps)}")
    for name, steps in trl_runs.items():
        m = statistics.mean(steps[a.skip:])
        print(f"{f'TRL {name}':<24} {m:>8.2f} {m / ours_mean:>10.2f}   "
              f"{' '.join(f'{s:.2f}' for s in steps)}")
    best = min(statistics.mean(s[a.skip:]) for s in trl_runs.values())
    print(f"\nours: {spread_line(ours)}; " + "; ".join(
        f"TRL {name}: step-time CV {cv(steps[a.skip:]):.0%}" for name, steps in trl_runs.items()))
    print(f"ours against TRL's best setting: {best / ours_mean:.2f}x faster per step")
    if a.json:
        batch = {"prompts": a.prompts, "group": a.group, "max_new": a.max_new}
        Path(a.json).write_text(json.dumps({"batch": batch, "skip": a.skip, "ours_steps": ours_steps,
                                            "ours_breakdown": ours, "ours_host": hostmem.describe(), "machine": facts,
                                            "trl_version": trl.__version__,
                                            "trl_steps": trl_runs, "speedup_vs_best_trl": best / ours_mean},
                                           indent=2))


if __name__ == "__main__":
    main()
