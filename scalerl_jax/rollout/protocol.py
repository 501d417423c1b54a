"""The generation protocol shared by the embedded JAX engine and the SGLang client.

A trainer submits :class:`GenerationRequest` s (prompt token ids, sampling parameters, ``n`` = G samples
per prompt, optional interruption length control) and receives, per request, ``n`` :class:`Completion` s
carrying token ids, per-token float32 log-probs under the sampling distribution (FP32 head), the policy
version that produced each token, which tokens were injected by length control, a finish reason and
timing. Back-ends: :mod:`scalerl_jax.rollout.engine` (in process) and
:mod:`scalerl_jax.rollout.client.sglang` (SGLang-API servers over HTTP).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "interrupted", "abort"]
INJECTED_VERSION = -1  # version recorded for tokens the policy did not sample (interruption text)


@dataclass(frozen=True)
class SamplingParams:
    """SGLang-compatible sampling parameters (same field names as SGLang's ``sampling_params``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"sampling_params.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ValueError(f"sampling_params.max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"sampling_params.n must be >= 1, got {self.n}")


@dataclass(frozen=True)
class LengthControl:
    """Token-level interruption (RECIPE.md section 4).

    Each sample draws a thinking budget uniformly from [budget_lo, budget_hi]. A sample that has generated
    that many tokens without emitting ``think_end_ids`` gets ``interruption_ids`` appended (flagged as
    injected, masked out of the loss) and may then write up to ``answer_budget`` more tokens. A sample that
    still has not stopped is truncated (finish reason "length", ``truncated=True``).
    """

    think_end_ids: tuple[int, ...]
    interruption_ids: tuple[int, ...]
    budget_lo: int
    budget_hi: int
    answer_budget: int

    def __post_init__(self) -> None:
        if not (0 < self.budget_lo <= self.budget_hi):
            raise ValueError(f"LengthControl: need 0 < budget_lo <= budget_hi, got {self.budget_lo}, {self.budget_hi}")
        if not self.interruption_ids or not self.think_end_ids:
            raise ValueError("LengthControl: think_end_ids and interruption_ids must be non-empty")


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    length: LengthControl | None = None
    request_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # carried through untouched (prompt id, epoch, ...)


@dataclass
class Completion:
    request_id: str
    sample_index: int
    prompt_ids: list[int]
    token_ids: list[int]  # completion tokens, injected ones included, stop token included
    logprobs: list[float]  # sampling log-prob per token (0.0 for injected tokens)
    versions: list[int]  # policy version that produced each token (INJECTED_VERSION for injected ones)
    injected: list[bool]  # True where length control inserted the token
    finish_reason: FinishReason
    truncated: bool = False  # never finished an answer (also after an interruption's answer budget)
    think_budget: int | None = None
    timing: dict[str, float] = field(default_factory=dict)  # e.g. {"submit": t, "done": t} (time.time())
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return any(self.injected)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class Generator(Protocol):
    """What the orchestrator needs from a generation back-end."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Blocking: ``n`` completions per request, in request order."""
        ...

    def update_weights(self, weights: Any, version: int) -> None:
        """Install new weights (a params pytree in process, or an HF checkpoint path over HTTP), tagged
        ``version``. Generation in flight continues with them from the next decode chunk on, keeping its
        KV cache (PipelineRL's in-flight update)."""
        ...

    @property
    def weight_version(self) -> int: ...

    def reseed(self, seed: int) -> None:
        """Make sampling deterministic from here on: the same requests after the same ``reseed`` give the same
        completions (the embedded engine; an SGLang fleet samples on its servers, so there only the client's own
        draws, such as thinking budgets, are re-seeded)."""
        ...
