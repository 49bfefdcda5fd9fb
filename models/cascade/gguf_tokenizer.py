"""A GGUF file's metadata and the Hugging Face tokenizer built from it (:mod:`.gguf_import` writes it as
``tokenizer.json``): byte-level BPE from ``tokenizer.ggml.tokens`` / ``merges``, the pre-tokenizer split of
``tokenizer.ggml.pre`` as llama.cpp's ``llm_tokenizer_bpe`` lists it, control and user-defined tokens as added
tokens (gguf spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from omniduplex.models.checkpoint import CheckpointError

# llama.cpp token types (``llama_token_type`` / gguf ``TokenType``)
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer splits by ``tokenizer.ggml.pre`` (llama.cpp ``llm_tokenizer_bpe`` regex lists).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_PRE = frozenset({"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"})
_DIGITS_THEN_GPT2_PRE = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell"})
_LLAMA3_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3"})
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's split (its ``tokenizer.json``; llama.cpp ``LLAMA_VOCAB_PRE_TYPE_QWEN2``): single digits."""
_QWEN2_PRE = frozenset({"qwen2", "deepseek-r1-qwen"})


class GGUFMeta:
    """Typed access to a reader's metadata fields; missing required keys raise CheckpointError."""

    def __init__(self, reader, path: Path) -> None:
        self.fields, self.path = reader.fields, path

    def get(self, key: str, default: Any = None) -> Any:
        f = self.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception as e:  # a malformed field; gguf raises assorted errors
            raise CheckpointError(f"{self.path.name}: unreadable GGUF metadata field {key!r} ({e})") from e

    def need(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise CheckpointError(f"{self.path.name}: GGUF metadata lacks {key!r}")
        return v


def token_ids(meta: GGUFMeta) -> dict[str, int]:
    """The `bos`, `eos`, `pad` and `unk` token ids (``*_token_id``) the file names, those it has."""
    out = {}
    for key, gkey in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
        ("unk_token_id", "unknown_token_id"),
    ):
        v = meta.get(f"tokenizer.ggml.{gkey}")
        if v is not None:
            out[key] = int(v)
    return out


def _pre_tokenizer(pre: str, path: Path):
    if pre in _GPT2_PRE:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _LLAMA3_PRE or pre in _QWEN2_PRE:
        split = _QWEN2_SPLIT if pre in _QWEN2_PRE else _LLAMA3_SPLIT
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise CheckpointError(f"{path.name}: tokenizer.ggml.pre={pre!r} is not supported")


def build_tokenizer(meta: GGUFMeta, path: Path) -> Tokenizer:
    """A ``tokenizers`` byte-level BPE from the GGUF ``tokenizer.ggml.*`` fields.

    Tokens are stored already spelled in the GPT-2 byte alphabet; merges as ``"left right"`` strings.
    Tokens of type CONTROL become special added tokens, USER_DEFINED plain added tokens (both matched
    whole, never normalised). A ``bos`` is prepended by the post-processor only when
    ``tokenizer.ggml.add_bos_token`` is true.

    Raises:
        CheckpointError: a tokenizer model other than ``gpt2`` (e.g. SentencePiece ``llama``), or an
            unknown pre-tokenizer type.
    """
    kind = meta.need("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(
            f"{path.name}: tokenizer.ggml.model={kind!r} is not supported (only 'gpt2' BPE)"
        )
    tokens = list(meta.need("tokenizer.ggml.tokens"))
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in meta.need("tokenizer.ggml.merges")]
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False
        )
    )
    pre = meta.get("tokenizer.ggml.pre", "default")
    tok.pre_tokenizer = _pre_tokenizer(pre, path)
    if pre in _QWEN2_PRE:
        tok.normalizer = normalizers.NFC()  # as Qwen2's own tokenizer.json
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=ty == _CONTROL, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    ids = token_ids(meta)
    if meta.get("tokenizer.ggml.add_bos_token", False) and "bos_token_id" in ids:
        bos = tokens[ids["bos_token_id"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids["bos_token_id"])]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok
