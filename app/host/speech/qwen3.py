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

import asyncio
import base64
import binascii
import contextlib
import itertools
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import torch

from omniduplex.app.host.speech.contract import SpeechError, SpeechRequest, SpeechService
from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE, load_qwen3_tts
from omniduplex.models.qwen3_tts.prompt import TalkerPrompt
from omniduplex.models.qwen3_tts.voice import VoiceError, VoicePrompter, read_ref_audio
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.qwen3_tts import Qwen3TTSEngine

log = logging.getLogger("omniduplex.speech")


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


class _Job:
    """One request's output queue (filled from the worker thread) and streaming decoder."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stream: StreamingDecoder) -> None:
        self.loop, self.stream, self.queue = loop, stream, asyncio.Queue()

    def put(self, item) -> None:
        with contextlib.suppress(RuntimeError):  # the request's event loop is closed: nobody listens
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Qwen3Speech(SpeechService):
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
        self.engine = Qwen3TTSEngine(self.model, max_num_seqs=max_num_seqs)
        kv_positions = self.engine.engine.kv[0][0].shape[0] * BLOCK_SIZE  # blocks × 16 of one layer
        self.context = min(context or self.model.config.talker.max_position_embeddings, kv_positions)
        self.prompter = VoicePrompter(self.model, self.tok, self.context)
        self.max_frames, self.sampling = max_frames, dict(sampling or {})
        self._cv = threading.Condition()
        self._incoming: list[tuple[str, TalkerPrompt, dict, _Job]] = []
        self._aborts: list[str] = []
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="qwen3-tts", daemon=True)
        self._thread.start()

    @property
    def voices(self) -> list[str]:
        """CustomVoice speaker names (empty for the other variants)."""
        return self.prompter.voices

    def prepare(self, request: SpeechRequest) -> TalkerPrompt:
        """Check one request and build its talker prompt. Raises SpeechError (see the module docstring)."""
        r = request
        wav = decode_ref_audio(r.ref_audio) if r.ref_audio is not None else None
        try:
            v = self.prompter.voice(r.voice, r.instructions, r.language, wav, r.ref_text)
            return self.prompter.prompt(r.text, v)
        except VoiceError as e:
            raise speech_error(e) from e

    async def stream(self, prompt: TalkerPrompt) -> AsyncIterator[np.ndarray]:
        """Speak ``prompt``: float32 24 kHz pieces ``[n]`` as the decoder completes them. Leaving the
        iteration early (client gone) aborts the request."""
        rid = f"speech-{next(self._ids)}"
        job = _Job(asyncio.get_running_loop(), StreamingDecoder(self.model.codec))
        frames = min(self.max_frames, self.context - prompt.prefill.shape[0])
        with self._cv:
            self._incoming.append((rid, prompt, {**self.sampling, "max_tokens": frames}, job))
            self._cv.notify()
        done = False
        try:
            while True:
                item = await job.queue.get()
                if item is None:
                    done = True
                    return
                if isinstance(item, Exception):
                    done = True
                    raise item
                yield item
        finally:
            if not done:
                with self._cv:
                    self._aborts.append(rid)
                    self._cv.notify()

    def close(self) -> None:
        """Stop the worker thread (requests in flight get no more audio)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    # -- worker thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        jobs: dict[str, _Job] = {}
        empty = torch.zeros((1, self.model.codec.cfg.num_quantizers, 0), dtype=torch.long)
        while True:
            with self._cv:
                while not (self._closed or self._incoming or self._aborts or self.engine.has_unfinished()):
                    self._cv.wait()
                if self._closed:
                    return
                incoming, self._incoming = self._incoming, []
                aborts, self._aborts = self._aborts, []
            for rid in aborts:
                if jobs.pop(rid, None) is not None:
                    self.engine.abort(rid)
            for rid, prompt, sampling, job in incoming:
                try:
                    self.engine.add(rid, prompt, sampling)
                    jobs[rid] = job
                except ValueError as e:
                    job.put(SpeechError(str(e), "input"))
            if not self.engine.has_unfinished():
                continue
            try:
                events = self.engine.step()
                for ev in events:
                    job = jobs.get(ev.request_id)
                    if job is None:
                        continue
                    pieces = job.stream.push(ev.codes.view(1, -1, 1)) if ev.codes is not None else []
                    if ev.finished:
                        pieces += job.stream.push(empty, final=True)
                    for p in pieces:
                        job.put(p.reshape(-1).float().numpy())
                    if ev.finished:
                        job.put(None)
                        del jobs[ev.request_id]
            except Exception as e:  # a bug: fail the requests in flight, keep serving new ones
                log.exception("qwen3-tts step failed")
                for rid, job in jobs.items():
                    self.engine.abort(rid)
                    job.put(RuntimeError(f"speech generation failed: {e}"))
                jobs.clear()
