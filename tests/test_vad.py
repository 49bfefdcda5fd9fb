"""webrtcvad on real speech, the speech segmenter's thresholds, and a session endpointing real speech."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from omniduplex.app.core.events import UserTurnCommitted
from omniduplex.app.core.session import Session, SessionConfig
from omniduplex.app.core.vad import FRAME_SAMPLES, SpeechSegmenter, TurnConfig, WebRtcVad
from omniduplex.pipeline.audio_io import load_audio

QUESTION = Path(__file__).parents[1] / "examples" / "question.wav"


def frames(wav: np.ndarray) -> list[np.ndarray]:
    n = wav.size // FRAME_SAMPLES
    return [wav[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(n)]


def test_webrtcvad_hears_speech_not_silence():
    vad = WebRtcVad(2)
    speech = [vad.is_speech(f) for f in frames(load_audio(QUESTION))]
    assert sum(speech) > 0.6 * len(speech)
    assert not any(vad.is_speech(np.zeros(FRAME_SAMPLES, np.float32)) for _ in range(10))
    with pytest.raises(ValueError, match="320 samples"):
        vad.is_speech(np.zeros(160, np.int16))


def test_segmenter_start_end_and_speech_ms():
    seg = SpeechSegmenter(TurnConfig(start_ms=60, endpoint_ms=100))
    out = [seg.update(v) for v in [True, True, False, True, True, True]]
    assert out == [None, None, None, None, None, "start"] and seg.speech_ms == 60
    out = [seg.update(v) for v in [True, False, True, False, False, False, False, False]]
    assert out == [None] * 7 + ["end"]  # 100 ms of silence
    assert seg.speech_ms == 100 and not seg.in_speech


def test_segmenter_commits_at_max_turn_length():
    seg = SpeechSegmenter(TurnConfig(start_ms=20, max_turn_ms=200))
    out = [seg.update(True) for _ in range(10)]
    assert out[0] == "start" and out[-1] == "end" and out[1:-1] == [None] * 8


def test_turn_config_rejects_non_positive_thresholds():
    with pytest.raises(ValueError, match="endpoint_ms"):
        TurnConfig(endpoint_ms=0)


class _NoReplies:
    output_rate = 24000

    def __init__(self):
        self.started = []

    def start(self, turn_id, waveform, history, options=None):
        self.started.append(waveform)

    async def events(self, turn_id):
        if False:
            yield

    def cancel(self, turn_id):
        pass


def test_session_with_webrtcvad_commits_one_turn_for_a_spoken_question():
    wav = load_audio(QUESTION)
    audio = np.concatenate([np.zeros(8000, np.float32), wav, np.zeros(16000, np.float32)])

    async def main():
        events, responder = [], _NoReplies()
        turn = TurnConfig(endpoint_ms=500, preemptive_ms=0)  # only the committed turn's reply starts
        s = Session("v", responder, events.append, SessionConfig(turn=turn))
        for f in frames(audio):
            s.push_audio(f)
            s.pull_audio(960)
        await s.close()
        return events, responder

    events, responder = asyncio.run(main())
    (c,) = [e for e in events if isinstance(e, UserTurnCommitted)]
    assert c.speech_ms > 2000
    (sent,) = responder.started
    assert abs(sent.size - wav.size) < 0.5 * 16000  # the question, not the leading/trailing silence
