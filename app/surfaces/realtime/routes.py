"""OpenAI-compatible HTTP and WebSocket routes: ``/v1/realtime`` (GA Realtime API),
``/v1/realtime/client_secrets``, ``/v1/audio/transcriptions``, ``/v1/audio/speech``, ``/v1/models``.
Shapes follow the OpenAI API reference (``openai`` SDK 3.54 types); the conversation logic is the
:class:`~omniduplex.app.core.session.Session`'s.

The REST audio endpoints run the cascade's Whisper and Piper models in the server process (loaded on first
use, run in a worker thread); the realtime WebSocket runs a full session over the shared pipeline.

Connecting before the server is ready (stages starting, or a crashed stage restarting; ``/readyz`` 503): the
``/v1/realtime`` WebSocket is accepted, gets one ``error`` event (``type: server_error``, ``code:
server_not_ready``, ``message``: which stage is starting or restarting) and is closed with code 1013 ("try
again later"); no session is created. The client is refused rather than held until ready, so it can retry
with backoff or go to another replica (the LiveKit remote plugin retries). A full or draining server answers
the same way with ``code: session_limit_reached``. See :mod:`omniduplex.app.host.readiness`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import threading
from functools import lru_cache

import numpy as np
import soundfile as sf
import soxr
from fastapi import APIRouter, File, Form, Request, UploadFile, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field

from omniduplex.app.host.admission import CallsFull, admit, new_call_id, release
from omniduplex.app.host.readiness import CLOSE_TRY_AGAIN_LATER, NOT_READY_CODE, close_reason, unready_reason
from omniduplex.app.surfaces.realtime.connection import RealtimeConnection
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.pipeline.audio_io import AudioInputError, load_audio

log = logging.getLogger("omniduplex.realtime")
router = APIRouter()

MODEL_ID = "omniduplex"
"""The model ``/v1/models`` lists; any ``model`` a client sends is accepted and served by the pipeline."""
CLIENT_SECRET_TTL_S = 600
"""Default lifetime of a ``/v1/realtime/client_secrets`` token (s; the API's default is 600)."""


def _error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error body ``{"error": {message, type, param, code}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


# -- realtime ---------------------------------------------------------------------------------------------
class _RealtimeCall:
    """A realtime connection in the server's session table (:mod:`..slots`)."""

    def __init__(self, ws: WebSocket, conn: RealtimeConnection) -> None:
        self.ws, self.conn, self.id, self.session = ws, conn, conn.session.id, conn.session

    async def close(self, reason: str) -> None:
        await self.session.close(reason)
        with contextlib.suppress(Exception):  # already closed
            await self.ws.close(code=1001, reason=reason[:120])


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket) -> None:
    """The GA Realtime API over a WebSocket (``?model=`` accepted and ignored: the server's pipeline)."""
    state = ws.app.state.server
    offered = ws.scope.get("subprotocols") or []
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    reason = unready_reason(state)
    if reason is not None:  # before a Session exists: it would have no pipeline to run on
        log.info("realtime connection refused: %s", reason)
        await _refuse(ws, reason, NOT_READY_CODE)
        return
    sid = new_call_id("rt")
    conn = RealtimeConnection(ws, sid, state.responder, state.cfg.session, lambda: _turn_model(state))
    call = _RealtimeCall(ws, conn)
    try:
        admit(state, call)
    except CallsFull as e:
        await _refuse(ws, str(e), "session_limit_reached")
        await conn.session.close("server full")
        return
    try:
        await conn.run()
    finally:
        release(state, call)


async def _refuse(ws: WebSocket, message: str, code: str) -> None:
    """One ``error`` event (``server_error``/``code``), then close 1013 "try again later"."""
    with contextlib.suppress(Exception):  # the client may already be gone
        await ws.send_text(ev.error(message, code=code, type="server_error").model_dump_json())
        await ws.close(code=CLOSE_TRY_AGAIN_LATER, reason=close_reason(message))


def _turn_model(state):
    """The server's Smart Turn model, loaded on first use by a ``semantic_vad`` session."""
    if state.turn_model is None:
        from omniduplex.app.core.turn_detection import SmartTurnModel

        state.turn_model = SmartTurnModel()
    return state.turn_model


class ClientSecretRequest(BaseModel):
    """``POST /v1/realtime/client_secrets`` body: ``expires_after {anchor, seconds}`` and a ``session`` config
    applied when the browser connects with the token."""

    expires_after: dict | None = None
    session: dict | None = None


@router.post("/v1/realtime/client_secrets")
async def client_secrets(body: ClientSecretRequest, request: Request):
    """Mint a short-lived token a browser uses instead of an API key (``Authorization: Bearer ek_…``)."""
    ttl = int((body.expires_after or {}).get("seconds", CLIENT_SECRET_TTL_S))
    if not 10 <= ttl <= 7200:
        return _error(
            400, "expires_after.seconds must be between 10 and 7200", "invalid_value", "expires_after"
        )
    value, expires_at = request.app.state.tokens.mint(ttl)
    session = {"type": "realtime", "object": "realtime.session", "model": MODEL_ID, **(body.session or {})}
    return {"value": value, "expires_at": expires_at, "session": session}


# -- models, transcription, speech --------------------------------------------------------------------------
@router.get("/v1/models")
async def models():
    """The one model this server serves, in the OpenAI list shape."""
    return {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "omniduplex"}],
    }


@lru_cache(maxsize=1)
def _asr():
    from omniduplex.models.cascade.asr import WhisperASR
    from omniduplex.models.weights import WHISPER_TINY_EN, locate

    return WhisperASR(locate(WHISPER_TINY_EN).parent)


@lru_cache(maxsize=1)
def _tts():
    from omniduplex.models.cascade.tts import PiperTTS
    from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, locate

    return PiperTTS(locate(PIPER_JOE), locate(PIPER_JOE_CONFIG))


MAX_UPLOAD_BYTES = 25 << 20
"""Largest ``/v1/audio/transcriptions`` upload (25 MiB, the API's limit)."""


@router.post("/v1/audio/transcriptions")
async def transcriptions(
    file: UploadFile = File(...),
    model: str = Form(MODEL_ID),
    language: str | None = Form(None),
    prompt: str | None = Form(None),
    response_format: str = Form("json"),
):
    """Transcribe an audio file (any format libsndfile reads) with Whisper: ``json`` → ``{"text"}``, ``text``,
    ``verbose_json`` → ``{text, language, duration, words[{word, start, end}]}``."""
    if response_format not in ("json", "text", "verbose_json"):
        return _error(
            400, f"response_format {response_format!r}: use json, text or verbose_json", "invalid_value"
        )
    data = await file.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        return _error(413, f"file larger than {MAX_UPLOAD_BYTES >> 20} MiB", "file_too_large", "file")
    try:
        wav = load_audio(data)
    except AudioInputError as e:
        return _error(400, str(e), "invalid_file", "file")
    t = await asyncio.to_thread(_asr().transcribe, wav)
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


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``: ``input`` text (≤ 4096 characters, the API's limit), ``response_format``
    ``wav`` or ``pcm`` (24 kHz 16-bit mono) — the compressed formats are not produced here.

    With a Qwen3-TTS checkpoint (``serve --tts DIR``, or a cascade ``--model`` whose TTS is one;
    :mod:`omniduplex.app.host.speech.qwen3`): ``voice`` is a
    CustomVoice speaker, ``instructions`` the VoiceDesign voice description (or a CustomVoice style),
    ``language`` ``auto`` or a language the checkpoint knows, and the extension fields ``ref_audio`` (base64
    24 kHz WAV, ≥ 1 s) + ``ref_text`` (its transcript) clone a voice on a Base checkpoint. Piper ignores
    them. ``speed`` is accepted and not applied.
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


_speech_lock = threading.Lock()


def _tts_dir(cfg) -> str | None:
    """The Qwen3-TTS checkpoint of the speech endpoint: ``cfg.tts``, else the TTS of a cascade manifest
    ``cfg.model`` when that is a Qwen3-TTS checkpoint (the assistant's voice), else ``None`` (Piper)."""
    if getattr(cfg, "tts", None):
        return cfg.tts
    from omniduplex.models.cascade.manifest import is_cascade, load_manifest

    if cfg.model and is_cascade(cfg.model):
        m = load_manifest(cfg.model)
        return str(m.tts) if m.tts_is_qwen3 else None
    return None


def _qwen3_speech(state):
    """The server's Qwen3-TTS speech service (:func:`_tts_dir`), loaded on first use (blocking: call it in a
    worker thread); ``None`` without one."""
    with _speech_lock:
        if not hasattr(state, "speech_dir"):
            state.speech_dir = _tts_dir(state.cfg)
        if state.speech_dir is None:
            return None
        if getattr(state, "speech", None) is None:
            from omniduplex.app.host.speech.qwen3 import Qwen3Speech

            if getattr(state.cfg, "tts_graph", False):
                from omniduplex.app.host.speech.qwen3_graph import Qwen3GraphSpeech

                state.speech = Qwen3GraphSpeech(state.speech_dir)
            else:
                state.speech = Qwen3Speech(state.speech_dir)
            state.speech_owned = True  # the server's shutdown closes it
    return state.speech


def _wav_header() -> bytes:
    """A 24 kHz 16-bit mono WAV header whose lengths say "unknown" (streamed)."""
    head = io.BytesIO()
    with sf.SoundFile(head, "w", 24000, 1, "PCM_16", format="WAV") as f:
        f.write(np.zeros(0, np.int16))
    header = bytearray(head.getvalue()[:44])
    header[4:8] = header[40:44] = (0xFFFFFFFF).to_bytes(4, "little")
    return bytes(header)


def _int16(y: np.ndarray) -> bytes:
    return (np.clip(y, -1, 1) * 32767).astype("<i2").tobytes()


@router.post("/v1/audio/speech")
async def speech(req: SpeechRequest, request: Request):
    """Speak ``input``: with Qwen3-TTS when the server has one (streamed as its decoder yields pieces: the
    first after one codec frame), else with the Piper voice, streamed clause by clause."""
    if req.response_format not in ("wav", "pcm"):
        return _error(400, f"response_format {req.response_format!r}: use wav or pcm", "invalid_value")
    qwen3 = await asyncio.to_thread(_qwen3_speech, request.app.state.server)
    if qwen3 is not None:
        from omniduplex.app.host.speech.qwen3 import SpeechError

        try:
            prompt = await asyncio.to_thread(
                qwen3.prompt,
                req.input,
                req.voice,
                req.instructions,
                req.language,
                req.ref_audio,
                req.ref_text,
            )
        except SpeechError as e:
            return _error(400, str(e), e.code, e.param)
        pieces = qwen3.stream(prompt)
        try:  # a request refused once queued (the TTS graph checks voices in its talker stage) gets its 400
            first = await anext(pieces)
        except SpeechError as e:
            return _error(400, str(e), e.code, e.param)
        except StopAsyncIteration:
            first = None

        async def pcm_chunks():
            if first is None:
                return
            yield _int16(first)
            async for piece in pieces:
                yield _int16(piece)

    else:
        pcm_chunks = _piper_chunks(req.input)

    if req.response_format == "pcm":
        return StreamingResponse(pcm_chunks(), media_type="audio/pcm")

    async def wav_stream():
        yield _wav_header()
        async for chunk in pcm_chunks():
            yield chunk

    return StreamingResponse(wav_stream(), media_type="audio/wav")


def _piper_chunks(text: str):
    """An async generator function of 24 kHz int16 chunks: Piper, clause by clause."""
    from omniduplex.pipeline.clauses import ClauseSplitter

    splitter = ClauseSplitter()
    clauses = splitter.push(text) + splitter.flush()
    tts = _tts()

    async def pcm_chunks():
        stream = soxr.ResampleStream(tts.sample_rate, 24000, 1, dtype="float32")
        for i, clause in enumerate(clauses):
            audio = await asyncio.to_thread(tts.synthesize, clause)
            yield _int16(stream.resample_chunk(audio, last=i == len(clauses) - 1))

    return pcm_chunks
