"""G.711 against CPython's ``audioop`` (deprecated, still in 3.11/3.12: a test oracle only)
and turn detection on telephone-band (8 kHz μ-law) audio."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import numpy as np
import pytest
import soxr

from omniduplex.app.core.audio import AudioPort
from omniduplex.app.core.events import UserTurnCommitted
from omniduplex.app.core.replies import ReplyDone
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.surfaces.wire import g711 as nb
from omniduplex.pipeline.audio_io import load_audio

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_ulaw_encode_matches_audioop_for_every_sample():
    assert nb.ulaw_encode(ALL_SAMPLES) == audioop.lin2ulaw(ALL_SAMPLES.tobytes(), 2)


def test_alaw_encode_matches_audioop_for_every_sample():
    assert nb.alaw_encode(ALL_SAMPLES) == audioop.lin2alaw(ALL_SAMPLES.tobytes(), 2)


@pytest.mark.parametrize(("decode", "oracle"), [(nb.ulaw_decode, "ulaw2lin"), (nb.alaw_decode, "alaw2lin")])
def test_decode_matches_audioop_for_every_code(decode, oracle):
    want = np.frombuffer(getattr(audioop, oracle)(ALL_CODES, 2), np.int16)
    assert np.array_equal(decode(ALL_CODES), want)


def test_silence_codes_and_round_trip_error():
    assert nb.ulaw_encode(np.zeros(3, np.int16)) == bytes([nb.ULAW_SILENCE]) * 3
    assert nb.alaw_encode(np.zeros(3, np.int16)) == bytes([nb.ALAW_SILENCE]) * 3
    x = (8000 * np.sin(np.arange(8000) / 8000 * 2 * np.pi * 440)).astype(np.int16)
    for enc, dec in ((nb.ulaw_encode, nb.ulaw_decode), (nb.alaw_encode, nb.alaw_decode)):
        y = dec(enc(x)).astype(np.float64)
        snr = 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((y - x) ** 2))
        assert snr > 30  # G.711 gives ~38 dB on a loud tone


class OneReply:
    output_rate = 24000

    def __init__(self) -> None:
        self.started, self.cancelled = [], []

    def start(self, turn_id, waveform, history, options=None):
        self.started.append(waveform)

    async def events(self, turn_id):
        yield ReplyDone({})

    def cancel(self, turn_id):
        self.cancelled.append(turn_id)


def test_turn_detection_works_on_telephone_audio():
    """examples/question.wav through G.711 μ-law at 8 kHz, back up to 16 kHz: webrtcvad + endpointing
    commit exactly one turn holding the question."""
    q = load_audio(Path(__file__).parents[1] / "examples" / "question.wav")
    pcm8 = (np.clip(soxr.resample(q, 16000, 8000), -1, 1) * 32767).astype(np.int16)
    line = nb.ulaw_decode(
        nb.ulaw_encode(np.concatenate([np.zeros(4000, np.int16), pcm8, np.zeros(8000, np.int16)]))
    )

    async def main():
        events, responder = [], OneReply()
        session = Session("tel", responder, events.append, SessionConfig(output_rate=8000))
        port = AudioPort(session, 8000)  # 8 → 16 kHz, 20 ms frames
        for i in range(0, line.size, 160):
            port.push(line[i : i + 160])
            port.pull()
            await asyncio.sleep(0)
        await session.close()
        return events, responder

    events, responder = asyncio.run(main())
    turns = [e for e in events if isinstance(e, UserTurnCommitted)]
    # one reply answers the turn; any other start was a preemptive reply to the question so far (a pause
    # mid-question), cancelled when the speech went on
    assert len(turns) == 1 and len(responder.started) == 1 + len(responder.cancelled)
    assert 2500 < turns[0].speech_ms < 4000  # the question is ~3.5 s of speech
