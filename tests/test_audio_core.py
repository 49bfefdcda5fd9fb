"""The audio core (app.audio): the int16 convention, mono mixing, reframing, streaming resampling across
chunks, the 20 ms pacer against a fake clock, and the AudioPort between wire PCM and a session."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest
import soxr

from omniduplex.app.core.audio import (
    AudioPort,
    Pacer,
    Reframer,
    StreamResampler,
    frame_samples,
    to_float32,
    to_int16,
)
from omniduplex.app.core.audio.pcm import mono

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)


# -- PCM convention ---------------------------------------------------------------------------------------
def test_int16_float_round_trip_is_exact():
    x = to_float32(ALL_INT16)
    assert x.dtype == np.float32 and x.min() == -1.0 and x.max() == 1 - 2**-15
    assert np.array_equal(to_int16(x), ALL_INT16)


def test_float_int16_float_is_within_half_a_step():
    x = np.random.default_rng(0).uniform(-1, 1 - 2**-15, 100_000).astype(np.float32)
    assert np.abs(to_float32(to_int16(x)) - x).max() <= 2**-16 + 1e-9


def test_to_int16_rounds_and_clips():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 0.4999 / 32768, 0.5001 / 32768], np.float32)
    assert to_int16(x).tolist() == [0, 16384, -16384, 32767, -32768, 32767, -32768, 0, 1]
    pcm = np.array([1, -2, 3], np.int16)
    assert np.shares_memory(to_int16(pcm), pcm)  # int16 passes through, not copied
    assert to_int16(np.zeros((2, 3), np.float64)).shape == (6,)


def test_mono_mixes_interleaved_channels_and_rejects_a_bad_count():
    stereo = np.array([1000, 3000, -2000, 0], np.int16)
    np.testing.assert_allclose(mono(stereo, 2), np.array([2000, -1000]) / 32768)
    assert np.array_equal(mono(stereo, 1), to_float32(stereo))
    with pytest.raises(ValueError, match="3 channel"):
        mono(stereo, 3)


def test_frame_samples():
    assert [frame_samples(r) for r in (8000, 16000, 24000, 48000)] == [160, 320, 480, 960]


# -- reframing ---------------------------------------------------------------------------------------------
def test_reframer_regroups_exactly_and_keeps_the_dtype():
    r = Reframer(160)
    frames = r.push(np.arange(100, dtype=np.int16)) + r.push(np.arange(100, 500, dtype=np.int16))
    assert [f.size for f in frames] == [160, 160, 160] and r.held == 20
    assert all(f.dtype == np.int16 for f in frames)
    assert np.array_equal(np.concatenate(frames), np.arange(480, dtype=np.int16))
    assert r.push(np.zeros(0, np.int16)) == [] and r.held == 20
    r.clear()
    assert r.held == 0 and r.push(np.ones(159, np.int16)) == []
    with pytest.raises(ValueError):
        Reframer(0)


# -- resampling --------------------------------------------------------------------------------------------
def random_cuts(n: int, seed: int) -> list[int]:
    cuts = np.random.default_rng(seed).integers(0, n + 1, size=12).tolist()
    return sorted({0, n, *cuts, 1})  # includes a 1-sample chunk


@pytest.mark.parametrize(
    "rates", [(24000, 16000), (8000, 16000), (48000, 16000), (24000, 8000), (16000, 16000)]
)
def test_resampler_output_does_not_depend_on_the_chunking(rates):
    x = (0.3 * np.random.default_rng(1).standard_normal(rates[0] // 2)).astype(np.float32)  # 0.5 s
    whole = StreamResampler(*rates)
    want = np.concatenate([whole.process(x), whole.flush()])
    assert abs(want.size - x.size * rates[1] / rates[0]) <= 2
    for seed in range(3):
        cuts = random_cuts(x.size, seed)
        rs = StreamResampler(*rates)
        got = np.concatenate([rs.process(x[a:b]) for a, b in zip(cuts[:-1], cuts[1:])] + [rs.flush()])
        assert got.size == want.size
        np.testing.assert_allclose(got, want, atol=1e-6)
    again = np.concatenate([whole.process(x), whole.flush()])  # flush resets: a new stream
    np.testing.assert_allclose(again, want, atol=1e-6)


def test_resampler_keeps_a_tone_and_takes_int16():
    t = np.arange(24000) / 24000
    tone = to_int16(0.5 * np.sin(2 * np.pi * 440 * t))
    y = StreamResampler(24000, 16000).process(tone)
    assert y.dtype == np.float32
    spectrum = np.abs(np.fft.rfft(y[2000:14000]))
    assert abs(np.argmax(spectrum) * 16000 / 12000 - 440) < 2
    assert np.abs(y[2000:14000]).max() == pytest.approx(0.5, abs=0.01)


def test_resampler_starts_a_new_stream_when_the_input_rate_changes():
    x = (0.3 * np.random.default_rng(3).standard_normal(4800)).astype(np.float32)
    rs = StreamResampler(48000, 16000)
    rs.process(x)
    fresh = StreamResampler(24000, 16000)
    np.testing.assert_allclose(rs.process(x, 24000), fresh.process(x), atol=1e-7)
    assert rs.in_rate == 24000
    with pytest.raises(ValueError):
        StreamResampler(0, 16000)


# -- pacing ------------------------------------------------------------------------------------------------
class FakeClock:
    """Monotonic seconds that move only when the pacer sleeps (or a test stalls them)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
        await asyncio.sleep(0)


def test_pacer_ticks_every_20_ms_on_the_anchor_grid():
    clock = FakeClock()
    pacer = Pacer(clock=clock, sleep=clock.sleep)

    async def main():
        dues = [await pacer.wait()]
        for _ in range(5):
            clock.t += 0.003  # the work of a frame takes 3 ms
            dues.append(await pacer.wait())
        return dues

    dues = asyncio.run(main())
    assert dues == pytest.approx([100.0 + 0.02 * k for k in range(6)])
    assert clock.sleeps == pytest.approx([0.017] * 5)  # sleeps the rest of each period, no drift
    assert pacer.ticks == 6 and pacer.reanchors == 0


def test_pacer_catches_up_a_small_lag_without_sleeping_and_reanchors_after_a_stall():
    clock = FakeClock()
    pacer = Pacer(clock=clock, sleep=clock.sleep, max_lag_s=0.06)

    async def main():
        await pacer.wait()
        clock.t += 0.05  # 30 ms late for frame 1: sent at once, frame 2 keeps its slot
        late = [await pacer.wait(), await pacer.wait()]
        clock.t += 0.5  # a stalled loop: the missed frames are skipped, not burst
        stalled = await pacer.wait()
        after = await pacer.wait()
        return late, stalled, after

    late, stalled, after = asyncio.run(main())
    assert late == pytest.approx([100.02, 100.04])
    assert clock.sleeps[:2] == pytest.approx([0.0, 0.0])  # late: yields but does not sleep
    assert pacer.reanchors == 1 and stalled == pytest.approx(100.55) and after == pytest.approx(100.57)


def test_port_run_calls_the_tick_once_per_frame_until_cancelled():
    clock = FakeClock()
    port = AudioPort(FakeSession(8000), 8000, clock=clock, sleep=clock.sleep)
    dues: list[float] = []

    async def main():
        task = asyncio.create_task(port.run(dues.append))
        while len(dues) < 10:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert np.diff(dues[:10]) == pytest.approx([0.02] * 9)


# -- the port ----------------------------------------------------------------------------------------------
class FakeSession:
    """What the port uses of a Session: 320-sample input frames in, ``pull_audio`` out of a queue."""

    def __init__(self, output_rate: int) -> None:
        self.cfg = types.SimpleNamespace(output_rate=output_rate)
        self.frames: list[np.ndarray] = []
        self.reply = np.zeros(0, np.int16)

    @property
    def queued_samples(self) -> int:
        return self.reply.size

    def push_audio(self, frame: np.ndarray) -> None:
        assert frame.shape == (320,) and frame.dtype == np.int16
        self.frames.append(frame)

    def queue(self, pcm: np.ndarray) -> None:
        self.reply = np.concatenate([self.reply, pcm])

    def pull_audio(self, n: int, deliver=None) -> tuple[np.ndarray, int]:
        out = np.zeros(n, np.int16)
        take = min(n, self.reply.size)
        out[:take], self.reply = self.reply[:take], self.reply[take:]
        if deliver is not None:
            deliver(out, take)
        return out, take


def test_port_feeds_the_session_continuous_16_khz_frames_from_any_chunking():
    x = to_int16(0.4 * np.sin(2 * np.pi * 300 * np.arange(16000) / 8000))  # 2 s at 8 kHz
    session = FakeSession(8000)
    port = AudioPort(session, 8000)
    cuts = random_cuts(x.size, 7) + list(range(0, x.size, 173))
    cuts = sorted(set(cuts))
    pushed = sum(port.push(x[a:b]) for a, b in zip(cuts[:-1], cuts[1:]))
    assert pushed == len(session.frames) and 98 <= pushed <= 100  # 2 s, less the filter's delay
    got = to_float32(np.concatenate(session.frames))
    ref = soxr.ResampleStream(8000, 16000, 1, dtype="float32", quality="HQ")
    want = ref.resample_chunk(to_float32(x))[: got.size]
    assert np.abs(got - want).max() <= 2**-15  # one stream: no seams at the chunk edges


def test_port_mixes_channels_and_follows_a_rate_change():
    session = FakeSession(24000)
    port = AudioPort(session, 48000)
    stereo = np.repeat(to_int16(0.2 * np.ones(960)), 2)  # 20 ms stereo at 48 kHz
    for _ in range(10):
        port.push(stereo, 48000, 2)
    n48 = len(session.frames)
    for _ in range(10):
        port.push(to_int16(0.2 * np.ones(480)), 24000)  # the track switched to 24 kHz mono
    assert abs(n48 - 10) <= 1 and abs(len(session.frames) - 20) <= 2
    assert to_float32(session.frames[5]).mean() == pytest.approx(0.2, abs=0.01)


def test_port_pull_reports_how_much_of_the_frame_is_reply_audio():
    session = FakeSession(8000)
    port = AudioPort(session, 8000)
    session.queue(np.arange(1, 201, dtype=np.int16))  # 25 ms of reply
    delivered = []
    pcm, filled = port.pull(deliver=lambda p, f: delivered.append(f))
    assert (pcm.size, filled, delivered) == (160, 160, [160]) and pcm[0] == 1
    pcm, filled = port.pull()
    assert filled == 40 and pcm[39] == 200 and not pcm[40:].any()
    assert port.pull()[1] == 0 and port.queued == 0
