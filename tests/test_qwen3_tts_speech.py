"""``POST /v1/audio/speech`` served by Qwen3-TTS (``serve --tts DIR``; app/host/speech/qwen3.py), tiny
presets: the
streamed audio equals the one-shot decode of the greedy reference frames, concurrent requests batch without
changing each other's audio, and every bad request gets its own 400 while good ones still speak."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from test_server import IdleResponder

from omniduplex.app.host.speech.qwen3 import Qwen3Speech
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.models.qwen3_tts.generate import generate_codes
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint

MAX_FRAMES = 12
CONTEXT = 120  # positions: a short sentence fits, a long one does not


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    root = tmp_path_factory.mktemp("q3tts_speech")
    out = {}
    for variant in ("custom_voice", "base", "voice_design"):
        path = write_tts_checkpoint(root / variant, "tiny", 0, variant)
        out[variant] = Qwen3Speech(
            path, max_num_seqs=4, max_frames=MAX_FRAMES, context=CONTEXT, sampling={"temperature": 0.0}
        )
    yield out
    for svc in out.values():
        svc.close()


def post(svc: Qwen3Speech, *bodies: dict) -> list[httpx.Response]:
    """POST every body at once to a server whose TTS is ``svc``."""

    async def main():
        app = create_app(ServerConfig(max_sessions=2, tts=str(svc.model.path)), responder=IdleResponder())
        app.state.server.speech = svc  # loaded with test settings (greedy, short budget)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=300) as c:
                return await asyncio.gather(*(c.post("/v1/audio/speech", json=b) for b in bodies))

    return asyncio.run(main())


def expected_pcm(svc: Qwen3Speech, **kw) -> bytes:
    """int16 bytes of the one-shot decode of the greedy oracle frames."""
    prompt = svc.prompt(**kw)
    codes = generate_codes(svc.model.talker, prompt, max_new_tokens=MAX_FRAMES)
    wav = svc.model.codec(codes.T[None]).detach().reshape(-1).numpy()
    return (np.clip(wav, -1, 1) * 32767).astype("<i2").tobytes()


def same_pcm(got: bytes, want: bytes) -> bool:
    """Equal int16 audio up to 1 LSB (the stream and the one-shot decode differ by float rounding)."""
    a, b = (np.frombuffer(x, "<i2").astype(np.int32) for x in (got, want))
    return a.shape == b.shape and bool(np.abs(a - b).max(initial=0) <= 1)


def wav_b64(seconds: float, rate: int) -> str:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_custom_voice_streams_the_one_shot_decode_and_batches(services):
    svc = services["custom_voice"]
    a = {"input": "Hello there.", "voice": "Aiden", "response_format": "pcm"}
    b = {"input": "Good morning!", "voice": "serena", "response_format": "wav"}
    ra, rb = post(svc, a, b)  # admitted together: one batch
    assert ra.status_code == 200 and ra.headers["content-type"] == "audio/pcm"
    want_a = expected_pcm(svc, text="Hello there.", voice="Aiden")
    assert len(want_a) > 2 * 1920 and same_pcm(ra.content, want_a)
    assert rb.status_code == 200 and rb.headers["content-type"] == "audio/wav"
    assert rb.content[:4] == b"RIFF" and same_pcm(
        rb.content[44:], expected_pcm(svc, text="Good morning!", voice="serena")
    )
    assert ra.content != rb.content[44:]


def test_stream_yields_one_frame_first(services):
    svc = services["custom_voice"]

    async def pieces():
        return [p async for p in svc.stream(svc.prompt("Hello there.", "aiden"))]

    got = asyncio.run(pieces())
    assert got[0].shape == (1920,) and all(p.dtype == np.float32 for p in got)
    frames = generate_codes(svc.model.talker, svc.prompt("Hello there.", "aiden"), max_new_tokens=MAX_FRAMES)
    assert sum(p.shape[0] for p in got) == frames.shape[0] * 1920


def test_bad_requests_get_400_and_good_ones_still_speak(services):
    svc = services["custom_voice"]
    good = {"input": "Hello there.", "voice": "aiden", "response_format": "pcm"}
    bodies = [
        {"input": "Hello there.", "voice": "alloy"},
        {"input": "Hello there."},
        {"input": "Hello there. " * 20, "voice": "aiden"},
        {"input": "Hello there.", "voice": "aiden", "ref_audio": wav_b64(2, 24000), "ref_text": "Hi"},
        {"input": "Hello there.", "voice": "aiden", "language": "klingon"},
        good,
    ]
    unknown, missing, long, clone, lang, ok = post(svc, *bodies)
    err = unknown.json()["error"]
    assert unknown.status_code == 400 and err["param"] == "voice"
    assert "'alloy'" in err["message"] and "aiden" in err["message"] and "serena" in err["message"]
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "voice"
    err = long.json()["error"]
    assert (
        long.status_code == 400 and err["code"] == "context_length_exceeded" and "context" in err["message"]
    )
    err = clone.json()["error"]
    assert (
        clone.status_code == 400
        and "needs a Base checkpoint" in err["message"]
        and "custom_voice" in err["message"]
    )
    assert lang.status_code == 400 and lang.json()["error"]["param"] == "language"
    assert ok.status_code == 200
    assert same_pcm(ok.content, expected_pcm(svc, text="Hello there.", voice="aiden"))


def test_base_clones_and_checks_the_reference_clip(services):
    svc = services["base"]
    ref = wav_b64(1.5, 24000)
    clone = {"input": "Hi there", "ref_audio": ref, "ref_text": "Hello", "response_format": "pcm"}
    ok, xvec, rate, short, missing, instr = post(
        svc,
        clone,
        {"input": "Hi there", "ref_audio": "data:audio/wav;base64," + ref, "response_format": "pcm"},
        {"input": "Hi there", "ref_audio": wav_b64(2, 16000)},
        {"input": "Hi there", "ref_audio": wav_b64(0.5, 24000)},
        {"input": "Hi there", "voice": "aiden"},
        {"input": "Hi there", "ref_audio": ref, "instructions": "a deep voice"},
    )
    assert ok.status_code == 200
    assert same_pcm(ok.content, expected_pcm(svc, text="Hi there", ref_audio=ref, ref_text="Hello"))
    assert xvec.status_code == 200
    assert same_pcm(xvec.content, expected_pcm(svc, text="Hi there", ref_audio=ref))
    assert ok.content != xvec.content  # in-context codes change the frames
    err = rate.json()["error"]
    assert rate.status_code == 400 and err["param"] == "ref_audio" and "16000 Hz" in err["message"]
    err = short.json()["error"]
    assert short.status_code == 400 and err["param"] == "ref_audio" and "at least 1 s" in err["message"]
    assert missing.status_code == 400 and "send ref_audio" in missing.json()["error"]["message"]
    assert instr.status_code == 400 and instr.json()["error"]["param"] == "instructions"


def test_voice_design_needs_instructions(services):
    svc = services["voice_design"]
    body = {"input": "Hello there.", "instructions": "A calm, low voice.", "response_format": "pcm"}
    ok, bare = post(svc, body, {"input": "Hello there."})
    assert ok.status_code == 200
    assert same_pcm(ok.content, expected_pcm(svc, text="Hello there.", instructions="A calm, low voice."))
    assert bare.status_code == 400 and bare.json()["error"]["param"] == "instructions"


def test_piper_stays_the_default():
    """Without ``tts`` the route never loads Qwen3-TTS (the Piper path is tested in test_openai_rest.py)."""
    from omniduplex.app.host.speech.services import PIPER, tts_dirs

    state = create_app(ServerConfig(max_sessions=1), responder=IdleResponder()).state.server
    assert tts_dirs(state.cfg) == [] and state.speech is None
    assert state.speech_registry().names == [PIPER]


def test_leaving_a_stream_early_aborts_its_request(services):
    path = services["custom_voice"].model.path
    # a request that would run for minutes: it ends soon only if leaving the stream aborts it
    svc = Qwen3Speech(path, max_frames=16000, sampling={"temperature": 0.0, "ignore_eos": True})

    async def first_piece():
        gen = svc.stream(svc.prompt("Hello there.", "aiden"))
        piece = await gen.__anext__()
        await gen.aclose()  # the client went away
        return piece

    try:
        assert asyncio.run(first_piece()).shape == (1920,)
        deadline = time.monotonic() + 30
        while svc.engine.has_unfinished() and time.monotonic() < deadline:  # the worker drops it
            time.sleep(0.05)
        assert not svc.engine.has_unfinished()
    finally:
        svc.close()
