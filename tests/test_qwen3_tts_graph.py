"""The Qwen3-TTS graph (``tts_talker → tts_codec``): several utterances' codec chunks decoded in one batched
call equal each decoded alone, the codec stage streams and batches without changing any utterance's audio
and frees an utterance's state on its end or an abort, and the graph served by two stage processes gives the
in-process streamed decode of the same greedy frames (and the one-shot decode)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from omniduplex.app.host.pipeline import new_orchestrator
from omniduplex.models.qwen3_tts.codec_batch import push_together
from omniduplex.models.qwen3_tts.codec_stream import CodecStream, StreamingDecoder
from omniduplex.models.qwen3_tts.model import load_qwen3_tts
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.models.qwen3_tts.voice import VoicePrompter
from omniduplex.models.tokenizer import load_tokenizer
from omniduplex.pipeline.config import PipelineConfig
from omniduplex.pipeline.messages import DecoderOutput, StageMessage, TurnOptions, UtteranceRequest
from omniduplex.pipeline.orchestrator import Orchestrator
from omniduplex.pipeline.runtime.local_backend import LocalBackend
from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.qwen3_tts_codec import Qwen3TTSCodecWorker
from omniduplex.pipeline.topology import QWEN3_TTS, output_rate, topology_for
from omniduplex.pipeline.workers import build_all

FRAMES = 40  # per utterance: pieces of 1, 25 and 14 frames
TEXTS = ("Hello there, how are you today?", "The weather is fine.")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tts_checkpoint(tmp_path_factory.mktemp("q3tts_graph") / "cv", "tiny", 0, "custom_voice")


@pytest.fixture(scope="module")
def model(ckpt):
    return load_qwen3_tts(ckpt)


def _codes(seed: int, n: int) -> torch.Tensor:
    return torch.randint(0, 2048, (1, 16, n), generator=torch.Generator().manual_seed(seed))


def test_batched_codec_call_equals_each_stream_alone(model):
    dec = model.codec
    window = dec.pre_transformer.window
    done = [0, 1, 26, window - 1, window + 30]  # frames already decoded: empty, short and full KV caches
    codes = [_codes(i, d + 30) for i, d in enumerate(done)]
    alone, together = [CodecStream(dec) for _ in done], [CodecStream(dec) for _ in done]
    outs = [[] for _ in done]  # everything `together` decodes, per stream
    for streams in (alone, together):
        for i, (s, c, d) in enumerate(zip(streams, codes, done)):
            if d:
                out = s.push(c[..., :d])
                if streams is together:
                    outs[i].append(out)
    for a, b in ((0, 5), (5, 30)):  # two batched calls in a row: the unstacked states carry on exactly
        ref = [s.push(c[..., d + a : d + b]) for s, c, d in zip(alone, codes, done)]
        got = push_together(together, torch.cat([c[..., d + a : d + b] for c, d in zip(codes, done)]))
        assert got.shape == (len(done), 1, (b - a) * dec.total_upsample)
        for row, r in enumerate(ref):
            torch.testing.assert_close(got[row : row + 1], r, rtol=0, atol=1e-5)
            outs[row].append(got[row : row + 1])
    with torch.no_grad():  # and each stream's whole output is the one-shot decode of its frames
        for out, c in zip(outs, codes):
            torch.testing.assert_close(torch.cat(out, dim=-1), dec(c), rtol=0, atol=1e-5)
    bad = torch.cat([c[..., :2] for c in codes])
    bad[1, 4, 0] = 2048
    frames_before = [s.frames for s in together]
    with pytest.raises(ValueError, match="codebook 4"):
        push_together(together, bad)
    with pytest.raises(ValueError, match="twice"):
        push_together([together[0], together[0]], bad[:2].clamp(max=2047))
    with pytest.raises(ValueError, match=r"\[5, Q, n\]"):
        push_together(together, bad[:2].clamp(max=2047))
    assert [s.frames for s in together] == frames_before  # refused calls changed nothing


def _drain(worker: Qwen3TTSCodecWorker) -> list[StageMessage]:
    out = []
    while worker.has_work():
        out += worker.step()
    return out


def test_codec_stage_batches_streams_and_frees_state(model):
    dec = model.codec
    hop = dec.total_upsample
    lengths = {"a": FRAMES, "b": FRAMES, "c": 30, "d": 60}
    codes = {r: _codes(i + 10, n) for i, (r, n) in enumerate(lengths.items())}
    worker = Qwen3TTSCodecWorker(dec, 1, 25, max_batch=8)
    got: dict[str, list[StageMessage]] = {r: [] for r in lengths}
    for f in range(max(lengths.values())):  # frames interleaved as the talker stage emits them
        for r, n in lengths.items():
            if f < n and r in worker.streams or f == 0:
                meta = DecoderOutput(talker_ms=5.0 if f == 0 else None)
                worker.submit(StageMessage(r, {"codes": codes[r][0, :, f]}, meta, last=f == n - 1))
        if f == 30:
            worker.abort("d")  # mid-stream: its state goes at once, its later frames are ignored
            assert "d" not in worker.streams
        for m in _drain(worker):
            got[m.request_id].append(m)
    assert worker.streams == {}  # every finished utterance's state was dropped with its last message
    assert not any(m.last for m in got["d"]) and sum(m.tensors["pcm"].numel() for m in got["d"]) == 26 * hop
    for r in ("a", "b", "c"):
        msgs = got[r]
        assert [m.meta.chunk for m in msgs] == list(range(len(msgs)))
        assert [m.last for m in msgs] == [False] * (len(msgs) - 1) + [True]
        assert msgs[0].meta.talker_ms == 5.0 and msgs[1].meta.talker_ms is None
        sizes = [m.tensors["pcm"].numel() // hop for m in msgs]
        assert sizes == ([1, 25, 14] if lengths[r] == FRAMES else [1, 25, 4])
        pcm = torch.cat([m.tensors["pcm"] for m in msgs])
        alone = StreamingDecoder(dec)
        ref = torch.cat(alone.push(codes[r][..., :-1]) + alone.push(codes[r][..., -1:], final=True), dim=-1)
        torch.testing.assert_close(pcm, ref.reshape(-1), rtol=0, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(pcm, dec(codes[r]).reshape(-1), rtol=0, atol=1e-5)
    assert worker.calls < worker.rows  # same-length chunks of several utterances shared a call
    worker.submit(StageMessage("d", {"codes": codes["d"][0, :, 40]}, DecoderOutput()))
    assert "d" not in worker.streams and not worker.has_work()
    e = _codes(99, 26)  # 1 + 25 frames, then the talker's closing message alone
    for f in range(26):
        worker.submit(StageMessage("e", {"codes": e[0, :, f]}, DecoderOutput()))
    msgs = _drain(worker)
    worker.submit(StageMessage("e", {}, DecoderOutput(finish_reason="stop"), last=True))
    msgs += _drain(worker)
    assert [m.tensors["pcm"].numel() // hop for m in msgs] == [1, 25, 0] and msgs[-1].last
    assert worker.streams == {}
    with pytest.raises(ValueError, match="codebook"):
        worker.submit(StageMessage("x", {"codes": torch.full((16,), 5000)}, DecoderOutput()))


def _reference(ckpt, model, voice: str, text: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy frames of ``text`` on an in-process engine → (streamed decode, one-shot decode)."""
    engine = Qwen3TTSEngine(model, EngineSettings(num_blocks=64, max_num_seqs=2))
    prompter = VoicePrompter(model, load_tokenizer(ckpt), 1024)
    engine.add("r", prompter.prompt(text, prompter.voice(voice)), _greedy(n))
    frames = []
    while engine.has_unfinished():
        frames += [ev.codes for ev in engine.step() if ev.codes is not None]
    codes = torch.stack(frames, dim=1)[None]
    stream = StreamingDecoder(model.codec)
    pieces = [stream.push(codes[..., i : i + 1]) for i in range(codes.shape[-1])]
    streamed = torch.cat([p for ps in pieces for p in ps] + stream.push(codes[..., :0], final=True), dim=-1)
    with torch.no_grad():
        one_shot = model.codec(codes)
    return streamed.reshape(-1).numpy(), one_shot.reshape(-1).numpy()


def _greedy(n: int) -> dict:
    return {"temperature": 0.0, "max_tokens": n + 1, "ignore_eos": True}


async def _speak(orch: Orchestrator, text: str, meta: TurnOptions) -> tuple[list, dict]:
    rid = orch.speak(UtteranceRequest(text=text, turn=meta))
    events = [ev async for ev in orch.events(rid)]
    return events, (events[-1].metrics if events[-1].kind == "done" else {})


def test_graph_in_process_speaks_and_fails_bad_requests_alone(ckpt, model):
    assert topology_for(ckpt) is QWEN3_TTS and output_rate(ckpt) == 24000
    voice = sorted(model.config.speakers)[0]
    pcfg = PipelineConfig(model=str(ckpt), stages={"tts_talker": {"num_kv_blocks": 64}})
    streamed, one_shot = _reference(ckpt, model, voice, TEXTS[0], FRAMES)

    async def main():
        orch = Orchestrator(LocalBackend(build_all(pcfg)), None, output_rate=24000)
        await orch.start()
        try:
            return await asyncio.gather(
                _speak(orch, TEXTS[0], TurnOptions(voice=voice, sampling=_greedy(FRAMES))),
                _speak(orch, TEXTS[0], TurnOptions(voice="nobody", sampling=_greedy(FRAMES))),
            )
        finally:
            await orch.stop()

    (good, metrics), (bad, _) = asyncio.run(main())
    with pytest.raises(ValueError, match=r"is a Qwen3-TTS checkpoint \(text to speech\), not a conversation"):
        new_orchestrator(pcfg, processes=False)  # serve / respond --model on it: refused, one line
    pcm = np.concatenate([e.pcm for e in good if e.kind == "audio"])
    np.testing.assert_allclose(pcm, streamed, rtol=0, atol=1e-5)
    np.testing.assert_allclose(pcm, one_shot, rtol=0, atol=1e-5)
    assert good[-1].kind == "done" and metrics["audio_s"] == pytest.approx(FRAMES * 0.08)
    assert bad[-1].kind == "error" and "unknown voice 'nobody'" in bad[-1].error


@pytest.mark.slow
def test_two_stage_processes_equal_in_process_decode_and_abort_frees_state(ckpt, model):
    from omniduplex.pipeline.runtime.process_backend import ProcessBackend

    voices = sorted(model.config.speakers)[:2]
    refs = [_reference(ckpt, model, v, t, FRAMES) for v, t in zip(voices, TEXTS)]
    pcfg = PipelineConfig(model=str(ckpt), stages={"tts_talker": {"num_kv_blocks": 64}})

    async def main():
        backend = ProcessBackend(pcfg)
        orch = Orchestrator(backend, None, output_rate=24000)
        await orch.start()
        try:
            assert set(backend.procs) == {"tts_talker", "tts_codec"}
            runs = await asyncio.gather(
                *(
                    _speak(orch, t, TurnOptions(voice=v, sampling=_greedy(FRAMES)))
                    for v, t in zip(voices, TEXTS)
                )
            )
            long = TurnOptions(voice=voices[0], sampling=_greedy(2000))
            rid = orch.speak(UtteranceRequest(text=TEXTS[0], turn=long))
            async for ev in orch.events(rid):
                if ev.kind == "audio":  # mid-stream
                    orch.cancel(rid)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the stages report their gauges about once a second
                stages = backend.stats()["stages"]
                if all(stages.get(s, {}).get("batch_size", 1) == 0 for s in ("tts_talker", "tts_codec")):
                    break
                await asyncio.sleep(0.1)
            return runs, ev, backend.stats()["stages"]
        finally:
            await orch.stop()

    runs, cancelled, stages = asyncio.run(main())
    for (events, metrics), (streamed, one_shot) in zip(runs, refs):
        assert events[-1].kind == "done"
        pcm = np.concatenate([e.pcm for e in events if e.kind == "audio"])
        np.testing.assert_allclose(pcm, streamed, rtol=0, atol=1e-5)
        np.testing.assert_allclose(pcm, one_shot, rtol=0, atol=1e-5)
        assert metrics["talker_first_frame_ms"] > 0 and metrics["codec_first_chunk_ms"] > 0
    assert cancelled.kind == "error" and cancelled.error == "cancelled"
    assert stages["tts_codec"]["batch_size"] == 0 and stages["tts_talker"]["batch_size"] == 0


def test_speech_endpoint_on_the_graph_streams_and_refuses_bad_voices(ckpt, model):
    import httpx
    from test_server import IdleResponder

    from omniduplex.app.host.speech.qwen3_graph import Qwen3GraphSpeech
    from omniduplex.app.server import ServerConfig, create_app

    voice = sorted(model.config.speakers)[0]
    _, one_shot = _reference(ckpt, model, voice, TEXTS[1], 12)
    pcfg = PipelineConfig(model=str(ckpt), stages={"tts_talker": {"num_kv_blocks": 64}})
    greedy = _greedy(12)  # exactly 12 frames, as the reference
    svc = Qwen3GraphSpeech(ckpt, pcfg, processes=False, max_frames=greedy.pop("max_tokens"), sampling=greedy)

    async def main():
        cfg = ServerConfig(max_sessions=1, tts=str(ckpt), tts_graph=True)
        app = create_app(cfg, responder=IdleResponder())
        app.state.server.speech = svc  # greedy, a short budget
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=300) as c:
                bodies = (
                    {"input": TEXTS[1], "voice": voice, "response_format": "pcm"},
                    {"input": TEXTS[1], "voice": "alloy"},
                    {"input": TEXTS[1], "voice": voice, "ref_audio": "%%"},
                )
                return await asyncio.gather(*(c.post("/v1/audio/speech", json=b) for b in bodies))

    try:
        good, unknown, bad_clip = asyncio.run(main())
        assert svc.orch is not None  # a service given to the server is not the server's to close
    finally:
        svc.close()
    assert good.status_code == 200
    got = np.frombuffer(good.content, "<i2").astype(np.int32)
    want = (np.clip(one_shot, -1, 1) * 32767).astype("<i2").astype(np.int32)
    assert got.shape == want.shape and np.abs(got - want).max() <= 1
    assert unknown.status_code == 400 and "unknown voice 'alloy'" in unknown.json()["error"]["message"]
    assert bad_clip.status_code == 400 and "base64" in bad_clip.json()["error"]["message"]
    assert svc.orch is None
