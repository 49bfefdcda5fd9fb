"""Decode steps replayed per batch-size bucket (pipeline/engine/graph_runner.py, decode_graphs.py) on the CPU
twin, the backend that runs every line of the CUDA path but the capture call: for random batch compositions
(requests joining, finishing, preempted, aborted) the replayed step equals the eager one bucket by bucket,
static buffers are never reallocated, padding rows write no KV, misses fall back to eager; and the host-side
step inputs (pipeline/engine/step_inputs.py) equal the metadata built from the requests."""

from __future__ import annotations

import random

import pytest
import torch

from omniduplex.benchmarks.engine_device import model_config, write_random_qwen3
from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.graph_runner import (
    GraphRunner,
    TwinBackend,
    bucket_sizes,
    make_backend,
    pick_bucket,
    resolve_mode,
)
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.step_inputs import BlockTables, StepInputs


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """A dense 2-layer Qwen3 written by transformers (every bucket is captured)."""
    out, cpu = tmp_path_factory.mktemp("dense"), torch.device("cpu")
    d = write_random_qwen3(out, model_config(tiny=True), cpu, seed=5)
    return load_model(d).thinker


@pytest.fixture(scope="module")
def moe_thinker(tmp_path_factory):
    """The tiny Qwen3-MoE preset (4 experts, top 2: past 2 tokens a captured step runs the dense dispatch)."""
    d = write_checkpoint(tmp_path_factory.mktemp("moe"), "tiny", seed=5, text_only=True)
    return load_model(d).thinker


def test_buckets_and_modes():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(12) == [1, 2, 4, 8, 12]
    assert bucket_sizes(2000)[-1] == 512
    assert [pick_bucket([1, 2, 4, 8], n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_mode("auto", cpu) == "off" and resolve_mode("auto", cuda) == "cuda"
    assert resolve_mode("twin", cpu) == "twin" and make_backend("off", cpu) is None
    with pytest.raises(ValueError, match="CUDA device"):
        resolve_mode("cuda", cpu)
    with pytest.raises(ValueError, match="graph mode"):
        resolve_mode("fast", cpu)
    with pytest.raises(ValueError):
        bucket_sizes(0)


def test_twin_runner_replays_into_static_outputs():
    x = torch.zeros(8)
    runner = GraphRunner("toy", TwinBackend(), [2, 4, 8])
    runner.capture(lambda b: lambda: (x[:b] * 2 + 1,))
    outs = {b: out[0] for b, (_, out) in runner.graphs.items()}
    ptrs = {b: o.data_ptr() for b, o in outs.items()}
    x[:3] = torch.tensor([1.0, 2.0, 3.0])
    b = runner.bucket_for(3)
    (out,) = runner.replay(b)
    assert b == 4 and out is outs[4] and out.data_ptr() == ptrs[4]
    assert out.tolist() == [3.0, 5.0, 7.0, 1.0]
    assert runner.bucket_for(9) is None
    runner.miss()
    assert runner.stats() == {"cuda_graph_hits": 1, "cuda_graph_misses": 1}


def _engines(thinker, **kw) -> tuple[Engine, Engine]:
    common = dict(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=160)
    common.update(kw)
    return Engine(DecoderLMAdapter(thinker), graphs="off", **common), Engine(
        DecoderLMAdapter(thinker), graphs="twin", **common
    )


def _drive(engine: Engine, schedule: list[tuple[int, str, list[int], SamplingParams]], aborts, steps=400):
    """Add requests at their step, abort at theirs; returns every request's tokens."""
    out: dict[str, list[int]] = {}
    for step in range(steps):
        for at, rid, prompt, sp in schedule:
            if at == step:
                engine.add_request(Request(rid, prompt, SamplingParams(**vars(sp))))
                out[rid] = []
        for rid in aborts.get(step, []):
            engine.abort(rid)
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
        if not engine.has_unfinished() and step > max(a for a, *_ in schedule):
            break
    return out


def _schedule(seed: int) -> tuple[list, dict]:
    rng = random.Random(seed)
    sched = []
    for i in range(rng.randrange(6, 14)):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randrange(1, 40))]
        sp = SamplingParams(
            temperature=rng.choice([0.0, 0.0, 0.8]),
            top_k=rng.choice([0, 20]),
            repetition_penalty=rng.choice([1.0, 1.2]),
            max_tokens=rng.randrange(1, 40),
            seed=rng.randrange(1 << 30),
        )
        sched.append((rng.randrange(0, 30), f"r{i}", prompt, sp))
    aborts = {rng.randrange(5, 40): [f"r{rng.randrange(len(sched))}"] for _ in range(2)}
    return sched, aborts


@torch.no_grad()
@pytest.mark.parametrize("seed,model", [(0, "dense"), (1, "dense"), (2, "dense"), (3, "moe"), (4, "moe")])
def test_replayed_steps_equal_eager_steps(thinker, moe_thinker, seed, model):
    """Same tokens for every request under joins, finishes, aborts and (a 24-block cache) preemptions; and at
    every replayed step the hidden states equal an eager forward of the same batch."""
    thinker = thinker if model == "dense" else moe_thinker
    sched, aborts = _schedule(seed)
    eager, twin = _engines(thinker)
    want = _drive(eager, sched, aborts)
    replay, seen = twin.graphs.run, set()

    def checked(items):
        hidden = replay(items)
        if hidden is not None:
            batch = twin.inputs.eager_batch(items)  # rewrites the same K/V rows with the same values
            ref = twin.adapter.forward(twin.adapter.input_embeds(items), batch, twin.kv)
            # MoE past E / k tokens: the dense dispatch's GEMMs span other rows than the grouped ones
            # (fp32 blocking differs by a few ULP)
            torch.testing.assert_close(hidden, ref, rtol=0 if model == "dense" else 2e-6, atol=1e-6)
            seen.add(twin.graphs.runner.bucket_for(len(items)))
        return hidden

    twin.graphs.run = checked
    got = _drive(twin, sched, aborts)
    assert got == want
    assert twin.graphs.runner.hits > 0 and seen
    assert twin.scheduler.num_preemptions == eager.scheduler.num_preemptions
    assert twin.graphs.runner.buckets == [1, 2, 4, 8]  # MoE too: past E / k = 2 tokens, the dense dispatch
    assert max(seen) > 2  # replayed batches past the gathered dispatch's reach


@torch.no_grad()
def test_every_bucket_replays_and_buffers_stay_put(thinker):
    eager, twin = _engines(thinker, num_blocks=64)
    ptrs = [t.data_ptr() for t in twin.graphs.static_buffers()]
    sched = [(i * 3, f"r{i}", [i + 1] * (5 + i), SamplingParams(max_tokens=30 - 2 * i)) for i in range(8)]
    want, got = _drive(eager, sched, {}), _drive(twin, sched, {})
    assert got == want
    assert [t.data_ptr() for t in twin.graphs.static_buffers()] == ptrs
    assert twin.graphs.runner.hits > 20
    # batch sizes 1..8 all occurred: every bucket replayed at least once
    assert set(twin.graphs.runner.buckets) == {1, 2, 4, 8}


@torch.no_grad()
def test_padding_rows_write_no_kv(thinker):
    _, twin = _engines(thinker, num_blocks=64)
    for i in range(3):
        twin.add_request(Request(f"r{i}", [7 + i] * (10 + i), SamplingParams(max_tokens=20)))
    twin.step()  # the prefill (eager)
    for _ in range(3):
        before = [k.clone() for k, _ in twin.kv]
        reqs = list(twin.scheduler.running)
        at = [(r.blocks, r.num_computed) for r in reqs]
        slots = {b[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for b, p in at}
        hits = twin.graphs.runner.hits
        twin.step()
        assert twin.graphs.runner.hits == hits + 1  # 3 rows replayed in the bucket of 4: one padding row
        for (k, _), old in zip(twin.kv, before):
            changed = (k != old).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
            assert set(changed) == slots


@torch.no_grad()
def test_misses_run_eagerly(thinker):
    eager, twin = _engines(thinker, num_blocks=64, max_num_seqs=4, max_model_len=32)
    sched = [
        (0, "long", [3] * 30, SamplingParams(max_tokens=12)),
        (0, "short", [4] * 5, SamplingParams(max_tokens=6)),
    ]
    assert _drive(twin, sched, {}) == _drive(eager, sched, {})
    # "long" outgrows the 2-block static table at 33 tokens: those steps ran eagerly
    assert twin.graphs.runner.misses > 0 and twin.graphs.runner.hits > 0
    assert twin.graph_stats() == {
        "cuda_graph_hits": twin.graphs.runner.hits,
        "cuda_graph_misses": twin.graphs.runner.misses,
    }


def test_no_graphs_on_cpu_by_default_or_when_off(thinker):
    assert Engine(DecoderLMAdapter(thinker), num_blocks=8).graphs is None
    assert Engine(DecoderLMAdapter(thinker), num_blocks=8, graphs="off").graph_stats() == {}


def _naive_metadata(items):
    positions, slots, tables, seq_lens, qsl = [], [], [], [], [0]
    for req, n in items:
        pos = range(req.num_computed, req.num_computed + n)
        positions += pos
        slots += [req.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in pos]
        tables.append(req.blocks)
        seq_lens.append(req.num_computed + n)
        qsl.append(qsl[-1] + n)
    return positions, slots, tables, seq_lens, qsl


@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_step_inputs_equal_the_requests_metadata(seed, mirror):
    rng = random.Random(seed)
    inputs = StepInputs(torch.device("cpu"), 4, 16, mirror=mirror)
    reqs = [Request(f"r{i}", [1] * 5) for i in range(12)]
    for i, r in enumerate(reqs):
        r.slot = i
    free = list(range(200))
    rng.shuffle(free)
    for _ in range(30):
        items = []
        for r in rng.sample(reqs, rng.randrange(1, 9)):
            if rng.random() < 0.15:  # preempted and readmitted: a new block list
                r.blocks, r.num_computed = [], 0
            n = rng.randrange(1, 20)
            while len(r.blocks) * BLOCK_SIZE < r.num_computed + n:
                r.blocks.append(free.pop() if free else 0)
            items.append((r, n))
        batch = inputs.eager_batch(items)
        positions, slots, tables, seq_lens, qsl = _naive_metadata(items)
        assert batch.positions.tolist() == positions and batch.slot_mapping.tolist() == slots
        assert batch.seq_lens.tolist() == seq_lens and batch.query_start_loc.tolist() == qsl
        for row, table in zip(batch.block_tables.tolist(), tables):
            need = -(-max(seq_lens) // BLOCK_SIZE)
            assert row[: len(table)] == table[:need] and len(row) == need
        assert batch.max_seq_len == max(seq_lens) and batch.max_query_len == max(n for _, n in items)
        assert batch.seq_lens_host == seq_lens  # the host lengths the GPU decode kernel plans its splits by
        for r, n in items:
            r.num_computed += n
        if mirror:
            assert batch.positions.data_ptr() != inputs._eager.host_buffer.data_ptr()


def test_block_table_rows_are_written_only_when_blocks_change():
    tables = BlockTables(rows=2, width=2)
    r = Request("a", [1])
    r.slot, r.blocks = 1, [4, 9]
    tables.sync(r)
    tables.sync(r)
    assert tables.num_row_writes == 1
    r.blocks.append(11)  # a new block: grows the width, writes the row
    tables.sync(r)
    assert tables.num_row_writes == 2 and tables.table[1, :3].tolist() == [4, 9, 11]
    r.blocks = [5]  # readmitted after a preemption: a new list
    tables.sync(r)
    assert tables.num_row_writes == 3 and tables.table[1, 0] == 5
