"""Code2Wav batched across requests: one forward over several turns' chunks equals each turn decoded alone
(samples and state), the streamed output of every turn still equals its one-shot decode while turns join
and leave mid-stream, CUDA-graph replays per batch bucket (CPU twin) equal the eager batched push, a bad
turn fails alone, and the stage counts its forwards."""

from __future__ import annotations

import pytest
import torch

from omniduplex.models.qwen3_omni.code2wav_batch import push_together, stack_key
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.config import ChunkingConfig
from omniduplex.pipeline.engine.graph_runner import TwinBackend
from omniduplex.pipeline.messages import DecoderOutput, StageMessage
from omniduplex.pipeline.stages.code2wav_graphs import Code2WavGraphs
from omniduplex.pipeline.stages.vocoder import VocoderWorker

ATOL = 1e-6  # float32 rounding of batched vs single GEMMs (outputs are in [-1, 1])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("omni"), "tiny", seed=5)
    return load_model(d, parts=("code2wav",)).code2wav


def _codes(model, rows: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.codebook_size, (rows, model.cfg.num_quantizers, n), generator=g)


@torch.no_grad()
def test_batched_push_equals_each_stream_alone_at_different_positions(model):
    codes = _codes(model, 3, 40, 0)
    alone, together = [Code2WavStream(model) for _ in range(3)], [Code2WavStream(model) for _ in range(3)]
    # first pushes of the same size go together (all still cropping); then each row sits at its own frame
    first = push_together(together, codes[:, :, :2])
    for b in range(3):
        want = alone[b].push(codes[b : b + 1, :, :2])
        torch.testing.assert_close(first[b : b + 1], want, rtol=0, atol=ATOL)
    extra = [0, 3, 9]  # rows 1 and 2 get ahead: past the sliding window, so the masks differ per row
    for b in range(3):
        if extra[b]:
            alone[b].push(codes[b : b + 1, :, 2 : 2 + extra[b]])
            together[b].push(codes[b : b + 1, :, 2 : 2 + extra[b]])
    at = [2 + e for e in extra]
    for n in (8, 1, 5):
        rows = torch.cat([codes[b : b + 1, :, at[b] : at[b] + n] for b in range(3)])
        got = push_together(together, rows)
        assert got.shape == (3, 1, n * model.total_upsample)
        for b in range(3):
            want = alone[b].push(rows[b : b + 1])
            torch.testing.assert_close(got[b : b + 1], want, rtol=0, atol=ATOL)
            at[b] += n
    for a, t in zip(alone, together):
        assert a.pos == t.pos
        for x, y in zip(a.state_tensors(), t.state_tensors()):
            torch.testing.assert_close(y, x, rtol=0, atol=ATOL)


@torch.no_grad()
def test_batched_push_refuses_bad_batches_and_changes_nothing(model):
    a, b = Code2WavStream(model), Code2WavStream(model)
    a.push(_codes(model, 1, 1, 1))
    with pytest.raises(ValueError, match="first push"):  # a is steady, b still crops
        push_together([a, b], _codes(model, 2, 2, 2))
    b.push(_codes(model, 1, 1, 3))
    before = [t.clone() for t in a.state_tensors() + b.state_tensors()]
    bad = _codes(model, 2, 2, 4)
    bad[1, 2, 1] = model.cfg.codebook_size
    with pytest.raises(ValueError, match="codebook 2"):
        push_together([a, b], bad)
    with pytest.raises(ValueError, match="appears twice"):
        push_together([a, a], _codes(model, 2, 2, 5))
    with pytest.raises(ValueError, match=r"\[2, Q, n\]"):
        push_together([a, b], _codes(model, 3, 2, 6))
    assert all(torch.equal(x, y) for x, y in zip(before, a.state_tensors() + b.state_tensors()))
    assert a.pos == b.pos == 1 and stack_key(a) == stack_key(b)


@torch.no_grad()
def test_graph_replays_per_batch_bucket_equal_the_eager_batched_push(model):
    graphs = Code2WavGraphs(model, TwinBackend(), [2, 4], max_batch=4)
    assert graphs.buckets == [1, 2, 4]
    ptrs = [t.data_ptr() for t in graphs.static_buffers()]
    codes = _codes(model, 3, 30, 7)
    eager, replayed = [Code2WavStream(model) for _ in range(3)], [Code2WavStream(model) for _ in range(3)]
    at = 0
    for n, rows in [(2, 3), (4, 3), (4, 2), (2, 1), (3, 3), (4, 3)]:  # 3 rows pad to bucket 4; 3 frames: none
        chunk = codes[:rows, :, at : at + n]
        want = push_together(eager[:rows], chunk)
        got = graphs.push_rows(replayed[:rows], chunk)
        if got is None:
            got = push_together(replayed[:rows], chunk)
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
        if rows < 3:  # the others skip these frames: give them the same to keep the rows aligned
            push_together(eager[rows:], codes[rows:, :, at : at + n])
            push_together(replayed[rows:], codes[rows:, :, at : at + n])
        at += n
    # the first push (still cropping) and the 3-frame push ran eagerly; the others replayed
    assert graphs.stats() == {"cuda_graph_hits": 4, "cuda_graph_misses": 2}
    assert [t.data_ptr() for t in graphs.static_buffers()] == ptrs
    assert all(e.pos == r.pos == at for e, r in zip(eager, replayed))


def _frame(rid: str, codes: torch.Tensor, last: bool = False) -> StageMessage:
    return StageMessage(rid, {"codes": codes}, DecoderOutput(), last=last)


@torch.no_grad()
def _serve(model, max_batch: int, graphs=None, plan=None) -> tuple[dict, VocoderWorker, list[int]]:
    """Five turns on one worker: they join at different steps, one is aborted mid-stream, each sends one
    frame a step; returns each finished turn's audio and the forwards per step."""
    chunking = ChunkingConfig(initial_codec_chunk_frames=2, codec_chunk_frames=4)
    positions = []

    def push_batch(streams, codes):  # the real batched push, its rows' positions noted
        positions.append([s.pos for s in streams])
        return push_together(streams, codes)

    w = VocoderWorker(
        lambda: Code2WavStream(model), chunking, graphs,
        push_batch=push_batch, batch_key=stack_key, max_batch=max_batch,
    )
    w.batched_positions = positions
    plan = plan or {"a": (0, 17), "b": (0, 17), "c": (4, 12), "d": (1, 20), "e": (6, 9)}  # join step, frames
    codes = {rid: _codes(model, 1, n, i)[0] for i, (rid, (_, n)) in enumerate(plan.items())}
    pcm: dict[str, list] = {rid: [] for rid in plan}
    done, per_step = set(), []
    for step in range(30):
        for rid, (join, n) in plan.items():
            f = step - join
            if 0 <= f < n and rid in w.streams or f == 0:
                w.submit(_frame(rid, codes[rid][:, f], last=f == n - 1))
        if step == 10:
            w.abort("e")  # leaves mid-stream: its state goes, the others go on
        if w.has_work():
            for m in w.step():
                pcm[m.request_id].append(m.tensors["pcm"])
                done |= {m.request_id} if m.last else set()
            per_step.append(w.last_step_forwards)
    return {rid: (torch.cat(p), codes[rid]) for rid, p in pcm.items() if rid in done}, w, per_step


@torch.no_grad()
def test_worker_batches_turns_joining_and_leaving_and_each_equals_its_one_shot_decode(model):
    batched, w, per_step = _serve(model, max_batch=8)
    single, w1, per_step1 = _serve(model, max_batch=1)
    assert sorted(batched) == sorted(single) == ["a", "b", "c", "d"]  # "e" was aborted
    for rid, (pcm, codes) in batched.items():
        one_shot = model(codes[None])[0, 0]
        assert pcm.shape == one_shot.shape
        torch.testing.assert_close(pcm, one_shot, rtol=0, atol=1e-5)  # streamed == one-shot, batched or not
        torch.testing.assert_close(pcm, single[rid][0], rtol=0, atol=ATOL)
    s, s1 = w.stats(), w1.stats()
    assert s1["codec_forwards"] == s1["codec_rows"]  # one forward per turn chunk with the lever off…
    assert s["codec_forwards"] < s["codec_rows"]  # …several turns' chunks in a forward with it on
    assert any(len(set(p)) > 1 for p in w.batched_positions)  # rows at different frames shared a forward
    assert max(per_step) == max(per_step1) == 1  # one forward a step: the stage reads input between them
    assert w.streams == {}


@torch.no_grad()
def test_worker_with_batched_graph_replays_streams_the_same_audio(model):
    graphs = Code2WavGraphs(model, TwinBackend(), [2, 4], max_batch=4)
    replayed, w, _ = _serve(model, max_batch=4, graphs=graphs)
    eager, _, _ = _serve(model, max_batch=4)
    for rid, (pcm, _) in eager.items():
        torch.testing.assert_close(replayed[rid][0], pcm, rtol=0, atol=ATOL)
    assert w.stats()["cuda_graph_hits"] > 0


@torch.no_grad()
def test_a_bad_turn_in_a_batched_forward_fails_alone(model):
    w = VocoderWorker(
        lambda: Code2WavStream(model), ChunkingConfig(initial_codec_chunk_frames=2, codec_chunk_frames=2),
        push_batch=push_together, batch_key=stack_key, max_batch=8,
    )
    good, bad = _codes(model, 1, 2, 8)[0], _codes(model, 1, 2, 9)[0]
    bad[0, 1] = model.cfg.codebook_size + 3
    for f in range(2):
        w.submit(_frame("ok", good[:, f]))
        w.submit(_frame("bad", bad[:, f]))
    outs = w.step()
    assert [m.request_id for m in outs] == ["ok"]
    torch.testing.assert_close(outs[0].tensors["pcm"], model(good[None])[0, 0], rtol=0, atol=1e-5)
    errors = w.pop_errors()
    assert [rid for rid, _ in errors] == ["bad"] and "codebook" in errors[0][1]
    assert list(w.streams) == ["ok"] and w.pop_errors() == []
    with pytest.raises(ValueError, match="max_batch"):
        VocoderWorker(lambda: Code2WavStream(model), max_batch=0)


def test_code2wav_bench_measures_both_ways_per_level(model, capsys):
    from omniduplex.benchmarks.code2wav_batch import measure

    rows = measure(model, [1, 3], chunk=2, steps=1)
    assert [r["c"] for r in rows] == [1, 3]
    for r in rows:  # audio-s/s is the decoded audio (c · 2 frames at 12.5 Hz) over each way's time
        assert r["batched_audio_s_per_s"] * r["batched_ms"] / 1000 == pytest.approx(r["c"] * 2 / 12.5)
        assert r["single_audio_s_per_s"] * r["single_ms"] / 1000 == pytest.approx(r["c"] * 2 / 12.5)
        assert r["speedup"] == pytest.approx(r["single_ms"] / r["batched_ms"])
    assert "| 3 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match=">= 1"):
        measure(model, [0])
