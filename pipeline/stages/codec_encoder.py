"""First stage of the unified graph: the user's speech → DAC codes → the LM's prompt steps.

Input tensors: ``waveform`` float32 ``[samples]`` at 16 kHz (may be empty for a text-only turn with
meta ``user_text``); meta ``user_text``, ``system_prompt``, ``history`` (list of ``[role, text]``).
Output: ``prompt_steps`` int64 ``[P, S]`` (:func:`omniduplex.models.unified.prompt.conversation_steps`),
the meta passed on. The waveform is resampled to the codec's ``sampling_rate`` (soxr) and encoded with
the first ``S`` codebooks of the DAC residual quantizer.
"""

from __future__ import annotations

import numpy as np
import soxr
import torch

from omniduplex.models.registry import LoadedModel
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.models.unified.prompt import conversation_steps
from omniduplex.pipeline.audio_io import MODEL_INPUT_RATE
from omniduplex.pipeline.messages import Encoded, StageMessage
from omniduplex.pipeline.stages.turn_batch import TurnBatching

MAX_INPUT_S = 60.0
"""Longest user turn accepted (s): the prompt grows by ~86 steps per second at 44.1 kHz / hop 512."""


class CodecEncoderWorker(TurnBatching):
    """Encodes pending turns one DAC call each (utterances differ in length; the encoder is cheap)."""

    def __init__(self, model: LoadedModel, max_batch: int = 16) -> None:
        self.cfg = model.unified_config
        self.encoder = model.codec_encoder
        self.rate = self.encoder.cfg.sampling_rate
        self.tok = load_tokenizer(model.path)
        self.max_batch = max_batch
        self.pending: list[StageMessage] = []

    def submit(self, msg: StageMessage) -> None:
        """Raises ValueError for a malformed waveform, a too-long one, or a turn with neither speech
        nor text (this turn only)."""
        wav = msg.tensors.get("waveform")
        if wav is None or wav.ndim != 1:
            raise ValueError(f"turn {msg.request_id}: need a 1-D 16 kHz waveform")
        if wav.numel() > MAX_INPUT_S * MODEL_INPUT_RATE:
            raise ValueError(f"turn {msg.request_id}: speech longer than {MAX_INPUT_S:.0f} s")
        if wav.numel() == 0 and not msg.meta.options.user_text:
            raise ValueError(f"turn {msg.request_id}: empty waveform and no user_text")
        self.pending.append(msg)

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        batch = self.take_batch()
        outs = []
        for m in batch:
            codes = self._encode(m.tensors["waveform"])
            steps = conversation_steps(
                self.cfg,
                self.tok,
                codes,
                user_text=m.meta.options.user_text or "",
                history=[tuple(h) for h in m.meta.options.history or []],
                system_prompt=m.meta.options.system_prompt,
            )
            meta = Encoded(turn=m.meta.turn)
            outs.append(StageMessage(m.request_id, {"prompt_steps": steps}, meta, last=True))
        return outs

    def _encode(self, wav16k: torch.Tensor) -> torch.Tensor | None:
        """16 kHz ``[samples]`` (any device) → local codes int64 ``[S, F]`` on the host, where the prompt is
        built (``None`` for no speech)."""
        if wav16k.numel() == 0:
            return None
        x = wav16k.detach().to("cpu", torch.float32).numpy()
        if self.rate != MODEL_INPUT_RATE:
            x = soxr.resample(x, MODEL_INPUT_RATE, self.rate, quality="HQ")
        w = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None, None]
        return self.encoder.encode(w, self.cfg.num_streams)[0].cpu()
