"""OpenAI Realtime API wire protocol (GA): parsing client events, building server events, errors.

Source: the GA Realtime API reference (https://platform.openai.com/docs/api-reference/realtime,
client events ``/realtime-client-events``, server events ``/realtime-server-events``) as generated
into the ``openai`` Python SDK 3.54 (``openai.types.realtime``: ``RealtimeClientEvent``,
``RealtimeServerEvent`` and the ``*_param.py`` TypedDicts). The SDK is this module's test oracle
(``tests/test_realtime_protocol.py``); it is not imported at runtime.

Layout: :mod:`.client_events` (client event models, :class:`SessionConfig`), :mod:`.server_events`
(server event models and their builders, each event with a fresh ``event_id``; the objects inside them in
:mod:`.server_objects`), this module (the parsers both ways and :class:`ProtocolError`), :mod:`.audio` (the
three audio formats ↔ float32 PCM). Both directions are typed: the server parses client events
(:func:`parse_client_event`) and sends server event models (``model_dump_json()``); a client (the LiveKit
remote plugin) builds client event models (:func:`client_event_json`) and parses server events
(:func:`parse_server_event`).

Event order of one audio response (server → client)::

    response.created {response: {status: in_progress, metadata, …}}
    response.output_item.added {item: {status: in_progress, content: []}}
    conversation.item.added {previous_item_id, item}
    response.content_part.added {part: {type: audio, transcript: ""}}      # before any delta
    response.output_audio.delta*  and  response.output_audio_transcript.delta*   (interleaved)
    response.output_audio.done
    response.output_audio_transcript.done {transcript}
    response.content_part.done {part: {type: audio, transcript}}
    response.output_item.done {item: {status: completed | incomplete}}
    conversation.item.done {item}
    response.done {response: {status: completed | cancelled | failed | incomplete, output, usage}}

With ``output_modalities: ["text"]`` the part is ``{type: text}`` and the deltas are
``response.output_text.delta*`` → ``response.output_text.done {text}``. ``output_audio_buffer.started|
stopped|cleared`` report playout (WebRTC/SIP semantics); ``input_audio_buffer.speech_started`` during a
response is the interruption signal clients act on.

Beta → GA renames (the beta protocol is gone; we speak GA only):

* server events: ``response.audio.delta|done`` → ``response.output_audio.delta|done``;
  ``response.audio_transcript.delta|done`` → ``response.output_audio_transcript.delta|done``;
  ``response.text.delta|done`` → ``response.output_text.delta|done``; ``conversation.item.created`` →
  ``conversation.item.added`` + ``conversation.item.done``. We never emit the beta names.
* client fields (:data:`BETA_FIELDS`): ``session.modalities`` → ``session.output_modalities``;
  ``session.input_audio_format: "pcm16"|"g711_ulaw"|"g711_alaw"`` → ``session.audio.input.format:
  {type: "audio/pcm", rate: 24000} | {type: "audio/pcmu"} | {type: "audio/pcma"}`` (output likewise);
  ``session.turn_detection``, ``session.input_audio_transcription``,
  ``session.input_audio_noise_reduction`` → ``session.audio.input.*``; ``session.voice|speed`` →
  ``session.audio.output.*``; ``max_response_output_tokens`` → ``max_output_tokens``; assistant content
  ``text|audio`` → ``output_text|output_audio``; ``session.type: "realtime"`` is now required.

Decision: beta shapes are rejected, not translated. A beta field is answered with an ``error`` event
(``invalid_request_error``/``unknown_parameter``, ``param`` = the beta path, message naming the GA
replacement), so a beta client fails loudly at its first ``session.update`` instead of running with
a silently ignored audio format or modality. Other unknown fields are ignored (lenient, like the API);
known fields are type-checked strictly (``"5"`` is not an integer).

Accepted but not honoured: ``tools``, ``tool_choice``, ``noise_reduction`` (stored and echoed in
``session.updated``); ``model`` (ignored: the server's stays). Rejected with ``invalid_value``: items
other than ``message`` (function calls, MCP), ``input_image`` content, ``session.type: "transcription"``,
``response.conversation`` other than ``auto``/``none``, ``output_modalities`` other than one of
``["audio"]`` / ``["text"]``, ``audio/pcm`` at a rate other than 24000 Hz.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

from omniduplex.app.surfaces.wire.realtime.client_events import CLIENT_EVENTS, ClientEvent
from omniduplex.app.surfaces.wire.realtime.server_events import SERVER_EVENTS, Error, ServerEvent, error

INVALID_JSON = "invalid_json"
"""The message is not UTF-8 JSON."""
INVALID_EVENT = "invalid_event"
"""The JSON is not an object."""
MISSING_PARAMETER = "missing_required_parameter"
UNKNOWN_PARAMETER = "unknown_parameter"
"""A beta-only field (see :data:`BETA_FIELDS`)."""
INVALID_VALUE = "invalid_value"
"""Wrong type or value, unknown event type, or a feature we do not support."""
INVALID_AUDIO = "invalid_audio"
"""Bad base64, or a byte count that is not whole samples (raised by :mod:`.audio` too)."""

BETA_FIELDS: dict[str, dict[str, str]] = {
    "session.update": {
        "session.modalities": "session.output_modalities",
        "session.input_audio_format": "session.audio.input.format",
        "session.output_audio_format": "session.audio.output.format",
        "session.input_audio_transcription": "session.audio.input.transcription",
        "session.input_audio_noise_reduction": "session.audio.input.noise_reduction",
        "session.turn_detection": "session.audio.input.turn_detection",
        "session.voice": "session.audio.output.voice",
        "session.speed": "session.audio.output.speed",
        "session.max_response_output_tokens": "session.max_output_tokens",
    },
    "response.create": {
        "response.modalities": "response.output_modalities",
        "response.voice": "response.audio.output.voice",
        "response.output_audio_format": "response.audio.output.format",
        "response.max_response_output_tokens": "response.max_output_tokens",
    },
}
"""Event type → {beta field path: GA field path}; a beta path in a client event is rejected."""

BETA_EVENTS = {
    "transcription_session.update": "GA uses session.update with session.type 'transcription' "
    "(transcription-only sessions are not supported here)",
}
"""Beta-only client event types, with the hint sent back."""

_EVENT_ID = re.compile(rb'"event_id"\s*:\s*"((?:[^"\\]|\\.){1,256})"')


class ProtocolError(Exception):
    """A client event we cannot accept; becomes an ``error`` server event (:meth:`to_event`).

    ``code``: one of the module's code constants; ``param``: dotted path of the offending field
    (``session.audio.input.format.rate``, ``item.content[0].type``); ``event_id``: the client's
    ``event_id`` of the bad event when it could be read, else ``None``.
    """

    def __init__(
        self, code: str, message: str, event_id: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.event_id, self.param = code, message, event_id, param
        self.type = "invalid_request_error"

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, {self.event_id!r}, {self.param!r})"

    def to_event(self) -> Error:
        """The ``error`` server event for this error."""
        return error(self.message, code=self.code, type=self.type, param=self.param, event_id=self.event_id)


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """One WebSocket text message → a validated client event model.

    Raises :class:`ProtocolError`: ``invalid_json`` (not UTF-8 JSON; the ``event_id`` is still
    recovered by pattern when present), ``invalid_event`` (not an object), ``missing_required_parameter``
    / ``invalid_value`` (pydantic validation; ``param`` names the field), ``invalid_value`` with
    ``param="type"`` (unknown or beta-only event type), ``unknown_parameter`` (beta field),
    ``invalid_audio`` (audio that is not base64).
    """
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        blob = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
        m = _EVENT_ID.search(blob[:4096])
        eid = m.group(1).decode("utf-8", "replace") if m else None
        raise ProtocolError(INVALID_JSON, f"message is not valid JSON: {e}", eid) from None
    if not isinstance(data, dict):
        raise ProtocolError(INVALID_EVENT, "a client event must be a JSON object")
    eid = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if kind is None:
        raise ProtocolError(MISSING_PARAMETER, "missing required parameter: 'type'", eid, "type")
    cls = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        hint = BETA_EVENTS.get(kind, "") if isinstance(kind, str) else ""
        msg = f"invalid value {kind!r} for 'type'. " + (
            f"{kind!r} is a beta event: {hint}"
            if hint
            else f"Supported values are: {', '.join(CLIENT_EVENTS)}"
        )
        raise ProtocolError(INVALID_VALUE, msg, eid, "type")
    _reject_beta_fields(kind, data, eid)
    if kind == "session.update" and _get(data, "session.type") == "transcription":
        msg = "transcription sessions are not supported; use session.type 'realtime'"
        raise ProtocolError(INVALID_VALUE, msg, eid, "session.type")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise _from_validation(e, data, eid) from None


def _get(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _reject_beta_fields(kind: str, data: dict, eid: str | None) -> None:
    for beta, ga in BETA_FIELDS.get(kind, {}).items():
        parent, _, leaf = beta.rpartition(".")
        obj = _get(data, parent)
        if isinstance(obj, dict) and leaf in obj:
            msg = f"unknown parameter {beta!r}: it is a beta Realtime API field; the GA API uses {ga!r}"
            raise ProtocolError(UNKNOWN_PARAMETER, msg, eid, beta)


_CODES = {"missing": MISSING_PARAMETER, "invalid_audio": INVALID_AUDIO}


def _from_validation(exc: ValidationError, data: dict, eid: str | None) -> ProtocolError:
    """The first pydantic error as a ProtocolError whose ``param`` is the path in the client's JSON."""
    err = exc.errors(include_url=False)[0]
    param = _json_path(data, err["loc"], err["type"], err.get("ctx") or {})
    where = f" at {param!r}" if param else ""
    if err["type"] == "missing":
        msg = f"missing required parameter: {param!r}"
    else:
        msg = f"invalid value{where}: {err['msg']}"
    return ProtocolError(_CODES.get(err["type"], INVALID_VALUE), msg, eid, param or None)


def _json_path(data: Any, loc: tuple, err_type: str, ctx: dict) -> str:
    """Map a pydantic ``loc`` onto the client's JSON, dropping union tags (``item.content[0].text``)."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int) and isinstance(data, list) and 0 <= part < len(data):
            data, out = data[part], f"{out}[{part}]"
        elif isinstance(data, dict) and part in data:
            data, out = data[part], f"{out}.{part}" if out else str(part)
        elif i == len(loc) - 1 and err_type == "missing":
            out = f"{out}.{part}" if out else str(part)
    if err_type.startswith("union_tag") and "discriminator" in ctx:
        out = f"{out}.{ctx['discriminator'].strip(chr(39))}" if out else ctx["discriminator"].strip("'")
    return out


_SERVER_EVENT = TypeAdapter(ServerEvent)


def parse_server_event(raw: str | bytes | dict) -> ServerEvent | None:
    """One server message (JSON text, or already decoded) → its server event model; ``None`` for an event
    type we do not model (a client ignores those, as the API asks of clients).

    Raises:
        ValueError: not JSON, not an object, or a known event type with missing or ill-typed fields
            (``pydantic.ValidationError`` is a ``ValueError``).
    """
    data = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
    if not isinstance(data, dict):
        raise ValueError(f"a server event must be a JSON object, got {type(data).__name__}")
    if data.get("type") not in SERVER_EVENTS:
        return None
    return _SERVER_EVENT.validate_python(data)


def client_event_json(event: ClientEvent) -> str:
    """The wire form of a client event model: the fields it was built (or parsed) with, nothing else (so
    the server applies defaults, and ``session.update`` changes only what was set)."""
    return event.model_dump_json(exclude_unset=True)
