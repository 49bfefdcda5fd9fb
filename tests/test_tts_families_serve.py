"""VoxCPM2, Higgs Audio v3 and Fish Speech S2 Pro served (tiny presets): ``POST /v1/audio/speech`` with
``model`` picking the family streams the family's one-shot ``synthesize`` audio (resampled to 24 kHz) while
requests of every family batch together; ``GET /v1/audio/voices`` lists each model's voices behind the API
key; every bad request (unknown voice or model, a reference clip of the wrong rate or too short, text past
the context, a checkpoint missing a tensor) gets one 4xx naming the problem while a good request beside it
still speaks."""

from __future__ import annotations

import asyncio
import base64
import io
import shutil

import httpx
import numpy as np
import pytest
import soundfile as sf
import soxr
import torch
from safetensors.torch import load_file, save_file
from test_server import IdleResponder

from omniduplex.app.host.auth import AuthConfig
from omniduplex.app.host.speech.runner_speech import RunnerSpeech
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.models.fish_speech.presets import write_fish_checkpoint
from omniduplex.models.higgs.presets import write_higgs_checkpoint
from omniduplex.models.voxcpm2.presets import write_voxcpm2_checkpoint
from omniduplex.pipeline.speech import fish_speech, higgs, voxcpm2

FRAMES = 6  # frames per request (a VoxCPM2 patch, a Higgs or Fish frame)
BLOCKS = 24  # KV blocks of 16 positions: a sentence fits, a long text does not
KEY = "test-key"
GREEDY = {"vox": {"seed": 7}, "higgs": {"temperature": 0.0}, "fish": {"temperature": 0.0}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    dirs = {
        "vox": write_voxcpm2_checkpoint(root / "vox", "tiny", 0),
        "higgs": write_higgs_checkpoint(root / "higgs", "tiny", 0),
        "fish": write_fish_checkpoint(root / "fish", "tiny", 0),
    }
    broken = {}  # each family's checkpoint missing one tensor: name → (folder, the tensor)
    for n, d in dirs.items():
        b = shutil.copytree(d, root / f"broken-{n}")
        weights = load_file(b / "model.safetensors")
        dropped = sorted(weights)[1]
        save_file({k: v for k, v in weights.items() if k != dropped}, b / "model.safetensors")
        broken[f"broken-{n}"] = (b, dropped)
    services = {
        n: RunnerSpeech.load(d, max_num_seqs=8, num_blocks=BLOCKS, max_frames=FRAMES, sampling=GREEDY[n])
        for n, d in dirs.items()
    }
    yield dirs, services, broken
    for s in services.values():
        s.close()


def request(served, *calls: tuple[str, str, dict | None], key: str | None = KEY) -> list[httpx.Response]:
    """Run every ``(method, path, json)`` at once against a server whose speech models are the fixture's
    (the three families, then their broken copies)."""
    dirs, services, broken = served
    tts = [str(d) for d in dirs.values()] + [str(b) for b, _ in broken.values()]
    cfg = ServerConfig(max_sessions=2, tts=tts, auth=AuthConfig(api_keys={KEY}))

    async def main():
        app = create_app(cfg, responder=IdleResponder())
        registry = app.state.server.speech_registry()
        for n, svc in services.items():
            registry.add(n, svc)  # loaded with test settings (greedy, short budget)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://test", timeout=300, headers=headers
            ) as c:
                return await asyncio.gather(*(c.request(m, p, json=j) for m, p, j in calls))

    return asyncio.run(main())


def speech(**body) -> tuple[str, str, dict]:
    return ("POST", "/v1/audio/speech", {"response_format": "pcm", **body})


def expected(served, family: str, text: str, voice: str | None = None) -> np.ndarray:
    """int16 of the family's one-shot ``synthesize`` (alone, on a fresh engine), resampled to 24 kHz."""
    svc = served[1][family]
    r = svc.runner
    if family == "vox":
        pcm, rate = voxcpm2.synthesize(
            r.model, r.tok, text, r.bank.get(voice), {**GREEDY[family], "max_len": FRAMES}
        )
    elif family == "higgs":
        n = r.model.config.num_codebooks
        pcm, rate = higgs.synthesize(r.model, text, voice, {**GREEDY[family], "max_tokens": FRAMES + n - 1})
    else:
        pcm, rate = fish_speech.synthesize(
            r.model, r.engine.tokenizer, text, voice, {**GREEDY[family], "max_tokens": FRAMES}
        )
    pcm = np.asarray(torch.as_tensor(pcm).reshape(-1).float().numpy())
    if rate != 24000:
        pcm = soxr.resample(pcm, rate, 24000)
    return (np.clip(pcm, -1, 1) * 32767).astype(np.int32)


def close_pcm(got: bytes, want: np.ndarray, lsb: int = 2) -> bool:
    """Equal int16 audio up to ``lsb`` (streamed decode and resampling vs one-shot: float rounding)."""
    a = np.frombuffer(got, "<i2").astype(np.int32)
    return a.shape == want.shape and bool(np.abs(a - want).max(initial=0) <= lsb)


def wav_b64(seconds: float, rate: int) -> str:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_model_picks_the_family_and_requests_batch_across_families(served):
    texts = ("Hello there.", "Good morning to you!")
    calls = [speech(model=f, input=t) for f in ("vox", "higgs", "fish") for t in texts]
    calls.append(speech(model="higgs", input=texts[0], voice="en_man"))
    out = request(served, *calls)
    assert all(r.status_code == 200 for r in out), [r.text for r in out if r.status_code != 200]
    for i, f in enumerate(("vox", "higgs", "fish")):
        for j, t in enumerate(texts):
            got = out[2 * i + j].content
            assert len(got) > 0 and close_pcm(got, expected(served, f, t)), (f, t)
    assert close_pcm(out[-1].content, expected(served, "higgs", texts[0], "en_man"))
    assert out[-1].content != out[2].content  # another voice, other audio


def test_voices_lists_each_model_behind_the_key(served):
    listed, denied = request(served, ("GET", "/v1/audio/voices", None)), None
    denied = request(served, ("GET", "/v1/audio/voices", None), key=None)[0]
    assert denied.status_code == 401
    data = {m["model"]: m for m in listed[0].json()["data"]}
    assert data["vox"]["family"] == "voxcpm2" and data["vox"]["cloning"] and not data["vox"]["instructions"]
    assert [v["name"] for v in data["vox"]["voices"]] == ["default"] and data["vox"]["sample_rate"] == 48000
    assert data["higgs"]["family"] == "higgs" and not data["higgs"]["cloning"]
    assert {v["name"] for v in data["higgs"]["voices"]} == {"belinda", "en_man"}
    assert data["fish"]["family"] == "fish-speech" and data["fish"]["ref_sample_rate"] == 44100
    for name, (_, dropped) in served[2].items():
        assert dropped in data[name]["error"] and "missing" in data[name]["error"], name


def test_bad_input_gets_one_clear_error_each_and_good_requests_still_speak(served):
    long = "The quick brown fox jumps over the lazy dog. " * 40
    calls = {
        "unknown_model": speech(model="nope", input="Hi."),
        **{name: speech(model=name, input="Hi.") for name in served[2]},
        "good": speech(model="fish", input="Hello there."),
    }
    for f in ("vox", "higgs", "fish"):
        calls[f"{f}_voice"] = speech(model=f, input="Hi.", voice="alloy")
        calls[f"{f}_long"] = speech(model=f, input=long)
    calls["vox_rate"] = speech(model="vox", input="Hi.", ref_audio=wav_b64(1.0, 24000))
    calls["vox_short"] = speech(model="vox", input="Hi.", ref_audio=wav_b64(0.2, 16000))
    calls["fish_rate"] = speech(model="fish", input="Hi.", ref_audio=wav_b64(1.5, 16000), ref_text="Hello.")
    calls["fish_short"] = speech(model="fish", input="Hi.", ref_audio=wav_b64(0.5, 44100), ref_text="Hello.")
    calls["fish_no_text"] = speech(model="fish", input="Hi.", ref_audio=wav_b64(1.5, 44100))
    calls["higgs_clip"] = speech(model="higgs", input="Hi.", ref_audio=wav_b64(1.5, 24000))
    calls["not_audio"] = speech(model="vox", input="Hi.", ref_audio=base64.b64encode(b"nope").decode())
    out = dict(zip(calls, request(served, *calls.values())))

    def err(name: str, status: int = 400) -> dict:
        r = out[name]
        assert r.status_code == status, (name, r.status_code, r.text)
        return r.json()["error"]

    e = err("unknown_model", 404)
    assert e["code"] == "model_not_found" and "'nope'" in e["message"] and "vox" in e["message"]
    for name, (_, dropped) in served[2].items():
        e = err(name)
        assert e["param"] == "model" and dropped in e["message"] and "missing" in e["message"], (name, e)
    for f, known in (("vox", "default"), ("higgs", "belinda"), ("fish", "default")):
        e = err(f"{f}_voice")
        assert e["param"] == "voice" and "'alloy'" in e["message"] and known in e["message"], f
        e = err(f"{f}_long")
        assert e["code"] == "context_length_exceeded" and "context" in e["message"], (f, e)
    for name, words in (
        ("vox_rate", ("16000 Hz", "24000 Hz")),
        ("vox_short", ("at least",)),
        ("fish_rate", ("44100 Hz", "16000 Hz")),
        ("fish_short", ("at least",)),
        ("fish_no_text", ("ref_text",)),
        ("higgs_clip", ("encoder",)),
        ("not_audio", ("not an audio file",)),
    ):
        e = err(name)
        assert e["param"] in ("ref_audio", "ref_text") and all(w in e["message"] for w in words), (name, e)
    assert out["good"].status_code == 200
    assert close_pcm(out["good"].content, expected(served, "fish", "Hello there."))


def test_a_clip_clones_a_voice_per_request(served):
    clip16 = wav_b64(1.0, 16000)
    clip44 = wav_b64(1.5, 44100)
    plain, vox, fish = request(
        served,
        speech(model="vox", input="Hello there."),
        speech(model="vox", input="Hello there.", ref_audio=clip16, ref_text="A tone."),
        speech(model="fish", input="Hello there.", ref_audio=clip44, ref_text="A tone."),
    )
    assert plain.status_code == vox.status_code == fish.status_code == 200
    assert len(vox.content) > 0 and len(fish.content) > 0


@pytest.mark.slow
def test_bench_tts_dispatches_on_the_family(served):
    """``bench tts --model DIR`` on a Higgs checkpoint runs its benchmark with the lever on and off."""
    from typer.testing import CliRunner

    from omniduplex.cli.main import cli

    res = CliRunner().invoke(
        cli, ["bench", "tts", "--model", str(served[0]["higgs"]), "--concurrency", "1,16"]
    )
    assert res.exit_code == 0, res.output
    rows = [line.split("|")[1:-1] for line in res.output.splitlines() if line.startswith(("| on", "| off"))]
    assert sorted((r[0].strip(), r[1].strip()) for r in rows) == [
        ("off", "1"),
        ("off", "16"),
        ("on", "1"),
        ("on", "16"),
    ]
    assert all(float(r[4]) > 0 for r in rows)  # audio-s/s measured
    assert (
        "35.26" in res.output and "state ms/step" in res.output
    )  # the seed's figure and the lever's counter
