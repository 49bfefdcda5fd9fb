"""A spoken turn with the unified delay-pattern LM: engine (text → speech, optional CFG) → DAC vocoder.

Two workers on the same contract as the Thinker–Talker stages: the LM engine emits text ids and one
de-interleaved codec frame per audio step; the codec worker decodes windows of
``codec_chunk_frames`` with ``left`` and ``right`` context (DAC's convolutions are centred, so exact
streaming needs look-ahead: ``right · hop / sampling_rate`` seconds of latency).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from tokenizers import Tokenizer

from omniduplex.models.dac import DacCodec, decode_window
from omniduplex.models.registry import LoadedModel

from .engine.engine import Engine
from .engine.unified_adapter import UnifiedAdapter
from .messages import TurnEvent


@dataclass
class CodecStream:
    """Frames of one request and how far they were decoded."""

    frames: list[list[int]] = field(default_factory=list)
    emitted: int = 0
    finished: bool = False


def codec_windows(s: CodecStream, chunk: int, right: int) -> list[tuple[int, int]]:
    """Frame windows ready to decode: full chunks whose right context exists, or the rest at the end."""
    out = []
    n = len(s.frames)
    while s.emitted < n:
        end = min(s.emitted + chunk, n)
        if not s.finished and (end - s.emitted < chunk or end + right > n):
            break
        out.append((s.emitted, end))
        s.emitted = end
    return out


class UnifiedTurnRunner:
    """Runs turns of a unified checkpoint in this process (engine + codec), yielding turn events.

    Args:
        model: a loaded unified checkpoint (``model.unified``, ``model.codec``).
        chunk_frames / left / right: codec window and contexts, in codec frames.
    """

    def __init__(
        self,
        model: LoadedModel,
        chunk_frames: int = 8,
        left: int | None = None,
        right: int | None = None,
        num_blocks: int = 1024,
        max_num_seqs: int = 64,
    ) -> None:
        self.model, self.codec = model, model.codec
        self.adapter = UnifiedAdapter(model.unified)
        self.engine = Engine(
            self.adapter, num_blocks, max_num_seqs, 2048, dtype=model.unified.lm_head.weight.dtype
        )
        rf = self.codec.receptive_field_frames()
        self.chunk, self.left, self.right = (
            chunk_frames,
            rf if left is None else left,
            rf if right is None else right,
        )
        self.rate = self.codec.cfg.sampling_rate

    @torch.no_grad()
    def run(
        self,
        prompt_ids: list[int],
        tok: Tokenizer,
        max_text_tokens: int,
        max_audio_frames: int,
        cfg_scale: float = 1.0,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> Iterator[TurnEvent]:
        """One turn: ``text`` deltas, ``audio`` chunks (float32 at the codec rate), then ``done``."""
        t0 = time.perf_counter()
        req = self.adapter.make_request(
            "u0", prompt_ids, max_text_tokens, max_audio_frames, cfg_scale, temperature, seed
        )
        self.engine.add_request(req)
        stream, text_ids, sent, first_audio, samples = CodecStream(), [], "", None, 0
        while self.engine.has_unfinished():
            for o in self.engine.step():
                if "text_token" in o.extras:
                    text_ids.append(o.extras["text_token"])
                    full = tok.decode(text_ids, skip_special_tokens=True)
                    if full != sent:
                        yield TurnEvent("text", o.request_id, text=full[len(sent) :])
                        sent = full
                if "codes" in o.extras:
                    stream.frames.append(o.extras["codes"])
                stream.finished = o.finished
            for a, b in codec_windows(stream, self.chunk, self.right):
                codes = torch.tensor(stream.frames).T[None]  # [1, S, F]
                wav = decode_window(self.codec, codes, a, b, self.left, self.right)[0, 0].float().numpy()
                first_audio = first_audio or time.perf_counter()
                samples += wav.size
                yield TurnEvent("audio", "u0", pcm=np.ascontiguousarray(wav))
        e2el = time.perf_counter() - t0
        audio_s = samples / self.rate
        yield TurnEvent(
            "done",
            "u0",
            metrics={
                "ttfp_ms": 1000 * ((first_audio or time.perf_counter()) - t0),
                "e2el_ms": 1000 * e2el,
                "audio_s": audio_s,
                "rtf": e2el / audio_s if audio_s else float("inf"),
                "frames": len(stream.frames),
            },
        )


def is_unified(model_dir) -> bool:
    """Whether ``model_dir`` holds a unified delay-pattern checkpoint."""
    from omniduplex.models.checkpoint import read_config

    return "OmniduplexUnifiedLM" in (read_config(model_dir).get("architectures") or [])


__all__ = ["CodecStream", "DacCodec", "UnifiedTurnRunner", "codec_windows", "is_unified"]
