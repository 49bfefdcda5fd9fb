"""Qwen3-TTS behind ``POST /v1/audio/speech`` (a :class:`~.contract.SpeechService`): request checks, and one
continuous-batching engine shared by every request, stepped on a worker thread, each request's frames
streamed through its own 12 Hz decoder.

Request fields (``app/surfaces/rest/routes.py``; names as vLLM-Omni's speech API for Qwen3-TTS):

- ``voice``: a CustomVoice speaker (``talker_config.spk_id``; case-insensitive). Ignored by VoiceDesign and
  Base checkpoints, which have no named speakers.
- ``instructions``: the voice description of VoiceDesign (required there), a style instruction for
  CustomVoice; Base takes none.
- ``ref_audio`` + ``ref_text`` (extension, Base only): the clip to clone, a base64 WAV (or a
  ``data:audio/wav;base64,`` URL) of 24 kHz audio, at least 1 s long; ``ref_text`` its
  transcript, which turns on in-context cloning with the clip's codes (without it: x-vector only).
- ``language``: ``auto`` or a ``codec_language_id`` key.

Every bad request raises :class:`SpeechError` before anything is queued, so it costs the other requests
nothing. Output: 24 kHz mono float32 pieces, the first after one codec frame (80 ms of audio), then 25-frame
pieces (:class:`~omniduplex.models.qwen3_tts.codec_stream.StreamingDecoder`).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

import numpy as np
import torch

from omniduplex.app.host.speech.contract import SpeechError, SpeechParams
from omniduplex.app.host.speech.engine_speech import EngineSpeech
from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE, load_qwen3_tts
from omniduplex.models.qwen3_tts.prompt import TalkerPrompt
from omniduplex.models.qwen3_tts.voice import VoiceError, VoicePrompter, read_ref_audio
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine
from omniduplex.pipeline.stages.engine_build import EngineSettings


def speech_error(e: VoiceError) -> SpeechError:
    """The service's error for a request the checkpoint refused (same message, field and code)."""
    return SpeechError(str(e), e.param, e.code)


def decode_ref_audio(data: str) -> np.ndarray:
    """A base64 WAV (or ``data:…;base64,`` URL) → float32 mono ``[n]`` at 24 kHz.

    Raises SpeechError: not base64, not audio, a rate other than 24 kHz, or too short
    (:func:`~omniduplex.models.qwen3_tts.voice.read_ref_audio`).
    """
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise SpeechError(f"ref_audio is not base64: {e}", "ref_audio") from e
    try:
        return read_ref_audio(raw)
    except VoiceError as e:
        raise speech_error(e) from e


class Qwen3Speech(EngineSpeech):
    """A loaded Qwen3-TTS checkpoint serving speech requests.

    Args:
        model_dir: the checkpoint (any variant; ``speech_tokenizer/`` with the decoder).
        max_num_seqs: requests batched per engine step.
        max_frames: codec frames per request at most (12.5 per second of audio).
        context: positions a request may use (prompt + frames); default: the talker's
            ``max_position_embeddings``, capped by the KV cache.
        sampling: :class:`~omniduplex.pipeline.engine.request.SamplingParams` fields over the reference's
            defaults (``{"temperature": 0}``: greedy).
    """

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model_dir: str | Path,
        max_num_seqs: int = 16,
        max_frames: int = 2048,
        context: int | None = None,
        sampling: dict | None = None,
    ) -> None:
        self.model = load_qwen3_tts(model_dir)
        self.tok = load_tokenizer(model_dir)
        self.variant = self.model.config.variant
        self.engine = Qwen3TTSEngine(self.model, EngineSettings(max_num_seqs=max_num_seqs))
        kv_positions = self.engine.engine.kv[0][0].shape[0] * BLOCK_SIZE  # blocks × 16 of one layer
        self.context = min(context or self.model.config.talker.max_position_embeddings, kv_positions)
        self.prompter = VoicePrompter(self.model, self.tok, self.context)
        self.max_frames, self.sampling = max_frames, dict(sampling or {})
        self._empty = torch.zeros((1, self.model.codec.cfg.num_quantizers, 0), dtype=torch.long)
        self._start("qwen3-tts")

    @property
    def voices(self) -> list[str]:
        """CustomVoice speaker names (empty for the other variants)."""
        return self.prompter.voices

    def prepare(self, request: SpeechParams) -> TalkerPrompt:
        """Check one request and build its talker prompt. Raises SpeechError (see the module docstring)."""
        r = request
        wav = decode_ref_audio(r.ref_audio) if r.ref_audio is not None else None
        try:
            v = self.prompter.voice(r.voice, r.instructions, r.language, wav, r.ref_text)
            return self.prompter.prompt(r.text, v)
        except VoiceError as e:
            raise speech_error(e) from e

    def describe(self) -> dict:
        """Voices and options: CustomVoice speakers; Base clones (``ref_audio``); VoiceDesign and CustomVoice
        read ``instructions``."""
        return {
            "family": "qwen3-tts",
            "voices": [{"name": v} for v in self.voices],
            "cloning": self.variant == "base",
            "instructions": self.variant != "base",
        }

    # -- the engine thread's parts (:class:`~.engine_speech.EngineSpeech`) -------------------------------
    def _add(self, request_id: str, prompt: TalkerPrompt) -> None:
        frames = min(self.max_frames, self.context - prompt.prefill.shape[0])
        self.engine.add(request_id, prompt, {**self.sampling, "max_tokens": frames})

    def _decoder(self, prompt: TalkerPrompt) -> StreamingDecoder:
        return StreamingDecoder(self.model.codec)

    def _pieces(self, stream: StreamingDecoder, ev) -> list[np.ndarray]:
        pieces = stream.push(ev.codes.view(1, -1, 1)) if ev.codes is not None else []
        if ev.finished:
            pieces += stream.push(self._empty, final=True)
        return [p.reshape(-1).float().numpy() for p in pieces]
