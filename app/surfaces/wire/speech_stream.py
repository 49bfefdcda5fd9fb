"""The wire format of ``WS /v1/audio/speech/stream``: text streamed in, speech streamed out, clause by clause.

Modelled on two published conventions: ElevenLabs' WebSocket input streaming (``/v1/text-to-speech/{voice}/
stream-input``: text sent as it is written, a ``flush`` that speaks the buffered text now, an end-of-input
message) and the OpenAI Realtime API's events (a ``type`` on every JSON message, ``*.done`` events, the
``error`` event ``{"type": "error", "error": {type, code, message, param}}``, a cancel that drops what is
being generated). Every client message is a JSON text frame; unknown fields are ignored.

Client → server:

* ``{"type": "session.update", "voice"?, "instructions"?, "language"?, "ref_audio"?, "ref_text"?}``: the
  ``POST /v1/audio/speech`` fields of the same names, used for every clause cut from then on.
* ``{"type": "text", "text": "..."}``: more text (≤ :data:`MAX_TEXT_CHARS` characters a message). It is cut
  into clauses at sentence and clause boundaries (the cascade's ``ClauseSplitter``); each complete clause is
  spoken as soon as the speaker is free.
* ``{"type": "flush"}``: speak the buffered text now, even if it ends mid-clause.
* ``{"type": "cancel"}``: drop the buffered text, the queued clauses and the clause being spoken; answered
  by ``cancelled``, after which no audio of those clauses is sent.
* ``{"type": "end"}``: no more text: speak what is buffered, send ``done`` and close (code 1000).

Server → client:

* ``{"type": "session.created", "sample_rate": Hz, "format": "pcm_s16le", "channels": 1}`` on connect.
* ``{"type": "clause.created", "clause": n, "text": "..."}`` when clause ``n`` (0, 1, ... per socket) is cut;
* its audio: binary frames of 16-bit little-endian mono PCM at ``sample_rate`` (``?format=pcm``, the
  default), or ``{"type": "audio", "clause": n, "audio": base64 PCM}`` text frames (``?format=base64``);
* ``{"type": "clause.done", "clause": n, "samples": count}`` after its last audio;
* ``{"type": "cancelled", "clauses": [n, ...]}`` (the clauses dropped), ``{"type": "done"}`` after ``end``;
* ``{"type": "error", "error": {...}}`` (OpenAI shape, plus ``clause`` when one clause was refused, e.g. an
  unknown voice): the message at fault is dropped and the socket stays usable.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np

MAX_TEXT_CHARS = 4096
"""Longest ``text`` of one message (characters; ``POST /v1/audio/speech``'s ``input`` limit)."""
MAX_PENDING_CHARS = 16384
"""Most text buffered or queued and not yet spoken (characters): past it, ``text`` is refused
(``buffer_full``) until the speaker catches up."""
VOICE_FIELDS = ("voice", "instructions", "language", "ref_audio", "ref_text")
"""The ``session.update`` fields (as ``POST /v1/audio/speech``)."""
FORMATS = ("pcm", "base64")
"""Audio framings: binary PCM frames, or base64 ``audio`` events."""


class WireError(ValueError):
    """A client message that cannot be used: ``str(e)`` for the client, ``code`` and ``param`` as the OpenAI
    error object's."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Cancel:
    pass


@dataclass(frozen=True)
class End:
    pass


@dataclass(frozen=True)
class SessionUpdate:
    fields: dict
    """A subset of :data:`VOICE_FIELDS` → ``str`` (``language``) or ``str | None``."""


ClientEvent = Text | Flush | Cancel | End | SessionUpdate


def parse(raw: str | bytes) -> ClientEvent:
    """One client message → its event.

    Raises:
        WireError: not a JSON object (``invalid_json``), no or an unknown ``type`` (``unknown_type``), a
            ``text`` that is not a string or over :data:`MAX_TEXT_CHARS` (``text_too_long``), a
            ``session.update`` field that is not a string.
    """
    try:
        msg = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WireError(f"not JSON: {e}", "invalid_json") from e
    if not isinstance(msg, dict):
        raise WireError("a message must be a JSON object", "invalid_json")
    kind = msg.get("type")
    if kind == "text":
        text = msg.get("text")
        if not isinstance(text, str):
            raise WireError("text: a string is required", "invalid_value", "text")
        if len(text) > MAX_TEXT_CHARS:
            raise WireError(
                f"text has {len(text)} characters, over {MAX_TEXT_CHARS} a message", "text_too_long", "text"
            )
        return Text(text)
    if kind in ("flush", "cancel", "end"):
        return {"flush": Flush, "cancel": Cancel, "end": End}[kind]()
    if kind == "session.update":
        fields = {k: msg[k] for k in VOICE_FIELDS if k in msg}
        for k, v in fields.items():
            if not (isinstance(v, str) or (v is None and k != "language")):
                raise WireError(f"{k}: a string is required", "invalid_value", k)
            if isinstance(v, str) and k != "ref_audio" and len(v) > MAX_TEXT_CHARS:
                raise WireError(f"{k} is over {MAX_TEXT_CHARS} characters", "text_too_long", k)
        return SessionUpdate(fields)
    known = "text, flush, cancel, end, session.update"
    raise WireError(f"unknown message type {kind!r}: use one of {known}", "unknown_type", "type")


def event(kind: str, **fields) -> str:
    """A server event as a JSON text frame: ``{"type": kind, **fields}``."""
    return json.dumps({"type": kind, **fields})


def error_event(message: str, code: str, param: str | None = None, clause: int | None = None) -> str:
    """An ``error`` event (OpenAI Realtime's shape; ``server_error`` for codes ending in ``_failed``)."""
    kind = "server_error" if code.endswith("_failed") else "invalid_request_error"
    err = {"type": kind, "code": code, "message": message, "param": param}
    return event("error", error=err, **({} if clause is None else {"clause": clause}))


def pcm16(y: np.ndarray) -> bytes:
    """float32 ``[n]`` in [-1, 1] → 16-bit little-endian PCM bytes (clipped)."""
    return (np.clip(y, -1, 1) * 32767).astype("<i2").tobytes()


def audio_event(clause: int, pcm: bytes) -> str:
    """A base64 ``audio`` event carrying ``pcm`` (16-bit LE) of ``clause``."""
    return event("audio", clause=clause, audio=base64.b64encode(pcm).decode())
