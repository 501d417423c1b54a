"""Tokenizer directories that :class:`~scalerl_jax.data.tokenizer.HFTokenizer`, ``transformers.AutoTokenizer`` and
SGLang load: the character vocabulary of the tiny task, and a byte-level BPE trained on a task's own text.

Both are written with the ``tokenizers`` library as a ``tokenizer.json`` plus a ``tokenizer_config.json`` naming the
special tokens (and, optionally, a chat template), so a preset that makes its own base model produces the same
kind of directory a user brings with ``--model``: one run path for every preset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from scalerl_jax.data.tokenizer import CHAR_EOS, CHAR_PAD, CHAR_SYMBOLS

BPE_PAD, BPE_BOS, BPE_EOS = "<|pad|>", "<|bos|>", "<|eos|>"  # ids 0, 1, 2 of every BPE trained here

# A minimal chat template in the Jinja dialect transformers uses (tests render it both ways).
SIMPLE_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _write_config(directory: Path, *, bos: str | None, eos: str, pad: str, model_max_length: int,
                  chat_template: str | None) -> None:
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
           "model_max_length": model_max_length, "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (directory / "special_tokens_map.json").write_text(json.dumps(
        {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad)) if v is not None}, indent=2))


def save_char_tokenizer(directory: str | Path, *, model_max_length: int = 64, symbols: str = CHAR_SYMBOLS) -> Path:
    """Write a character tokenizer as a ``tokenizer.json`` directory: ``<pad>`` 0, ``<eos>`` 1, then one id per
    character of ``symbols`` in order. The default is the tiny task's 17-token vocabulary (the same ids as
    :class:`~scalerl_jax.data.tokenizer.CharTokenizer`); the math+code preset passes
    :data:`~scalerl_jax.data.code_synth.FX_SYMBOLS`. Returns the directory."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if len(set(symbols)) != len(symbols) or not symbols:
        raise ValueError(f"save_char_tokenizer: symbols must be distinct characters, got {symbols!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {CHAR_PAD: 0, CHAR_EOS: 1, **{ch: i + 2 for i, ch in enumerate(symbols)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))  # an unknown character is an error, never <unk>
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([CHAR_PAD, CHAR_EOS])
    tok.save(str(directory / "tokenizer.json"))
    _write_config(directory, bos=None, eos=CHAR_EOS, pad=CHAR_PAD, model_max_length=model_max_length,
                  chat_template=None)
    return directory


def train_bpe_tokenizer(texts: Iterable[str], directory: str | Path, *, vocab_size: int = 512,
                        min_frequency: int = 2, model_max_length: int = 2048,
                        chat_template: str | None = SIMPLE_CHAT_TEMPLATE) -> Path:
    """Train a byte-level BPE on ``texts`` and write it as a tokenizer directory. Returns the directory.

    Digits are split one per token before BPE (as Llama-3's tokenizer groups them in threes, and for the same
    reason: arithmetic stays learnable), the byte-level alphabet covers every input, and ``decode(encode(s)) == s``
    for any string. Special tokens: ``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[BPE_PAD, BPE_BOS, BPE_EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    _write_config(directory, bos=BPE_BOS, eos=BPE_EOS, pad=BPE_PAD, model_max_length=model_max_length,
                  chat_template=chat_template)
    return directory


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model")


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer files of an HF directory ``src`` into ``dst`` (hard links where the file system allows,
    so a per-step weight export does not rewrite a 9 MB tokenizer.json). Returns the names copied."""
    import os
    import shutil

    src, dst = Path(src), Path(dst)
    done = []
    for name in TOKENIZER_FILES:
        f = src / name
        if not f.is_file() or (dst / name).exists():
            continue
        try:
            os.link(f, dst / name)
        except OSError:
            shutil.copy2(f, dst / name)
        done.append(name)
    return done
