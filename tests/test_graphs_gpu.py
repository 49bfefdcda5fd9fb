"""CUDA graphs on a GPU (skipped without one): the capture lines the CPU twin cannot run. Decode steps of a
dense Qwen3 and of the MoE preset, the Talker's code predictor and Code2Wav pushes (one turn, and batched
across turns) captured with ``torch.cuda.CUDAGraph`` give the eager results;
static buffers keep their addresses; padding writes no KV."""

from __future__ import annotations

import pytest
import torch

from omniduplex.benchmarks.engine_device import model_config, write_random_qwen3
from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter, TalkerAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.graph_runner import CudaGraphBackend
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.stages.code2wav_graphs import Code2WavGraphs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)"),
]
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    d = write_random_qwen3(tmp_path_factory.mktemp("dense"), model_config(tiny=True), CUDA, seed=5)
    return load_model(d, parts=("thinker",), device=CUDA).thinker


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("omni"), "tiny", seed=2)
    return load_model(d, device=CUDA)


def _run(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict[str, list[int]]:
    out = {}
    for i, p in enumerate(prompts):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=max_tokens - i)))
        out[f"r{i}"] = []
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return out


@torch.no_grad()
@pytest.mark.parametrize("which", ["dense", "moe"])
def test_captured_decode_equals_eager(dense, omni, which):
    thinker = dense if which == "dense" else omni.thinker
    kw = dict(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128, device=CUDA)
    # an MoE model captures every batch (the sync-free dispatch, kernels.moe): 6 prompts, past E / k = 2
    n = 6
    prompts = [[(7 * i + j) % 200 for j in range(5 + 3 * i)] for i in range(n)]
    eager = Engine(DecoderLMAdapter(thinker), graphs="off", **kw)
    graphs = Engine(DecoderLMAdapter(thinker), graphs="cuda", **kw)
    ptrs = [t.data_ptr() for t in graphs.graphs.static_buffers()]
    assert _run(graphs, prompts, 24) == _run(eager, prompts, 24)
    assert graphs.graphs.runner.hits > 10
    assert [t.data_ptr() for t in graphs.graphs.static_buffers()] == ptrs


@torch.no_grad()
def test_captured_padding_rows_write_no_kv(dense):
    engine = Engine(DecoderLMAdapter(dense), num_blocks=64, max_num_seqs=4, graphs="cuda", device=CUDA)
    for i in range(3):
        engine.add_request(Request(f"r{i}", [7 + i] * (10 + i), SamplingParams(max_tokens=8)))
    engine.step()
    before = [k.clone() for k, _ in engine.kv]
    at = [(r.blocks, r.num_computed) for r in engine.scheduler.running]
    slots = {b[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for b, p in at}
    engine.step()  # 3 rows in the bucket of 4
    for (k, _), old in zip(engine.kv, before):
        assert set((k != old).flatten(2).any(-1).flatten().nonzero().flatten().tolist()) == slots


@torch.no_grad()
def test_captured_code_predictor_and_code2wav_equal_eager(omni):
    talker = omni.talker
    adapter = TalkerAdapter(talker, torch.zeros(talker.cfg.text.hidden_size, device=CUDA))
    adapter.capture_graphs(CudaGraphBackend(CUDA), 4)
    g = torch.Generator(device=CUDA).manual_seed(1)
    hidden = torch.randn(3, talker.cfg.text.hidden_size, generator=g, device=CUDA)
    code0 = torch.randint(0, 200, (3,), generator=g, device=CUDA)
    got = adapter.predictor_graphs.predict(hidden, code0, [0.0] * 3, [1, 2, 3], [0, 0, 0])
    want = talker.code_predictor.predict(hidden, code0, talker.model.codec_embedding(code0))
    assert torch.equal(got, want)

    model = omni.code2wav
    c2w = Code2WavGraphs(model, CudaGraphBackend(CUDA), [2, 4])
    shape = (1, model.cfg.num_quantizers, 12)
    codes = torch.randint(0, model.cfg.codebook_size, shape, generator=g, device=CUDA)
    eager, replayed, at = Code2WavStream(model), Code2WavStream(model), 0
    for n in (2, 4, 4, 2):
        want = eager.push(codes[..., at : at + n])
        got = c2w.push(replayed, codes[..., at : at + n])
        got = replayed.push(codes[..., at : at + n]) if got is None else got
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        at += n
    assert c2w.stats() == {"cuda_graph_hits": 3, "cuda_graph_misses": 1}


@torch.no_grad()
def test_code2wav_batched_replays_equal_eager_batched_pushes(omni):
    from omniduplex.models.qwen3_omni.code2wav_batch import push_together

    model, g = omni.code2wav, torch.Generator(device=CUDA).manual_seed(3)
    c2w = Code2WavGraphs(model, CudaGraphBackend(CUDA), [2, 4], max_batch=4)
    shape = (3, model.cfg.num_quantizers, 12)
    codes = torch.randint(0, model.cfg.codebook_size, shape, generator=g, device=CUDA)
    eager, replayed = [Code2WavStream(model) for _ in range(3)], [Code2WavStream(model) for _ in range(3)]
    at = 0
    for n in (2, 4, 4, 2):  # 3 turns: bucket 4, one padding row
        want = push_together(eager, codes[..., at : at + n])
        got = c2w.push_rows(replayed, codes[..., at : at + n])
        got = push_together(replayed, codes[..., at : at + n]) if got is None else got
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        at += n
    assert c2w.stats() == {"cuda_graph_hits": 3, "cuda_graph_misses": 1}
