"""The plan of a run (:class:`ExperimentPlan`), its presets (sizes) and variants (the paper's baselines and ScaleRL's
leave-one-out ablations).

A preset fixes the scale (model, batch, lengths, budgets); a variant swaps recipe components. Every
combination builds a valid :class:`ExperimentPlan` (:func:`build_plan`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from scalerl_jax.experiments import budgets

from scalerl_jax.config import (
    DataConfig,
    ExperimentConfig,
    ForecastConfig,
    LengthConfig,
    LossConfig,
    MeshConfig,
    RolloutConfig,
    SandboxSettings,
    TrainConfig,
    dapo_loss,
    grpo_loss,
)
from scalerl_jax.models.presets import (
    llama3_1b,
    llama3_8b,
    qwen3_4b,
    qwen3_30b_a3b,
    qwen25_1_5b,
    scout_17b16e,
    tiny,
    tiny_moe,
)

R = dataclasses.replace


@dataclass(frozen=True)
class ExperimentPlan:
    """An ExperimentConfig plus what the run needs around it (warm start, lengths, the base model)."""

    exp: ExperimentConfig
    real: bool = False  # needs accelerators (the 8B preset)
    warm_steps: int = 0  # supervised warm-start steps before RL (tiny); 0 = start from base_model
    warm_batch: int = 128
    warm_lr: float = 3e-3
    warm_warmup: int = 50
    warm_unmarked_frac: float = 0.0  # warm-start targets that never mark a final answer (see tiny_plan)
    #: rows of the preset's own supervised warm start (its base model; unused with --model): the preset's budgets,
    #: fixed apart from the RL run's so that --rollout.* flags and max_prompt_len=auto reuse the same warm start
    warm_seq_len: int = 40
    base_model: str | None = None  # HF checkpoint dir of the starting policy (--model); None: the preset makes it
    base_kind: str = "none"  # how the preset makes its base model: "char_arith", "char_chain", "word_arith"
    n_problems: int = 14400  # word_arith: problems written to the preset's jsonl; char_chain: warm-start chains
    arith_b_max: int = 19  # word_arith: a + b * c with b <= this (19: a small multiplication table)
    bpe_vocab: int = 512  # word_arith: BPE vocabulary trained on that text
    n_trainer_devices: int = 1
    variant: str = "scalerl"

    @property
    def seq_len(self) -> int:
        """Tokens per training row (:func:`experiments.budgets.row_len`)."""
        return budgets.row_len(self.exp)


TINY_LR = 5e-5  # the tiny default's RL learning rate (its task: a+b*c with b and c from 2..5 and 2..9)
DERIVED_LR = 3e-5  # the presets built on tiny with a task of their own keep the rate they were measured with


def tiny_plan(seed: int = 0) -> ExperimentPlan:
    """The CPU default (DESIGN.md): ~0.8M-parameter model, synthetic arithmetic ``a+b*c`` with b in 2..5 and c in
    2..9 (``data.arith_b_max=5``: 3,200 problems), every ScaleRL component on.

    The warm start (512 x 128 supervised steps) learns the scratchpad well (94-98 % of the answers it marks are
    right) but 60 % of its targets stop after the scratchpad without marking an answer (``#Y``), so the
    warm-started policy commits to an answer in only ~40 % of samples (36-41 % validation pass rate at T = 1).
    RL has to learn to commit: a behaviour every prompt shares, which it learns in ~80 steps at lr 5e-5 while the
    accuracy of the answers it marks stays at 0.87-0.98, so the curve is the commitment curve, its ceiling is above
    0.9 and the first half's fit holds the ceiling A in a 90 % interval 0.07-0.11 wide on seeds 0-4, from about what
    the first half reached up to the bound A <= 1 (docs/results/tiny.md). With
    b up to 9 the marked answers were right 76-93 % of the time, depending on the seed's warm start, and the
    interval was 0.13-0.17 wide; with two-digit b (``arith_b_max=99``, the preset until then) the accuracy starts
    near 0.7 and RL moves it (0.69 -> 0.45 in 40 steps on one seed, then swings of 0.05-0.08 between evals 4 steps
    apart), and the interval was 0.3-0.4 wide on most seeds. Evaluates every 4 steps: the fit of the first half
    needs the points (docs/results/fit_resolution.md)."""
    length = LengthConfig(kind="interruption", think_budget_lo=20, think_budget_hi=26, answer_budget=5,
                          think_end="#", interruption_text="#", penalty_max_len=24, penalty_cache=6)
    exp = ExperimentConfig(
        name="scalerl_tiny", model=tiny(), mesh=MeshConfig(fsdp=-1),
        loss=LossConfig(kind="cispo", eps_max=5.0, aggregation="prompt", normalization="batch",
                        filter_zero_variance=True),
        rollout=RolloutConfig(mode="pipeline", k=8, prompts_per_batch=32, group_size=8, temperature=1.0,
                              max_prompt_len=8, max_new_tokens=32, decode_chunk=8, length=length),
        data=DataConfig(source="arith", arith_b_max=5, val_size=200, seed=seed, npr=True, npr_threshold=0.9),
        train=TrainConfig(lr=TINY_LR, warmup_steps=0, schedule="constant", adam_eps=1e-8, weight_decay=0.0,
                          grad_clip=1.0, steps=160, eval_every=4, eval_samples=4, checkpoint_every=40,
                          keep_checkpoints=3, seed=seed),
        # the fits' compute axis: counted FLOPs, which neither compilation in the first steps nor a shared CPU's
        # load moves (device-hours on a 2-core machine vary +-15 % with other jobs; the presets built on this one
        # inherit it, the accelerator presets fit on device-hours, the paper's GPU-hours)
        forecast=ForecastConfig(compute_key="flops"),
        out_dir="runs/tiny",
    )
    return ExperimentPlan(exp=exp, real=False, warm_steps=512, warm_batch=128, warm_lr=3e-3, warm_warmup=50,
                          warm_unmarked_frac=0.6, warm_seq_len=40, base_kind="char_arith")


SMALL_TEMPLATE = "{question} Answer in \\boxed{}."


def small_plan(seed: int = 0) -> ExperimentPlan:
    """The real path on a CPU: what a user with an HF model, jsonl data and an SGLang fleet runs, at laptop size.

    The preset makes its own base model directory (``base_kind="word_arith"``, see experiments/base_models.py):
    14,400 word problems (the tiny task's ``a + b * c`` with b <= 19, in English, ``\\boxed{}`` answers) in a
    jsonl file, a byte-level BPE tokenizer trained on them with the ``tokenizers`` library, and a ~1.1M-parameter
    Llama warm-started on the question/answer rows, saved as an HF checkpoint. RL then runs exactly as with ``--model
    DIR --data FILE.jsonl --generators 2``: math-verify rewards, two ``scalerl_jax.serve`` processes behind a real
    ``sglang-router``, weights pushed to them as HF checkpoints after every update. 60 % of the warm-start targets
    work both steps but box the product instead of the result (``b*c=X. a+X=Y. \\boxed{X}``, scored wrong), so the
    warm-started policy often commits to the wrong number: RL has to learn to box the result, a behaviour every
    prompt shares (the tiny preset's headroom, in words)."""
    p = tiny_plan(seed)
    length = LengthConfig(kind="interruption", think_budget_lo=22, think_budget_hi=26, answer_budget=8,
                          think_end=" \\boxed", interruption_text=" \\boxed", penalty_max_len=30, penalty_cache=8)
    exp = R(p.exp, name="scalerl_small", model=R(tiny(), max_seq_len=128, attn_chunk=128),
            rollout=R(p.exp.rollout, max_prompt_len=32, max_new_tokens=36, length=length, engine="sglang",
                      local_servers=2),
            data=DataConfig(source="jsonl", path="", template=SMALL_TEMPLATE, val_size=200, seed=seed, npr=True,
                            npr_threshold=0.9),
            train=R(p.exp.train, lr=DERIVED_LR, eval_every=16),
            out_dir="runs/small")
    return R(p, exp=exp, warm_seq_len=68, warm_steps=384, base_kind="word_arith", n_problems=14400, arith_b_max=19,
             bpe_vocab=512)


def smoke_plan(seed: int = 0) -> ExperimentPlan:
    """CI-sized tiny run: the same path, fewer steps and a smaller validation set. Evaluates every 2 steps: the
    half-compute fit needs 5 evals in the first half, and when the fit's axis was device-hours the first steps'
    compilation left only 4 there at every 4 steps on a loaded machine (the axis is FLOPs now, as on ``tiny``).
    Keeps b up to 9 (``data.arith_b_max=9``, tiny's task until it took b up to 5): its ceiling stays below 0.9
    (tiny's runs with b up to 9 ended at 0.83-0.86), so a baseline can be clearly ahead of it (the
    ``--stop-if-worse`` test); with b up to 5 a resumed smoke run reached 0.96-0.99 and no baseline could be. A
    warm start of 384 x 128 rows (tiny's 512 cut by a quarter, for the suite's time) left seeds 0 and 1 where 512 did
    (validation 0.31 / 0.33 at step 0, gains of 0.37 / 0.41 by step 48 against 0.37 / 0.41); 256 left seed 0 at 0.04."""
    p = tiny_plan(seed)
    exp = R(p.exp, name="scalerl_smoke", data=R(p.exp.data, val_size=96, arith_b_max=9),
            train=R(p.exp.train, steps=48, eval_every=2, checkpoint_every=16, eval_samples=4))
    return R(p, exp=exp, warm_steps=384)


def tiny_mathcode_plan(seed: int = 0) -> ExperimentPlan:
    """The tiny recipe on math and code at once (the paper's math+code run, at CPU size): half of every batch is the
    arithmetic task, half the synthetic code task (``f(0)=7,f(1)=19:`` -> ``19-7=12#x*12+7``, the body of
    ``def f(x)`` graded by hidden asserts in the code sandbox; scalerl_jax/data/code_synth.py).

    A 24-character vocabulary (the tiny 17 plus ``-x(),:f``) and a warm start on both tasks in equal parts, with
    tiny's headroom on both: 60 % of the warm-start targets work the scratchpad but never write the answer after
    ``#`` (no ``#Y``, no function body), so RL has to learn to commit on each task. Eval rows carry
    ``val_reward_math`` and ``val_reward_code`` beside the combined ``val_reward``; the fit and the report cover
    all three curves. 24 prompts x 8 samples per batch (12 of each task) keep the sandbox's work per step (one
    run per distinct program of a prompt's samples) within a 2-core CPU's reach."""
    p = tiny_plan(seed)
    length = R(p.exp.rollout.length, think_budget_lo=20, think_budget_hi=26, answer_budget=8)
    exp = R(p.exp, name="scalerl_tiny_mathcode", model=R(tiny(), vocab_size=24),
            rollout=R(p.exp.rollout, prompts_per_batch=24, max_prompt_len=16, max_new_tokens=35, length=length),
            data=R(p.exp.data, arith_b_max=99, val_size=100, code_source="synthetic", code_weight=0.5,
                   code_val_size=100),
            train=R(p.exp.train, lr=DERIVED_LR, steps=96, eval_every=6, checkpoint_every=48),
            out_dir="runs/tiny_mathcode")
    return R(p, exp=exp, warm_seq_len=51, warm_steps=512, base_kind="char_mathcode")


def tiny_chain_plan(seed: int = 0) -> ExperimentPlan:
    """The tiny recipe on a task where length and difficulty matter: addition chains ``a+b+...=`` of 2..6 single-digit
    additions with a running scratchpad (``3+4=7;7+5=12#12``; scalerl_jax/data/chain.py), same model and tokenizer.

    Thinking lengths by depth d (characters = tokens): 6d - 1 (all ones) to 8d - 2 (all nines), i.e. 11-14, 17-22,
    23-30, 29-38 and 35-46 for depths 2..6. The thinking budget B ~ U[30, 38] never cuts depths 2..4 short, cuts
    ~76 % of depth-5 scratchpads and every depth-6 one (L > B), ~35 % of the problems at depth uniform over 2..6
    (``tests/test_chain.py`` checks these numbers); the length penalty variant (L_max 44, L_cache 8) docks correct
    completions over 36 tokens: ~98 % of depth 5 and all of depth 6 (~40 %). A small training pool (128 prompts,
    4 batches of 32 per epoch) is revisited for many epochs, so No-Positive-Resampling can retire the prompts the
    policy solves. The warm start (``char_chain``: 300 x 128 steps on 20,000 distinct chains of the training
    stream) leaves headroom the tiny way: 50 % of its targets stop after the scratchpad without marking an answer,
    so RL has a shared behaviour to learn (commit) and the budget caps what it can reach. Measured
    (docs/results/loo_tiny_chain.md): at lr 3e-5, 200 validation prompts x 4 every 4 steps, seed 0 went 0.290 ->
    0.530 in 96 steps, rising to ~0.47 by step 36 and then creeping; lr 5e-5 was unstable on 2 of 3 seeds
    (importance ratios up to 210 at staleness 8) and 1.5e-4 collapsed (0.29 -> 0.09 in 40 steps). NPR retired at
    most 1 of the 128 prompts in 96 steps (3 seeds) (a prompt needs 8 of 8 samples right).
    benchmarks/bench_fit_resolution.py shows how much such a curve's first half pins A. The earlier setting (15 %
    unmarked, 100 validation prompts) jumped to its plateau within ~8 steps in the 144-step leave-one-out study and
    stayed flat (0.36-0.40 over 40 steps) with 400 validation prompts: no rise for the sigmoid to fit."""
    p = tiny_plan(seed)
    length = LengthConfig(kind="interruption", think_budget_lo=30, think_budget_hi=38, answer_budget=4,
                          think_end="#", interruption_text="#", penalty_max_len=44, penalty_cache=8)
    exp = R(p.exp, name="scalerl_tiny_chain",
            rollout=R(p.exp.rollout, max_prompt_len=16, max_new_tokens=44, length=length),
            data=DataConfig(source="chain", chain_depth_lo=2, chain_depth_hi=6, n_train=128, val_size=200,
                            seed=seed, npr=True, npr_threshold=0.9),
            train=R(p.exp.train, lr=DERIVED_LR, steps=96, eval_every=4, checkpoint_every=24),
            out_dir="runs/tiny_chain")
    return R(p, exp=exp, warm_seq_len=64, warm_steps=300, warm_unmarked_frac=0.5, base_kind="char_chain",
             n_problems=20000)


def real_8b_plan(seed: int = 0) -> ExperimentPlan:
    """RECIPE.md's 8B recipe: 48 prompts x 16, AdamW 5e-7 (100 warm-up), eps 1e-15, wd 0.01, CISPO eps_max 5,
    interruption at U[10k, 12k] + 2k answer (16k total), PipelineRL-8, 16 trainer devices, SGLang generators.
    The 16,384-token row is 2,000 prompt + 12,288 thinking + 48 for the interruption text + 2,048 answer (the
    paper's 2,048 prompt tokens give up 48 to the interruption text, which the paper does not count); the row length
    is always ``rollout.max_prompt_len + rollout.max_new_tokens``.

    The markers follow the model (``rollout.length.think_end="auto"``): the paper's ``</think>`` and interruption text
    when the tokenizer holds ``</think>`` as one token (a model that thinks in ``<think>`` blocks), else the plain
    ``boxed`` pair of a base or instruct model under the default template (docs/DATA.md, "Reasoning
    markers"). A fixed ``</think>`` would be wrong for the base Llama-3.1-8B this preset is documented with: it never
    writes the tag, so every sample would run to its thinking budget and carry a stray ``</think>``."""
    exp = ExperimentConfig(
        name="scalerl_8b", model=llama3_8b(), mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        loss=LossConfig(kind="cispo", eps_max=5.0, aggregation="prompt", normalization="batch"),
        rollout=RolloutConfig(mode="pipeline", k=8, prompts_per_batch=48, group_size=16, temperature=1.0,
                              max_prompt_len=2000, max_new_tokens=14384, decode_chunk=16,
                              length=LengthConfig(kind="interruption", think_budget_lo=10240, think_budget_hi=12288,
                                                  answer_budget=2048, think_end="auto", interruption_text="auto"),
                              engine="sglang", weight_dtype="bfloat16"),
        data=DataConfig(source="jsonl", path="", val_size=1000, seed=seed),
        train=TrainConfig(lr=5e-7, warmup_steps=100, schedule="constant", adam_eps=1e-15, weight_decay=0.01,
                          grad_clip=1.0, steps=10000, microbatches=48, eval_every=100, eval_samples=16,
                          checkpoint_every=50, seed=seed),
        # model-written code on a real run: bubblewrap or refuse to start (--set sandbox.isolation=rlimits or auto
        # allows the rlimits mode explicitly)
        sandbox=SandboxSettings(isolation="bwrap"),
        out_dir="runs/8b",
    )
    return ExperimentPlan(exp=exp, real=True, warm_steps=0, warm_seq_len=0, n_trainer_devices=16)


def real_1b_plan(seed: int = 0) -> ExperimentPlan:
    """The cheapest real run: a Llama-3.2-1B-shaped model on one GPU, generating with the embedded JAX engine on the
    same device (co-located), on real math data (``--model DIR --data FILE.jsonl``).

    Budgets for real math prompts: 1,024 prompt tokens + 4,096 completion tokens (interruption at U[3000, 3500]
    thinking tokens, up to 48 for the interruption text, 512 answer), a 5,120-token training row. 16 prompts x 8
    samples per step in 16 micro-batches of 8 rows, AdamW 1e-6 (20 warm-up steps), eps 1e-15, wd 0.01, CISPO
    eps_max 5, PipelineRL-8. Memory per device: ``--dry-run`` compiles the state's initialisation and the step for
    one device and prints both peaks (the engine's bf16 weights and KV cache come on top: 128 rows x 5,120 tokens x
    16 layers x 8 KV heads x 64 x 2 (K and V) x 2 bytes = 21 GB)."""
    p = real_8b_plan(seed)
    exp = R(p.exp, name="scalerl_1b", model=llama3_1b(),
            rollout=R(p.exp.rollout, prompts_per_batch=16, group_size=8, max_prompt_len=1024, max_new_tokens=4096,
                      length=LengthConfig(kind="interruption", think_budget_lo=3000, think_budget_hi=3500,
                                          answer_budget=512, think_end="auto", interruption_text="auto"),
                      engine="embedded", local_servers=0, weight_dtype="bfloat16", generator_dtype="bfloat16"),
            data=DataConfig(source="jsonl", path="", val_size=500, seed=seed),
            train=R(p.exp.train, lr=1e-6, warmup_steps=20, steps=1000, microbatches=16, eval_every=50,
                    eval_samples=8, checkpoint_every=50),
            out_dir="runs/1b")
    return R(p, exp=exp, n_trainer_devices=1)


def gpu_rl_plan(seed: int = 0) -> ExperimentPlan:
    """The tiny recipe's task on one GPU with a Llama-3.2-1B-shaped model (``llama3_1b``: 16 layers, d 2048, vocab
    128,256, tied embeddings; random init; the special ids are the task's character tokenizer's), the embedded
    engine co-located on the trainer's device, generating in bf16: what ``benchmarks/gpu_rl.sh`` runs in one
    5-minute slot. A supervised warm start of 300 x 64 rows at lr 3e-4 (the tiny model's 3e-3 is too large for
    1.2B parameters), then 24 RL steps at lr 1e-5, evals every 2 steps on 96 prompts x 4 (the first-half fit needs
    5 evals). The live forecast is off (the fit runs after the RL steps); one checkpoint, at the end. Needs an
    accelerator (``real``; on a CPU, ``gpu_rl.sh --cpu-smoke`` runs the tiny model instead). Not yet run on a GPU:
    the learning rates are chosen, not measured."""
    p = tiny_plan(seed)
    model = R(llama3_1b(), bos_token_id=None, eos_token_id=1, pad_token_id=0)
    exp = R(p.exp, name="scalerl_gpu_rl", model=model,
            rollout=R(p.exp.rollout, engine="embedded", generator_dtype="bfloat16"),
            data=R(p.exp.data, val_size=96),
            train=R(p.exp.train, lr=1e-5, steps=24, eval_every=2, checkpoint_every=24, keep_checkpoints=1),
            forecast=R(p.exp.forecast, enabled=False), out_dir="runs/gpu_rl")
    return R(p, exp=exp, real=True, warm_steps=300, warm_batch=64, warm_lr=3e-4, warm_warmup=30)


def tiny_moe_plan(seed: int = 0) -> ExperimentPlan:
    """The tiny default with the Llama-4 MoE model (``tiny_moe``): same task, recipe and budgets."""
    p = tiny_plan(seed)
    return R(p, exp=R(p.exp, name="scalerl_tiny_moe", model=tiny_moe(), out_dir="runs/tiny_moe"))


def smoke_moe_plan(seed: int = 0) -> ExperimentPlan:
    """CI-sized tiny MoE run."""
    p = smoke_plan(seed)
    return R(p, exp=R(p.exp, name="scalerl_smoke_moe", model=tiny_moe()))


def scout_plan(seed: int = 0) -> ExperimentPlan:
    """RECIPE.md's recipe on Llama-4-Scout-17B-16E (section 5's MoE): the 8B preset's hyper-parameters, 16 trainer
    devices with the expert axis over all 16 (experts expert-parallel, everything else FSDP over the same axis)."""
    p = real_8b_plan(seed)
    return R(p, exp=R(p.exp, name="scalerl_scout", model=scout_17b16e(), mesh=MeshConfig(data=1, fsdp=1, expert=16),
                      out_dir="runs/scout"))


def qwen25_1_5b_plan(seed: int = 0) -> ExperimentPlan:
    """A DeepScaleR-sized run: Qwen2.5-1.5B shapes (``--model`` a DeepSeek-R1-Distill-Qwen-1.5B or Qwen2.5-Math-1.5B
    checkpoint brings its own) on one GPU, generating with the embedded engine on the same device. Every other
    number is the ``1b`` preset's (``real_1b_plan``: 1,024 prompt + 4,096 completion tokens, 16 prompts x 8, AdamW
    1e-6): a model of the same size class on the same one-device setup."""
    p = real_1b_plan(seed)
    return R(p, exp=R(p.exp, name="scalerl_qwen25_1_5b", model=qwen25_1_5b(), out_dir="runs/qwen25_1_5b"))


def qwen3_4b_plan(seed: int = 0) -> ExperimentPlan:
    """Qwen3-4B (the model Polaris-53K was built to train) on one node of 8 x 80 GB: RECIPE.md's 8B recipe
    (``real_8b_plan``: 48 prompts x 16 samples, a 16,384-token row with interruption at U[10k, 12k] thinking tokens
    + 2k answer, AdamW 5e-7, CISPO, PipelineRL-8), trained on 8 devices instead of 16. Qwen3 thinks in
    ``<think>`` blocks and its tokenizer holds ``</think>`` as one token, so ``think_end="auto"`` picks the
    paper's marker and interruption text; ``--set data.chat_template=true`` renders prompts with its own chat
    template (``--set data.enable_thinking=false`` for its non-thinking mode)."""
    p = real_8b_plan(seed)
    return R(p, exp=R(p.exp, name="scalerl_qwen3_4b", model=qwen3_4b(), out_dir="runs/qwen3_4b"),
             n_trainer_devices=8)


def qwen3_30b_a3b_plan(seed: int = 0) -> ExperimentPlan:
    """Qwen3-30B-A3B, the MoE RL users reach for before Scout: the 8B preset's recipe (as ``scout``) with the
    expert axis over 8 devices (16 experts per device; on 16 devices FSDP takes the other factor of 2), 8 devices
    by default. ``python -m experiments.scout_moe --preset qwen3_30b_a3b --dry-run``."""
    p = real_8b_plan(seed)
    return R(p, exp=R(p.exp, name="scalerl_qwen3_30b_a3b", model=qwen3_30b_a3b(),
                      mesh=MeshConfig(data=1, fsdp=-1, expert=8), out_dir="runs/qwen3_30b_a3b"),
             n_trainer_devices=8)


PRESETS: dict[str, Callable[[int], ExperimentPlan]] = {"tiny": tiny_plan, "smoke": smoke_plan, "small": small_plan,
                                                       "tiny_mathcode": tiny_mathcode_plan,
                                                       "tiny_chain": tiny_chain_plan, "1b": real_1b_plan,
                                                       "gpu_rl": gpu_rl_plan,
                                                       "8b": real_8b_plan, "qwen25_1_5b": qwen25_1_5b_plan,
                                                       "qwen3_4b": qwen3_4b_plan}
MOE_PRESETS: dict[str, Callable[[int], ExperimentPlan]] = {"tiny_moe": tiny_moe_plan, "smoke_moe": smoke_moe_plan,
                                                           "scout": scout_plan,
                                                           "qwen3_30b_a3b": qwen3_30b_a3b_plan}


def _loss(**kw) -> Callable[[ExperimentPlan], ExperimentPlan]:
    return lambda p: R(p, exp=R(p.exp, loss=R(p.exp.loss, **kw)))


def _rollout(**kw) -> Callable[[ExperimentPlan], ExperimentPlan]:
    return lambda p: R(p, exp=R(p.exp, rollout=R(p.exp.rollout, **kw)))


def _length_penalty(p: ExperimentPlan) -> ExperimentPlan:
    ro = p.exp.rollout
    return R(p, exp=R(p.exp, rollout=R(ro, length=R(ro.length, kind="penalty"))))


def _whole_loss(make: Callable[[], LossConfig], **rollout) -> Callable[[ExperimentPlan], ExperimentPlan]:
    def f(p: ExperimentPlan) -> ExperimentPlan:
        exp = R(p.exp, loss=make())
        if rollout:
            exp = R(exp, rollout=R(exp.rollout, **rollout))
        return R(p, exp=exp)

    return f


VARIANTS: dict[str, Callable[[ExperimentPlan], ExperimentPlan]] = {
    "scalerl": lambda p: p,
    # leave-one-out: one component swapped for its alternative
    "ppo_off_policy": _rollout(mode="ppo_off_policy"),
    "dapo": _loss(kind="dapo", eps_low=0.2, eps_high=0.26),
    "gspo": _loss(kind="gspo", eps_low=3e-3, eps_high=5e-3),
    "bf16_head": lambda p: R(p, exp=R(p.exp, model=R(p.exp.model, head_dtype="bfloat16"))),
    "sample_agg": _loss(aggregation="sample"),
    "token_agg": _loss(aggregation="token"),
    "prompt_norm": _loss(normalization="prompt"),
    "no_norm": _loss(normalization="none"),
    "no_zvf": _loss(filter_zero_variance=False),
    "no_npr": lambda p: R(p, exp=R(p.exp, data=R(p.exp.data, npr=False))),
    "length_penalty": _length_penalty,
    # the paper's baseline recipes
    "deepseek_grpo": _whole_loss(grpo_loss, mode="ppo_off_policy"),
    "qwen25_dapo": _whole_loss(dapo_loss, mode="ppo_off_policy"),
    "magistral": _whole_loss(dapo_loss, mode="pipeline"),
    "minimax": _whole_loss(lambda: LossConfig(kind="cispo", eps_max=5.0, aggregation="prompt"),
                           mode="ppo_off_policy"),
}
LOO_VARIANTS = ("ppo_off_policy", "dapo", "gspo", "bf16_head", "sample_agg", "token_agg", "prompt_norm", "no_norm",
                "no_zvf", "no_npr", "length_penalty")


def build_plan(preset: str, variant: str = "scalerl", seed: int = 0,
               presets: dict[str, Callable[[int], ExperimentPlan]] | None = None) -> ExperimentPlan:
    """``preset``'s plan (from ``presets``; default every preset, dense and MoE) with ``variant`` applied."""
    table = {**PRESETS, **MOE_PRESETS} if presets is None else presets
    if preset not in table:
        raise KeyError(f"unknown preset {preset!r}; choose one of {sorted(table)}")
    if variant not in VARIANTS:
        raise KeyError(f"unknown variant {variant!r}; choose one of {sorted(VARIANTS)}")
    plan = VARIANTS[variant](table[preset](seed))
    return R(plan, exp=R(plan.exp, name=f"{plan.exp.name}_{variant}"), variant=variant)
