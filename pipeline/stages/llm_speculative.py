"""Speculative decoding for the cascade's LLM stage: the manifest's ``llm_speculative`` → a
:class:`~omniduplex.pipeline.engine.speculative.Speculator` for the stage's engine.

``llm_speculative: {method: ngram, k: 4}`` drafts by prompt lookup; ``{method: draft, draft: DIR_OR_GGUF,
k: 4}`` by a draft model of the same tokenizer (a checkpoint folder, or a ``.gguf`` imported once into the
cache like the LLM and served on its quantized blocks). See :mod:`omniduplex.pipeline.engine.speculative`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from omniduplex.models.cascade.gguf_import import cached_import
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.registry import LoadedModel, load_model
from omniduplex.pipeline.engine.spec_draft import DraftModel
from omniduplex.pipeline.engine.speculative import SpeculativeConfig, Speculator


def load_draft(path: str | Path, dtype: torch.dtype, device, cache: Path) -> LoadedModel:
    """The draft LM at ``path`` (checkpoint folder or ``.gguf``; a GGUF runs on its quantized blocks).

    Raises:
        CheckpointError: a path that is neither, or a checkpoint that does not load.
    """
    src = Path(path)
    folder = cached_import(src, cache / "gguf") if src.suffix == ".gguf" else src
    if not folder.is_dir():
        raise CheckpointError(f"draft model {src}: neither a checkpoint folder nor a .gguf file")
    if src.suffix == ".gguf":  # on its quantized blocks, never the float copy
        from omniduplex.models.cascade.gguf_quantized import load_quantized

        return load_quantized(folder, src, dtype)
    model = load_model(folder, parts=("thinker",), dtype=dtype, device=device)
    if model.thinker is None or model.thinker.model is None:
        raise CheckpointError(f"draft model {src}: not a text LM checkpoint")
    return model


def make_speculator(
    config: SpeculativeConfig | None,
    draft: LoadedModel | None,
    tokenizer: Tokenizer,
    vocab_size: int,
    engine_sizes: tuple[int, int, int],
    dtype: torch.dtype,
    device,
) -> Speculator | None:
    """The stage engine's speculator (``None`` without ``config``).

    Args:
        config: the parsed ``llm_speculative``.
        draft: the loaded draft model (``method: draft``), else ``None``.
        tokenizer, vocab_size: the target's (the draft must have the same vocabulary).
        engine_sizes: ``(num_blocks, max_num_seqs, max_num_batched_tokens)`` of the target's engine.

    Raises:
        ValueError: a draft model missing (``method: draft``) or given (``ngram``), or one of another
            vocabulary (logits width or token strings differ).
    """
    if config is None:
        return None
    if (config.method == "draft") != (draft is not None):
        raise ValueError(f"llm_speculative: method {config.method} and the draft model given disagree")
    if draft is None:
        return Speculator(config)
    width = draft.thinker.cfg.vocab_size
    if width != vocab_size:
        raise ValueError(f"draft model {draft.path}: {width} logits, the LLM has {vocab_size}")
    tok_file = Path(draft.path) / "tokenizer.json"
    if tok_file.is_file() and Tokenizer.from_file(str(tok_file)).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"draft model {draft.path}: another tokenizer than the LLM's")
    num_blocks, max_num_seqs, max_tokens = engine_sizes
    dm = DraftModel(draft.thinker, config.k, num_blocks, max_num_seqs, max_tokens, dtype, device)
    return Speculator(config, dm)
