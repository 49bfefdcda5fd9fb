"""``ws /v1/realtime?duplex=1``: the Realtime API in full-duplex mode over the frame engine
(:mod:`omniduplex.app.host.duplex`). The model listens and speaks at every 80 ms frame, so there are no
turns, no server VAD (``turn_detection`` is ignored and reported ``null``) and no ``response.create``.

Client events:
    ``input_audio_buffer.append {audio}``  PCM16 mono 24 kHz, base64 (the GA ``audio/pcm`` format), any
        length: cut into the session's 80 ms Mimi frames (1920 samples) as they fill.
    ``playback.ack {played_ms}``  how much of the model's audio the client has played (ms from the start of
        the stream); the session history keeps only the text of the frames played. Answered by
        ``playback.acked {played_ms, transcript}`` (the history's text).
    ``session.update``  answered by ``session.updated``. Its PersonaPlex prompt fields restart the session
        with them (the model's state, the history and the stream position start over; the engine prefills the
        prompt, :mod:`omniduplex.pipeline.duplex.prompts`, ~80 ms a frame, sending silence meanwhile):
        ``session.voice_prompt`` (base64 PCM16 mono 24 kHz: a reference clip of the voice, Mimi-encoded onto
        the model's own audio stream) and ``session.role_prompt_tokens`` (text-stream token ids of the role
        prompt: the ``init-model`` presets have no tokenizer). ``session.updated`` then carries
        ``prompt: {voice_frames, role_tokens, prefill_ms}``; a bad prompt is an ``error`` (``invalid_value``)
        and changes nothing. Other fields change nothing.
    ``session.resume {session_id}``  take over a session whose connection dropped (no close handshake, or a
        close code other than 1000) less than ``serve --duplex-resume-s`` (30 s) ago: its engine row, with
        the model's state, kept ticking meanwhile (the model heard silence, its audio of the gap is dropped).
        This connection's own new session is ended, and ``session.resumed {session, played_ms,
        transcript}`` answers: the stream goes on from ``played_ms`` (the last ``playback.ack``; the frames
        sent but not acknowledged were not heard and are gone from the history), ``transcript`` is the
        history. An unknown, already resumed or expired id is an ``error`` with ``code:
        session_not_found`` (this connection's session goes on). A clean close (1000) ends a session for good.
Server events:
    ``session.created``, ``session.updated``, ``error`` (GA shapes); one ``response.created`` when the stream
    starts; then per 80 ms frame one ``response.output_audio.delta`` (1920 samples PCM16 base64) and, when the
    frame carries text, a ``response.output_audio_transcript.delta`` right after it (so a client knows which
    frame's audio a text belongs to). Text is the model's text-token id followed by a space (``"1234 "``):
    the Moshi presets written by ``init-model`` have no tokenizer. ``duplex.tick_overrun {tick, tick_ms,
    budget_ms}``: an engine tick took longer than the 80 ms frame (the session is still served, late).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect

from omniduplex.app.core.session_config import SessionStats
from omniduplex.app.host.duplex import DuplexFull, DuplexService, SessionNotFound
from omniduplex.app.surfaces.wire.openai_rest import MODEL_ID
from omniduplex.app.surfaces.wire.realtime import server_events as ev
from omniduplex.models.moshi.config import FRAME_SAMPLES
from omniduplex.pipeline.duplex.prompts import DuplexPrompt, check_prompt

log = logging.getLogger("omniduplex.realtime.duplex")

FRAME_BYTES = 2 * FRAME_SAMPLES
"""One 80 ms frame of PCM16 at 24 kHz."""
FRAME_MS = 80


def pcm16_frame(pcm: np.ndarray) -> str:
    """float32 ``[1920]`` in [-1, 1] -> base64 PCM16 little-endian."""
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class DuplexSession:
    """What the host's session table holds for a duplex call (``stats`` for ``/stats``, ``close``).

    ``busy`` is always False for the drain (:mod:`omniduplex.app.host.drain`): a duplex stream has no reply in
    flight to finish, it never ends by itself, so a draining server closes it at once."""

    busy = False

    def __init__(self, session_id: str, ws: WebSocket) -> None:
        self.id, self.ws, self.stats = session_id, ws, SessionStats()
        self.closing = False
        """The server ends it (shutdown, drain): its engine row is freed, not parked for a resume."""

    async def close(self, reason: str) -> None:
        self.closing = True
        with contextlib.suppress(Exception):  # already closed
            await self.ws.close(code=1001, reason=reason[:120])


class DuplexConnection:
    """One duplex Realtime socket: reads client events, sends the engine's frames as they come.

    ``history``: ``(end_ms, text)`` of each frame sent that carried text; :attr:`transcript` is the text of
    those whose audio the client acknowledged as played (``playback.ack``)."""

    def __init__(self, ws: WebSocket, call_id: str, service: DuplexService) -> None:
        self.ws, self.service = ws, service
        self.session = DuplexSession(call_id, ws)
        self.response_id, self.item_id = f"resp_{call_id}", f"item_{call_id}"
        self.sent_ms = 0
        self.played_ms = 0
        self.history: list[tuple[int, str]] = []
        self.transcript = ""
        self._pending = bytearray()
        self._send_lock = asyncio.Lock()
        self._sender: asyncio.Task | None = None
        self.dropped = False
        """The client went away without a clean close (1000): the session is parked for a resume."""

    def session_object(self) -> dict:
        fmt = {"type": "audio/pcm", "rate": 24000}
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.session.id,
            "model": MODEL_ID,
            "output_modalities": ["audio"],
            "audio": {
                "input": {"format": fmt, "turn_detection": None},
                "output": {"format": fmt},
            },
        }

    async def send(self, event: dict) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(event))

    async def error(self, message: str, code: str, event_id: str | None = None) -> None:
        await self.send(json.loads(ev.error(message, code=code, event_id=event_id).model_dump_json()))

    async def run(self) -> None:
        """Join the engine, then serve until the client goes; the engine row is freed on every exit.

        Raises DuplexFull before anything is sent when every engine row is taken."""
        outbox = await self.service.join(self.session.id)
        try:
            await self.send({"type": "session.created", "session": self.session_object()})
            await self.send(
                {
                    "type": "response.created",
                    "response": {
                        "id": self.response_id,
                        "object": "realtime.response",
                        "status": "in_progress",
                    },
                }
            )
            self._sender = asyncio.create_task(self._send_frames(outbox))
            try:
                await self._read()
            finally:
                await self._stop_sender()
        finally:
            if self.dropped and not self.session.closing:
                self.service.park(self.session.id, self.record())
            else:
                self.service.leave(self.session.id)

    async def _stop_sender(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
            self._sender = None

    def record(self) -> dict:
        """What a resume needs of this connection: the history and the played position (ms)."""
        return {"history": list(self.history), "played_ms": self.played_ms}

    # client -> server --------------------------------------------------------------------------------
    async def _read(self) -> None:
        while True:
            try:
                raw = await self.ws.receive_text()
            except WebSocketDisconnect as e:
                self.dropped = e.code != 1000
                return
            except RuntimeError:
                self.dropped = True
                return
            try:
                event = json.loads(raw)
                kind = event["type"]
            except (ValueError, KeyError, TypeError):
                await self.error("an event is a JSON object with a 'type'", "invalid_json")
                continue
            eid = event.get("event_id")
            if kind == "input_audio_buffer.append":
                await self._append(event, eid)
            elif kind == "playback.ack":
                await self._ack(event, eid)
            elif kind == "session.update":
                await self._update(event, eid)
            elif kind == "session.resume":
                await self._resume(event, eid)
            else:
                await self.error(
                    f"{kind!r} is not supported in duplex mode (the model speaks and listens at every frame)",
                    "unsupported_in_duplex_mode",
                    eid,
                )

    async def _append(self, event: dict, eid: str | None) -> None:
        try:
            data = base64.b64decode(event.get("audio", ""), validate=True)
        except (binascii.Error, TypeError):
            await self.error("audio is not valid base64", "invalid_audio", eid)
            return
        if len(data) % 2:
            await self.error("audio is PCM16: an even number of bytes", "invalid_audio", eid)
            return
        self._pending += data
        while len(self._pending) >= FRAME_BYTES:
            frame = np.frombuffer(bytes(self._pending[:FRAME_BYTES]), "<i2").astype(np.float32) / 32768
            try:
                self.service.push(self.session.id, frame)
            except ValueError as e:  # too far ahead of real time: keep the rest for later appends
                await self.error(str(e), "input_audio_buffer_full", eid)
                return
            del self._pending[:FRAME_BYTES]

    async def _ack(self, event: dict, eid: str | None) -> None:
        played = event.get("played_ms")
        if not isinstance(played, (int, float)) or played < 0:
            await self.error("playback.ack needs played_ms, a number >= 0", "invalid_value", eid)
            return
        self.played_ms = max(self.played_ms, min(int(played), self.sent_ms))
        self.transcript = "".join(t for end, t in self.history if end <= self.played_ms)
        await self.send(
            {"type": "playback.acked", "played_ms": self.played_ms, "transcript": self.transcript}
        )

    async def _update(self, event: dict, eid: str | None) -> None:
        fields = event.get("session") if isinstance(event.get("session"), dict) else {}
        if "voice_prompt" not in fields and "role_prompt_tokens" not in fields:
            await self.send({"type": "session.updated", "session": self.session_object()})
            return
        try:
            prompt = await self._prompt(fields)
        except ValueError as e:
            await self.error(f"bad duplex prompt: {e}", "invalid_value", eid)
            return
        await self._stop_sender()
        self.service.leave(self.session.id)  # the same id joins again once the leave is applied
        try:
            outbox = await self.service.join(self.session.id, prompt)
        except DuplexFull as e:  # the row went to another session meanwhile
            await self.error(f"try again later: {e}", "session_limit_reached", eid)
            await self.session.close("duplex engine full")
            return
        self.sent_ms = self.played_ms = 0
        self.history, self.transcript = [], ""
        self._pending.clear()
        lag = self.service.engine.lag
        info = {
            "voice_frames": 0 if prompt.voice_codes is None else int(prompt.voice_codes.shape[0]),
            "role_tokens": len(prompt.role_tokens),
            "prefill_ms": (prompt.frames + lag) * FRAME_MS,
        }
        await self.send({"type": "session.updated", "session": {**self.session_object(), "prompt": info}})
        self._sender = asyncio.create_task(self._send_frames(outbox))

    async def _prompt(self, fields: dict) -> DuplexPrompt:
        """The prompt of a ``session.update``'s fields. Raises ValueError (with the field) when bad."""
        voice, tokens = fields.get("voice_prompt"), fields.get("role_prompt_tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ValueError("role_prompt_tokens must be a list of token ids (ints)")
        codes = None
        if voice is not None:
            try:
                data = base64.b64decode(voice, validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise ValueError("voice_prompt must be base64 PCM16 mono 24 kHz") from None
            if not data or len(data) % 2:
                raise ValueError("voice_prompt is PCM16: a positive, even number of bytes")
            pcm = np.frombuffer(data, "<i2").astype(np.float32) / 32768
            codes = await asyncio.to_thread(self.service.encode_voice, pcm)
        prompt = DuplexPrompt(codes, tokens)
        if not prompt.frames:
            raise ValueError("an empty prompt (no voice_prompt audio, no role_prompt_tokens)")
        lm = self.service.engine.lm
        check_prompt(prompt, lm.dep_q, lm.card, lm.text_card)  # before the session is given up
        return prompt

    async def _resume(self, event: dict, eid: str | None) -> None:
        sid = event.get("session_id")
        if not isinstance(sid, str) or not sid or sid == self.session.id:
            await self.error("session.resume needs session_id, another session's id", "invalid_value", eid)
            return
        try:
            outbox, record = self.service.resume(sid)
        except SessionNotFound:
            await self.error(
                f"no resumable duplex session {sid!r}: unknown, resumed already, or its "
                f"{self.service.resume_s:.0f} s grace period is over",
                "session_not_found",
                eid,
            )
            return
        await self._stop_sender()
        self.service.leave(self.session.id)  # this connection's own new session
        self.session.id = sid
        self.response_id, self.item_id = f"resp_{sid}", f"item_{sid}"
        self.played_ms = self.sent_ms = record["played_ms"]
        self.history = [(end, t) for end, t in record["history"] if end <= self.played_ms]
        self.transcript = "".join(t for _, t in self.history)
        self._pending.clear()
        await self.send(
            {
                "type": "session.resumed",
                "session": self.session_object(),
                "played_ms": self.played_ms,
                "transcript": self.transcript,
            }
        )
        self._sender = asyncio.create_task(self._send_frames(outbox))

    # server -> client --------------------------------------------------------------------------------
    async def _send_frames(self, outbox: asyncio.Queue) -> None:
        ids = {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "output_index": 0,
            "content_index": 0,
        }
        while True:
            frame, events = await outbox.get()
            for e in events:
                await self.send({**e, "type": "duplex.tick_overrun"})
            await self.send({"type": "response.output_audio.delta", **ids, "delta": pcm16_frame(frame.pcm)})
            self.sent_ms += FRAME_MS
            tok = frame.text_token
            if tok is not None and tok not in self.service.pad_ids:
                text = f"{tok} "
                self.history.append((self.sent_ms, text))
                await self.send({"type": "response.output_audio_transcript.delta", **ids, "delta": text})
