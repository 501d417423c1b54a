"""Prompts and tokens: tokenizers, the arithmetic task, addition chains, jsonl math sets, the NPR curriculum and the
training pipeline."""

from scalerl_jax.data.chain import chain_problem, chain_split
from scalerl_jax.data.curriculum import NPRCurriculum
from scalerl_jax.data.jsonl import (
    DEFAULT_TEMPLATE,
    DataError,
    extract_gold,
    hash_answer,
    last_boxed,
    load_jsonl,
    make_prompt,
)
from scalerl_jax.data.pipeline import (
    AllPromptsRemovedError,
    PromptData,
    PromptIterator,
    build_prompt_data,
    epoch_seed,
    from_config,
    split_problems,
)
from scalerl_jax.data.tasks import (
    ARITH_SPACE,
    THINK_MARKER,
    Problem,
    arith_id,
    arith_problem,
    arith_problems,
    arith_split,
    arith_triple,
    split_thinking,
)
from scalerl_jax.data.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, TokenizerError

__all__ = [
    "ARITH_SPACE",
    "DEFAULT_TEMPLATE",
    "THINK_MARKER",
    "AllPromptsRemovedError",
    "CharTokenizer",
    "DataError",
    "HFTokenizer",
    "NPRCurriculum",
    "Problem",
    "PromptData",
    "PromptIterator",
    "Tokenizer",
    "TokenizerError",
    "arith_id",
    "arith_problem",
    "arith_problems",
    "arith_split",
    "arith_triple",
    "build_prompt_data",
    "chain_problem",
    "chain_split",
    "epoch_seed",
    "extract_gold",
    "from_config",
    "hash_answer",
    "last_boxed",
    "load_jsonl",
    "make_prompt",
    "split_problems",
    "split_thinking",
]
