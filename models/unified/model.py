"""The unified delay-pattern speech LM (OpusLM layout): one Qwen3 decoder that writes text, then speaks.

OpusLM (Tian et al. 2025, "OpusLM: A Family of Open Unified Speech Language Models") puts text and
``S`` audio-codec streams into one vocabulary. Every decoding step carries up to ``S`` tokens (one per
stream, the audio streams in the MusicGen delay pattern, :mod:`.delay_pattern`); the step's input
embedding is the SUM of its tokens' embeddings, and stream ``i``'s logits come from one shared LM head
applied to the last hidden state plus a learnt stream embedding: ``logits_i = W_H (h_t + e_i)``
(ESPnet-SpeechLM's ``head_emb``).

Flat vocabulary (``V = text_vocab_size + S · audio_vocab_size`` ids, ``A = audio_vocab_size``)::

    [0, text_vocab_size)                                   text: tokenizer ids + the specials below
    [text_vocab_size + i·A, text_vocab_size + (i+1)·A)     stream i's audio sub-vocabulary, i < S

Within stream ``i``'s region, local id ``c < codebook_size`` is codec code ``c`` of RVQ level ``i``;
local ``codebook_size`` is the stream's PAD (delay/drain filler) and ``codebook_size + 1`` its audio
EOS (only stream 0's EOS is ever predicted). There is no per-stream BOS: the transition's bridge
tokens open the audio segment. Any further local ids (``A > codebook_size + 2``) are unused padding.

Text specials (all in the text region): ``bos_token_id`` starts a prompt; ``eos_token_id`` ends the
turn without (more) audio; ``speech_start_token_id`` is what the model predicts to start speaking;
``bridge_token_ids`` are forced after that decision (see :mod:`.unified_phases`);
``null_prompt_id`` is the whole prompt of a CFG companion (:func:`null_prompt_ids`).

Tensor names: ``model.embed_tokens.weight`` ``[V, H]``, ``model.layers.N.*`` (Qwen3), ``model.norm.
weight``, ``stream_embeddings`` ``[S, H]``, ``lm_head.weight`` ``[V, H]``, and the codec decoder under
``codec.*`` (:mod:`.dac`, a separate module so the LM stage does not hold it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from omniduplex.models.config import ConfigError, DecoderConfig
from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.layers import DecoderStack

ARCHITECTURE = "OmniduplexUnifiedLM"
MODEL_TYPE = "omniduplex_unified"
_UNIFIED_KEYS = (
    "text_vocab_size",
    "num_streams",
    "codebook_size",
    "audio_vocab_size",
    "bos_token_id",
    "eos_token_id",
    "speech_start_token_id",
    "bridge_token_ids",
    "null_prompt_id",
)


@dataclass
class UnifiedConfig:
    """``config.json`` of an ``OmniduplexUnifiedLM`` checkpoint.

    The decoder fields (``hidden_size``, ``num_hidden_layers``, ... as ``Qwen3ForCausalLM``) sit at the
    top level of the dict; ``vocab_size`` there must equal ``text_vocab_size + S · audio_vocab_size``.
    ``codec_config`` is a ``transformers`` ``DacConfig`` dict whose ``n_codebooks >= num_streams`` and
    ``codebook_size`` equals ours.
    """

    decoder: DecoderConfig
    text_vocab_size: int
    num_streams: int
    codebook_size: int
    audio_vocab_size: int
    bos_token_id: int
    eos_token_id: int
    speech_start_token_id: int
    bridge_token_ids: list[int]
    null_prompt_id: int
    codec_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bridge_token_ids = [int(t) for t in self.bridge_token_ids]
        if self.num_streams < 1:
            raise ConfigError(f"num_streams={self.num_streams} must be >= 1")
        if self.audio_vocab_size < self.codebook_size + 2:
            raise ConfigError(
                f"audio_vocab_size={self.audio_vocab_size} leaves no room for pad and eos after "
                f"codebook_size={self.codebook_size}"
            )
        want = self.text_vocab_size + self.num_streams * self.audio_vocab_size
        if self.decoder.vocab_size != want:
            raise ConfigError(
                f"vocab_size={self.decoder.vocab_size} but text_vocab_size + num_streams·audio_vocab_size "
                f"= {want}"
            )
        if not self.bridge_token_ids:
            raise ConfigError("bridge_token_ids must hold at least one token")
        specials = [
            self.bos_token_id,
            self.eos_token_id,
            self.speech_start_token_id,
            self.null_prompt_id,
            *self.bridge_token_ids,
        ]
        bad = [t for t in specials if not 0 <= t < self.text_vocab_size]
        if bad:
            raise ConfigError(
                f"special text ids {bad} lie outside the text region [0, {self.text_vocab_size})"
            )
        if self.eos_token_id in self.bridge_token_ids:
            raise ConfigError("eos_token_id must not be a bridge token")
        if self.codec_config:
            n, cb = self.codec_config.get("n_codebooks"), self.codec_config.get("codebook_size")
            if n is not None and n < self.num_streams:
                raise ConfigError(f"codec_config.n_codebooks={n} < num_streams={self.num_streams}")
            if cb is not None and cb != self.codebook_size:
                raise ConfigError(f"codec_config.codebook_size={cb} != codebook_size={self.codebook_size}")

    @property
    def vocab_size(self) -> int:
        return self.decoder.vocab_size

    def stream_offset(self, stream: int) -> int:
        """Flat id of local id 0 of ``stream``'s audio region."""
        return self.text_vocab_size + stream * self.audio_vocab_size

    def audio_pad_id(self, stream: int) -> int:
        return self.stream_offset(stream) + self.codebook_size

    def audio_eos_id(self, stream: int = 0) -> int:
        return self.stream_offset(stream) + self.codebook_size + 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnifiedConfig:
        """Raises ``ConfigError`` on missing keys or an inconsistent layout."""
        missing = [k for k in _UNIFIED_KEYS if k not in d]
        if missing:
            raise ConfigError(f"unified config is missing {missing}")
        return cls(
            decoder=DecoderConfig.from_dict(d),
            codec_config=dict(d.get("codec_config") or {}),
            **{k: d[k] for k in _UNIFIED_KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The HF-style dict :meth:`from_dict` reads (decoder fields flat, plus ``architectures``)."""
        out = dataclasses.asdict(self.decoder)
        out.update({k: getattr(self, k) for k in _UNIFIED_KEYS})
        out.update(
            architectures=[ARCHITECTURE],
            model_type=MODEL_TYPE,
            codec_config=dict(self.codec_config),
            torch_dtype="float32",
        )
        return out


def null_prompt_ids(cfg: UnifiedConfig) -> list[int]:
    """The prompt of a CFG companion: ``[null_prompt_id]`` (the condition removed, Ho & Salimans 2022)."""
    return [cfg.null_prompt_id]


def text_steps(ids: list[int] | torch.Tensor, num_streams: int) -> torch.Tensor:
    """Text ids ``[T]`` → step tokens int64 ``[T, S]``: the id in slot 0, ``-1`` (absent) elsewhere."""
    ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
    out = torch.full((ids.shape[0], num_streams), -1, dtype=torch.int64)
    out[:, 0] = ids
    return out


class UnifiedTextModel(DecoderStack):
    """Qwen3 decoder stack with ``embed_tokens`` ``[V, hidden]`` over the whole flat vocabulary."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class UnifiedLM(nn.Module):
    """Decoder + stream embeddings + one shared LM head (module docstring). No codec, no scheduling."""

    def __init__(self, cfg: UnifiedConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.decoder.hidden_size
        self.model = UnifiedTextModel(cfg.decoder)
        self.stream_embeddings = nn.Parameter(torch.zeros(cfg.num_streams, h))
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
        if cfg.decoder.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Step tokens int64 ``[T, S]`` (flat ids, ``-1`` = stream absent) → ``[T, hidden]``.

        Row ``t`` is the sum of the embeddings of its present tokens (a text step has only slot 0; an
        audio step has all ``S``, pads included). A row with no present token embeds to zeros.
        """
        present = tokens >= 0
        x = self.model.embed_tokens(tokens.clamp(min=0))
        return (x * present[..., None].to(x.dtype)).sum(dim=1)

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Embedded steps ``[T, hidden]`` over a flat paged batch → final normed hidden ``[T, hidden]``."""
        return self.model(x, batch, kv_caches)[0]

    def stream_logits(self, hidden: torch.Tensor, streams: list[int] | None = None) -> torch.Tensor:
        """``hidden`` ``[B, H]`` → logits ``[B, len(streams), V]`` (default all ``S`` streams).

        ``logits[:, j] = lm_head(hidden + stream_embeddings[streams[j]])``, computed as one matmul.
        """
        e = self.stream_embeddings if streams is None else self.stream_embeddings[streams]
        return self.lm_head(hidden[:, None, :] + e[None].to(hidden.dtype))

    def decode_logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What one decode step needs, in compact form (fp32):

        * ``primary`` ``[B, V]``: stream 0 over the whole vocabulary (its unmasked argmax decides the phase);
        * ``aux`` ``[B, S-1, A]``: stream ``i >= 1`` over its own audio region only (``A = audio_vocab_size``,
          local ids: codes, then pad, then EOS).

        Equal to :meth:`stream_logits` on those ids, at ``V + (S-1)·A`` head columns instead of ``S·V``.
        """
        cfg = self.cfg
        s, a = cfg.num_streams, cfg.audio_vocab_size
        e = self.stream_embeddings.to(hidden.dtype)
        w = self.lm_head.weight
        primary = torch.nn.functional.linear(hidden + e[0], w).float()
        lo = cfg.stream_offset(1)
        regions = w[lo : lo + (s - 1) * a].view(s - 1, a, -1)  # rows of streams 1..S-1 (contiguous)
        aux = torch.einsum("bsh,sah->bsa", hidden[:, None, :] + e[None, 1:], regions).float()
        return primary, aux
