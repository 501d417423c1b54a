"""Tokenizers: a protocol, the 17-symbol character tokenizer of the tiny task, and a ``tokenizers`` wrapper.

Conventions shared by every tokenizer here:

- ``encode(text)`` returns the ids of ``text`` only: it never adds bos or eos. Callers that want a bos
  prepend ``bos_id`` when it is not None; the sampler stops on ``eos_id`` (or any of ``stop_ids``).
- ``decode(ids)`` drops special tokens (pad, eos, bos) unless ``skip_special_tokens=False``.

Character vocabulary of the tiny arithmetic task (ids are fixed; checkpoints depend on them):

    0 <pad>   1 <eos>   2..11 '0'..'9'   12 '+'   13 '*'   14 '='   15 ';'   16 '#'
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable


class TokenizerError(ValueError):
    """Text or ids that a tokenizer cannot handle; the message names the offending item and position."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the rollout engine, trainer and data pipeline need from a tokenizer."""

    vocab_size: int
    bos_id: int | None
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (no bos/eos added)."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with special tokens removed."""
        ...


CHAR_PAD = "<pad>"
CHAR_EOS = "<eos>"
CHAR_SYMBOLS = "0123456789+*=;#"


class CharTokenizer:
    """Character tokenizer of the synthetic arithmetic task: ``<pad>``=0, ``<eos>``=1, then one id per symbol
    of ``0123456789+*=;#`` in that order (ids 2..16). No bos token."""

    def __init__(self) -> None:
        self.pad_id: int = 0
        self.eos_id: int = 1
        self.bos_id: int | None = None
        self.stop_ids: tuple[int, ...] = (self.eos_id,)
        self._id_to_str: list[str] = [CHAR_PAD, CHAR_EOS, *CHAR_SYMBOLS]
        self._char_to_id: dict[str, int] = {ch: i + 2 for i, ch in enumerate(CHAR_SYMBOLS)}
        self.vocab_size: int = len(self._id_to_str)

    @property
    def vocab(self) -> list[str]:
        """Token strings indexed by id."""
        return list(self._id_to_str)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``; an unknown character raises :class:`TokenizerError`."""
        ids = []
        for pos, ch in enumerate(text):
            i = self._char_to_id.get(ch)
            if i is None:
                raise TokenizerError(
                    f"CharTokenizer: character {ch!r} at position {pos} of {text!r} is not in the vocabulary "
                    f"{CHAR_SYMBOLS!r}"
                )
            ids.append(i)
        return ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; pad and eos are dropped (or rendered as ``<pad>``/``<eos>`` when
        ``skip_special_tokens=False``). An id outside the vocabulary raises :class:`TokenizerError`."""
        out = []
        for pos, i in enumerate(ids):
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"CharTokenizer: id {i} at position {pos} is outside [0, {self.vocab_size})")
            if skip_special_tokens and i in (self.pad_id, self.eos_id):
                continue
            out.append(self._id_to_str[i])
        return "".join(out)


def _token_content(tok) -> str | None:
    """``tokenizer_config.json`` stores special tokens as a string or as ``{"content": ...}``."""
    if isinstance(tok, dict):
        return tok.get("content")
    if isinstance(tok, str):
        return tok
    return None


def _as_id_list(v) -> list[int]:
    if v is None:
        return []
    if isinstance(v, int):
        return [v]
    return [int(x) for x in v]


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from a ``tokenizer.json`` file or a Hugging Face checkpoint directory.

    Special ids are resolved in this order: explicit constructor arguments; the token strings of
    ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``pad_token``); the ids of ``config.json``
    (``bos_token_id``, ``eos_token_id``, ``pad_token_id``; a list of eos ids uses the first as ``eos_id``).
    ``stop_ids`` collects every eos id found (``config.json`` and ``generation_config.json`` included), as
    Llama-3 instruct models stop on several. Without a pad token, ``pad_id`` falls back to ``eos_id``
    (padding is always masked, so any id works). Nothing is downloaded.
    """

    def __init__(
        self,
        path: str,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
    ) -> None:
        from tokenizers import Tokenizer as _RawTokenizer

        if os.path.isdir(path):
            directory, tok_file = path, os.path.join(path, "tokenizer.json")
        else:
            directory, tok_file = os.path.dirname(path), path
        if not os.path.isfile(tok_file):
            raise FileNotFoundError(f"HFTokenizer: no tokenizer.json at {tok_file!r}")
        self.path = tok_file
        self._tok = _RawTokenizer.from_file(tok_file)
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)

        tok_cfg = _read_json(os.path.join(directory, "tokenizer_config.json"))
        model_cfg = _read_json(os.path.join(directory, "config.json"))
        gen_cfg = _read_json(os.path.join(directory, "generation_config.json"))

        def from_token(key: str) -> int | None:
            content = _token_content(tok_cfg.get(key))
            return None if content is None else self._tok.token_to_id(content)

        def first(*cands):
            for c in cands:
                if c is not None:
                    return c
            return None

        cfg_eos = _as_id_list(model_cfg.get("eos_token_id"))
        gen_eos = _as_id_list(gen_cfg.get("eos_token_id"))
        self.bos_id = first(bos_id, from_token("bos_token"), *_as_id_list(model_cfg.get("bos_token_id"))[:1])
        resolved_eos = first(eos_id, from_token("eos_token"), *cfg_eos[:1], *gen_eos[:1])
        if resolved_eos is None:
            raise TokenizerError(
                f"HFTokenizer: no eos token found for {path!r} (tokenizer_config.json eos_token, config.json "
                "eos_token_id); pass eos_id= explicitly"
            )
        self.eos_id: int = int(resolved_eos)
        resolved_pad = first(pad_id, from_token("pad_token"), *_as_id_list(model_cfg.get("pad_token_id"))[:1])
        self.pad_id: int = int(self.eos_id if resolved_pad is None else resolved_pad)
        stops = [self.eos_id, *cfg_eos, *gen_eos]
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(int(s) for s in stops))
        self._special = {i for i in (self.bos_id, self.pad_id, *self.stop_ids) if i is not None}
        self.chat_template = _chat_template(directory, tok_cfg)
        self._tok_cfg = tok_cfg
        #: ids below this are the model's: a checkpoint may pad its vocabulary past the tokenizer's (Qwen's 151,936
        #: rows for 151,665 tokens), and a policy can sample a padding id. ``decode`` gives such ids no text, as the
        #: ``tokenizers`` library (hence transformers and SGLang) does; the run sets it to the model's vocab_size
        self.model_vocab_size: int = self.vocab_size

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without added special tokens."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; bos, eos/stop and pad ids are dropped unless ``skip_special_tokens=False``."""
        ids = [int(i) for i in ids]
        for pos, i in enumerate(ids):
            if not 0 <= i < max(self.vocab_size, self.model_vocab_size):
                raise TokenizerError(f"HFTokenizer: id {i} at position {pos} is outside [0, "
                                     f"{max(self.vocab_size, self.model_vocab_size)})")
        ids = [i for i in ids if i < self.vocab_size]  # the model's padding rows have no text
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                            **template_vars) -> str:
        """The prompt text of ``messages`` (``[{"role", "content"}, ...]``) under the directory's chat template,
        rendered as transformers renders it (sandboxed Jinja, ``trim_blocks``/``lstrip_blocks``, ``bos_token`` /
        ``eos_token`` as text, ``template_vars`` such as Qwen3's ``enable_thinking`` as template variables). The
        text may start with the bos token: callers must not prepend it again."""
        if self.chat_template is None:
            raise TokenizerError(f"HFTokenizer: {self.path!r} has no chat template (tokenizer_config.json "
                                 "'chat_template' or chat_template.jinja); use a plain prompt template instead")
        return _render_chat(self.chat_template, list(messages), add_generation_prompt, {
            **template_vars,
            "bos_token": _token_content(self._tok_cfg.get("bos_token")) or "",
            "eos_token": _token_content(self._tok_cfg.get("eos_token")) or "",
            "pad_token": _token_content(self._tok_cfg.get("pad_token")) or ""})

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry (or None)."""
        return self._tok.token_to_id(token)


def _chat_template(directory: str, tok_cfg: dict) -> str | None:
    """The default chat template: ``chat_template.jinja`` (transformers >= 4.50 writes it there), else the
    ``chat_template`` field (a string, or a list of ``{"name", "template"}`` of which "default" is used)."""
    f = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(f):
        with open(f, encoding="utf-8") as fh:
            return fh.read()
    t = tok_cfg.get("chat_template")
    if isinstance(t, list):
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    return t if isinstance(t, str) else None


def _render_chat(template: str, messages: list[dict], add_generation_prompt: bool, special: dict) -> str:
    import datetime

    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise TokenizerError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **special)
    except TemplateError as e:
        raise TokenizerError(f"chat template could not be rendered: {e}") from e


def batch_encode(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """``encode`` applied to each text."""
    return [tok.encode(t) for t in texts]
