"""The LiveKit plugins' pure parts: speech-event policy, chat context ↔ history, retry schedule, audio."""

from __future__ import annotations

import types

import numpy as np
import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc  # noqa: E402
from livekit.agents import llm  # noqa: E402

from omniduplex.app.core.audio import AudioPort  # noqa: E402
from omniduplex.app.core.history import History  # noqa: E402
from omniduplex.app.surfaces.livekit.audio import frame_pcm, pcm_frame  # noqa: E402
from omniduplex.app.surfaces.livekit.chat_sync import ItemIds, apply_chat_ctx, history_chat_ctx  # noqa: E402
from omniduplex.app.surfaces.livekit.remote_link import RetryPolicy  # noqa: E402
from omniduplex.app.surfaces.livekit.turn_signals import SpeechSignals  # noqa: E402


def test_speech_over_a_reply_is_reported_only_when_it_barges_in():
    s = SpeechSignals()
    assert s.speech_started(replying=False) == ["started"]
    assert s.committed() == ["stopped"]
    assert s.speech_started(replying=True) == []  # a cough over the reply: not reported...
    assert s.dropped() == []  # ...and not when it ends
    assert s.speech_started(replying=True) == []
    assert s.barge_in() == ["started"]  # reported at the barge-in
    assert s.committed() == ["stopped"]
    assert s.speech_started(replying=True) == []
    assert s.committed() == ["started", "stopped"]  # the reply ended while the user talked on
    assert s.speech_started(replying=False) == ["started"]
    assert s.dropped() == ["stopped_no_transcript"]  # noise: the user state does not stay "speaking"


def test_chat_ctx_round_trip_keeps_entry_keys_and_ids():
    h, ids = History(max_entries=4), ItemIds()
    user = h.add("user", "hello")
    reply = h.add("assistant", "hi there")
    ids.name(reply, "turn-1-reply")
    ctx = history_chat_ctx(h, ids)
    assert [(m.role, m.text_content) for m in ctx.messages()] == [
        ("user", "hello"),
        ("assistant", "hi there"),
    ]
    assert ctx.items[1].id == "turn-1-reply" and ctx.items[0].id == ids.of(user)
    # the framework edits: the reply's text changes, a system message and a new user message are added
    ctx.items[1].content = ["hi"]
    ctx.add_message(role="system", content="ignored")
    ctx.add_message(role="user", content="  more  ", id="u2")
    apply_chat_ctx(h, ids, ctx)
    assert h.snapshot() == [["user", "hello"], ["assistant", "hi"], ["user", "more"]]
    assert h.entries[0] == user and h.entries[1].key == reply.key  # the session's references stay valid
    assert reply.text == "hi there"  # entries are immutable: the edit made a new one under the same key
    assert ids.of(h.entries[2]) == "u2"
    # a removed item leaves the history; the newest max_entries stay
    ctx = llm.ChatContext.empty()
    for i in range(6):
        ctx.add_message(role="user", content=f"m{i}", id=f"i{i}")
    apply_chat_ctx(h, ids, ctx)
    assert [e.text for e in h.entries] == ["m2", "m3", "m4", "m5"]


def test_retry_schedule_doubles_to_a_cap():
    p = RetryPolicy(initial_s=0.5, max_delay_s=8.0)
    assert [p.delay(k) for k in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_room_audio_becomes_20_ms_frames_at_16_khz():
    port = AudioPort(types.SimpleNamespace(cfg=types.SimpleNamespace(output_rate=24000)))  # no session needed
    t = np.arange(48000 * 2) / 48000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    stereo = np.repeat(tone, 2)
    frames = []
    for i in range(0, tone.size, 480):  # 10 ms stereo frames at 48 kHz
        f = rtc.AudioFrame(stereo[2 * i : 2 * i + 960].tobytes(), 48000, 2, 480)
        frames += port.frames(port.resample(*frame_pcm(f)))
    assert all(f.shape == (320,) and f.dtype == np.int16 for f in frames)
    assert abs(len(frames) - 100) <= 1  # 2 s → 100 frames of 20 ms
    x = np.concatenate(frames).astype(np.float32) / 32768
    assert np.abs(x[1000:-1000]).max() == pytest.approx(0.3, abs=0.02)
    out = pcm_frame(np.zeros(480, np.int16), 24000)
    assert (out.sample_rate, out.num_channels, out.samples_per_channel) == (24000, 1, 480)
