"""OpenAI-compatible REST audio routes: ``/v1/models``, ``/v1/audio/transcriptions``, ``/v1/audio/speech``
(and ``WS /v1/audio/speech/stream``, text streamed in: :mod:`.speech_stream`).
Shapes follow the OpenAI API reference (``openai`` SDK 3.54 types). The models are the host's services
(:mod:`omniduplex.app.host.speech`): loaded on first use, run in a worker thread or their own engine.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import soundfile as sf
from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field

from omniduplex.app.host.auth import Access
from omniduplex.app.host.speech.contract import SPEECH_RATE, SpeechError
from omniduplex.app.host.state import ServerState
from omniduplex.app.surfaces.rest.speech_stream import add_route as add_speech_stream
from omniduplex.app.surfaces.wire.openai_rest import MODEL_ID, error_response
from omniduplex.pipeline.audio_io import AudioInputError, load_audio

MAX_UPLOAD_BYTES = 25 << 20
"""Largest ``/v1/audio/transcriptions`` upload (25 MiB, the API's limit)."""


class SpeechBody(BaseModel):
    """``POST /v1/audio/speech``: ``input`` text (≤ 4096 characters, the API's limit), ``response_format``
    ``wav`` or ``pcm`` (24 kHz 16-bit mono) — the compressed formats are not produced here.

    ``model`` picks one of the server's speech models (``serve --tts DIR``, repeatable: the folder's name;
    ``omniduplex`` / ``tts-1``: the first; see ``GET /v1/audio/voices``). With a VoxCPM2, Higgs or Fish Speech
    checkpoint: :mod:`omniduplex.app.host.speech.runner_speech`. With a Qwen3-TTS checkpoint (or a cascade
    ``--model`` whose TTS is one;
    :mod:`omniduplex.app.host.speech.qwen3`): ``voice`` is a CustomVoice speaker, ``instructions`` the
    VoiceDesign voice description (or a CustomVoice style), ``language`` ``auto`` or a language the checkpoint
    knows, and the extension fields ``ref_audio`` (base64 24 kHz WAV, ≥ 1 s) + ``ref_text`` (its transcript)
    clone a voice on a Base checkpoint. Piper ignores them. ``speed`` is accepted and not applied.
    """

    model: str = MODEL_ID
    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = None
    response_format: str = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(None, max_length=4096)
    language: str = "auto"
    ref_audio: str | None = None
    ref_text: str | None = Field(None, max_length=4096)


def wav_header() -> bytes:
    """A 24 kHz 16-bit mono WAV header whose lengths say "unknown" (streamed)."""
    head = io.BytesIO()
    with sf.SoundFile(head, "w", SPEECH_RATE, 1, "PCM_16", format="WAV") as f:
        f.write(np.zeros(0, np.int16))
    header = bytearray(head.getvalue()[:44])
    header[4:8] = header[40:44] = (0xFFFFFFFF).to_bytes(4, "little")
    return bytes(header)


def _int16(y: np.ndarray) -> bytes:
    return (np.clip(y, -1, 1) * 32767).astype("<i2").tobytes()


ACCESS = (Access("/v1/models"), Access("/v1/audio/"), Access("/v1/audio/speech/stream", connection=True))
"""What the edge asks of these routes: an API key or token (the speech stream opens a session)."""


def router(host: ServerState) -> APIRouter:
    """The REST audio routes over ``host``'s services."""
    r = APIRouter(tags=["audio"])

    @r.get("/v1/models")
    async def models():
        """The one model this server serves, in the OpenAI list shape."""
        return {
            "object": "list",
            "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "omniduplex"}],
        }

    @r.post("/v1/audio/transcriptions")
    async def transcriptions(
        file: UploadFile = File(...),
        model: str = Form(MODEL_ID),
        language: str | None = Form(None),
        prompt: str | None = Form(None),
        response_format: str = Form("json"),
    ):
        """Transcribe an audio file (any format libsndfile reads) with Whisper: ``json`` → ``{"text"}``,
        ``text``, ``verbose_json`` → ``{text, language, duration, words[{word, start, end}]}``."""
        if response_format not in ("json", "text", "verbose_json"):
            return error_response(
                400, f"response_format {response_format!r}: use json, text or verbose_json", "invalid_value"
            )
        data = await file.read(MAX_UPLOAD_BYTES + 1)
        if len(data) > MAX_UPLOAD_BYTES:
            return error_response(
                413, f"file larger than {MAX_UPLOAD_BYTES >> 20} MiB", "file_too_large", "file"
            )
        try:
            wav = load_audio(data)
        except AudioInputError as e:
            return error_response(400, str(e), "invalid_file", "file")
        asr = await asyncio.to_thread(host.transcriber)
        t = await asyncio.to_thread(asr.transcribe, wav)
        if response_format == "text":
            return PlainTextResponse(t.text + "\n")
        if response_format == "verbose_json":
            words = [{"word": w.word.strip(), "start": w.start_s, "end": w.end_s} for w in t.words]
            return {
                "task": "transcribe",
                "language": t.language,
                "duration": t.duration_s,
                "text": t.text,
                "words": words,
            }
        return {"text": t.text}

    @r.get("/v1/audio/voices")
    async def voices():
        """Each speech model's voices and what a request may ask of it: ``{"object": "list", "data":
        [{"model", "family", "voices": [{"name", ...}], "cloning", "instructions", ...}]}`` (a model whose
        checkpoint does not load: ``{"model", "error"}``)."""
        data = await asyncio.to_thread(lambda: host.speech_registry().describe())
        return {"object": "list", "data": data}

    @r.post("/v1/audio/speech")
    async def speech(req: SpeechBody):
        """Speak ``input`` with the host's speech service, streamed as it makes pieces (Qwen3-TTS: the first
        after one codec frame; Piper: clause by clause)."""
        if req.response_format not in ("wav", "pcm"):
            return error_response(
                400, f"response_format {req.response_format!r}: use wav or pcm", "invalid_value"
            )
        try:
            service = await asyncio.to_thread(host.speech_service, req.model)
        except SpeechError as e:
            return error_response(404 if e.code == "model_not_found" else 400, str(e), e.code, e.param)
        fields = (req.input, req.voice, req.instructions, req.language, req.ref_audio, req.ref_text)
        try:
            request = await asyncio.to_thread(service.prompt, *fields)
        except SpeechError as e:
            return error_response(400, str(e), e.code, e.param)
        pieces = service.stream(request)
        try:  # a request refused once queued (the TTS graph checks voices in its talker stage) gets its 400
            first = await anext(pieces)
        except SpeechError as e:
            return error_response(400, str(e), e.code, e.param)
        except StopAsyncIteration:
            first = None

        async def pcm_chunks():
            if first is None:
                return
            yield _int16(first)
            async for piece in pieces:
                yield _int16(piece)

        if req.response_format == "pcm":
            return StreamingResponse(pcm_chunks(), media_type="audio/pcm")

        async def wav_stream():
            yield wav_header()
            async for chunk in pcm_chunks():
                yield chunk

        return StreamingResponse(wav_stream(), media_type="audio/wav")

    add_speech_stream(r, host)
    return r
