"""The Talker (decode steps and its code predictor) and streaming Code2Wav through the graph runner on the CPU
twin equal their eager runs; misses fall back to eager and are counted in the stage gauges; static buffers are
never reallocated; ``cuda_graphs`` in the stage graph (and the CPU default) turns the graphs off."""

from __future__ import annotations

import pytest
import torch

from omniduplex.kernels import moe
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.config import ChunkingConfig, PipelineConfig, StageConfig
from omniduplex.pipeline.engine.adapters import TalkerAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.graph_runner import TwinBackend
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.messages import DecoderOutput, StageMessage
from omniduplex.pipeline.runtime.stage_stats import worker_stats
from omniduplex.pipeline.stages.code2wav_graphs import Code2WavGraphs
from omniduplex.pipeline.stages.vocoder import VocoderWorker
from omniduplex.pipeline.workers import code2wav_graphs


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("omni"), "tiny", seed=2)
    return load_model(d, parts=("talker", "code2wav"))


def _talker_run(talker, graphs: str, requests: list[tuple[str, int, float, int]]):
    """Every request's frames (codes per step) through a Talker engine in graph mode ``graphs``."""
    adapter = TalkerAdapter(talker, torch.zeros(talker.cfg.text.hidden_size))
    engine = Engine(adapter, num_blocks=48, max_num_seqs=4, max_num_batched_tokens=64, graphs=graphs)
    eos = talker.cfg.codec_eos_token_id
    g = torch.Generator().manual_seed(0)
    frames: dict[str, list] = {}
    pending = sorted(requests, key=lambda r: r[1])
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][1] <= step:
            rid, _, temp, n = pending.pop(0)
            embeds = torch.randn(6 + len(frames), talker.cfg.text.hidden_size, generator=g)
            sp = SamplingParams(
                temperature=temp,
                top_k=50,
                max_tokens=n,
                seed=len(frames) + 11,
                stop_token_ids=(eos,),
                suppress_token_ids=adapter.suppress_ids,
            )
            req = Request(rid, [0] * embeds.shape[0], sp, prompt_embeds=embeds, embed_inputs=True)
            engine.add_request(req)
            adapter.end_text(req)  # decode rows: frame embedding + tts_pad
            frames[rid] = []
        for o in engine.step():
            if "codes" in o.extras:
                frames[o.request_id].append(o.extras["codes"])
        step += 1
    return frames, engine


@torch.no_grad()
def test_talker_decode_and_code_predictor_replays_equal_eager(omni):
    requests = [("a", 0, 0.9, 12), ("b", 0, 0.0, 9), ("c", 2, 0.9, 14), ("d", 5, 0.7, 6), ("e", 6, 0.0, 8)]
    want, _ = _talker_run(omni.talker, "off", requests)
    got, engine = _talker_run(omni.talker, "twin", requests)
    assert got == want and sum(map(len, want.values())) > 30
    predictor, decode = engine.adapter.predictor_graphs, engine.graphs.runner
    assert predictor.runner.hits > 10 and predictor.runner.buckets == [1, 2, 4]
    # the Talker is MoE (4 experts, top 2): decode graphs for batches of <= 2 (moe_batch_limit), others eager
    assert decode.buckets == [1, 2] and decode.hits > 0 and decode.misses > 0
    assert engine.graph_stats()["cuda_graph_hits"] == predictor.runner.hits + decode.hits


@torch.no_grad()
def test_code_predictor_replay_keeps_its_buffers_and_counts_misses(omni):
    talker = omni.talker
    graphs = TalkerAdapter(talker, torch.zeros(talker.cfg.text.hidden_size))
    graphs.capture_graphs(TwinBackend(), 2)
    pg = graphs.predictor_graphs
    ptrs = [t.data_ptr() for t in pg.static_buffers()]
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 1):
        hidden = torch.randn(n, talker.cfg.text.hidden_size, generator=g)
        code0 = torch.randint(0, 200, (n,), generator=g)
        temps, seeds, frames = [0.9] * n, list(range(n)), [3] * n
        got = pg.predict(hidden, code0, temps, seeds, frames)
        want = talker.code_predictor.predict(
            hidden,
            code0,
            talker.model.codec_embedding(code0),
            sample=graphs._predictor_sampler([_req(t, s, f) for t, s, f in zip(temps, seeds, frames)]),
        )
        assert torch.equal(got, want)
    three = torch.zeros(3, talker.cfg.text.hidden_size), torch.zeros(3, dtype=torch.long)
    assert pg.predict(*three, [0.0] * 3, [0] * 3, [0] * 3) is None  # no bucket of 3 (max_frames 2)
    assert pg.runner.stats() == {"cuda_graph_hits": 3, "cuda_graph_misses": 1}
    assert [t.data_ptr() for t in pg.static_buffers()] == ptrs


@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_sync_free_moe_dispatch_equals_the_grouped_one(tokens):
    g = torch.Generator().manual_seed(tokens)
    e, h, i, k = 6, 16, 24, 2
    x = torch.randn(tokens, h, generator=g)
    gate_up, down = torch.randn(e, 2 * i, h, generator=g), torch.randn(e, h, i, generator=g)
    weights = torch.rand(tokens, k, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(tokens)])
    want = moe.moe_experts(x, gate_up, down, weights, ids)
    with moe.sync_free():
        got = moe.moe_experts(x, gate_up, down, weights, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _req(temp: float, seed: int, frame: int) -> Request:
    r = Request("x", [0], SamplingParams(temperature=temp, seed=seed))
    r.output_ids = [0] * frame
    return r


def _codes(model, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.codebook_size, (1, model.cfg.num_quantizers, n), generator=g)


@torch.no_grad()
def test_code2wav_replayed_pushes_equal_eager_pushes(omni):
    model = omni.code2wav
    graphs = Code2WavGraphs(model, TwinBackend(), [2, 8])
    ptrs = [t.data_ptr() for t in graphs.static_buffers()]
    split = [2, 8, 8, 3, 8, 2, 2, 8, 1]  # 3 and 1: no graph; the first push: the stream still crops
    codes = _codes(model, sum(split), 4)
    eager, replayed = Code2WavStream(model), Code2WavStream(model)
    at = 0
    for n in split:
        want = eager.push(codes[..., at : at + n])
        got = graphs.push(replayed, codes[..., at : at + n])
        if got is None:
            got = replayed.push(codes[..., at : at + n])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        at += n
    assert replayed.pos == eager.pos == sum(split)
    assert graphs.stats() == {"cuda_graph_hits": 6, "cuda_graph_misses": 3}
    assert [t.data_ptr() for t in graphs.static_buffers()] == ptrs


@torch.no_grad()
def test_code2wav_replay_refuses_bad_codes_without_touching_the_stream(omni):
    model = omni.code2wav
    graphs = Code2WavGraphs(model, TwinBackend(), [2])
    stream = Code2WavStream(model)
    stream.push(_codes(model, 1, 0))
    before = [t.clone() for t in stream.state_tensors()]
    bad = _codes(model, 2, 1)
    bad[0, 1, 0] = model.cfg.codebook_size
    with pytest.raises(ValueError, match="codebook 1"):
        graphs.push(stream, bad)
    assert all(torch.equal(a, b) for a, b in zip(before, stream.state_tensors())) and stream.pos == 1


@torch.no_grad()
def test_vocoder_worker_with_graphs_streams_the_same_audio_and_reports_hits(omni):
    model, chunking = omni.code2wav, ChunkingConfig(initial_codec_chunk_frames=2, codec_chunk_frames=4)
    codes = _codes(model, 15, 7)[0]

    def run(graphs):
        worker = VocoderWorker(lambda: Code2WavStream(model), chunking, graphs)
        pcm = []
        for f in range(codes.shape[1]):
            frame = StageMessage("t", {"codes": codes[:, f]}, DecoderOutput(), last=f == codes.shape[1] - 1)
            worker.submit(frame)
            while worker.has_work():
                pcm += [m.tensors["pcm"] for m in worker.step()]
        return torch.cat(pcm), worker

    want, plain = run(None)
    got, worker = run(Code2WavGraphs(model, TwinBackend(), [2, 4]))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    stats = worker_stats(worker)
    # pushes of 2 (the stream's first: eager), 4, 4, 4 (replayed), then the last frame alone (no graph of 1)
    assert stats["cuda_graph_hits"] == 3 and stats["cuda_graph_misses"] == 2
    assert "cuda_graph_hits" not in worker_stats(plain)


def test_cuda_graphs_option_defaults_on_and_is_ignored_on_the_cpu(omni):
    assert StageConfig().cuda_graphs is True
    cfg = PipelineConfig.model_validate({"stages": {"talker": {"cuda_graphs": False}}})
    assert cfg.stage("talker").cuda_graphs is False and cfg.stage("thinker").cuda_graphs is True
    chunking = ChunkingConfig()
    assert code2wav_graphs(omni.code2wav, StageConfig(), chunking) is None  # a CPU stage pushes eagerly
    assert code2wav_graphs(omni.code2wav, StageConfig(cuda_graphs=False), chunking) is None
