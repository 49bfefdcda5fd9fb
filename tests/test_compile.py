"""``torch.compile`` of a whole decoder forward (custom ops for paged attention, KV write and MoE):
one graph, no break, and the engine's outputs equal eager ones for prefill, mixed and decode batches."""

from __future__ import annotations

import random

import pytest
import torch

from omniduplex.models.qwen3_omni.presets import write_checkpoint
from omniduplex.models.registry import load_model
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.compile import compile_decoder
from omniduplex.pipeline.engine.engine import Engine
from omniduplex.pipeline.engine.request import Request, SamplingParams

pytestmark = pytest.mark.slow  # compiling takes tens of seconds


def _run(thinker, prompts, staggered: bool) -> dict[str, list[int]]:
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
    out: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    with torch.inference_mode():
        while pending or engine.has_unfinished():
            if pending:  # one new request per step when staggered: prefill chunks beside decodes
                for i, p in pending[:1] if staggered else pending:
                    engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=12)))
                pending = pending[1:] if staggered else []
            for o in engine.step():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


def test_compiled_forward_is_one_graph_and_equals_eager(tmp_path):
    d = write_checkpoint(tmp_path / "m", "tiny", seed=5, text_only=True)
    rng = random.Random(1)
    prompts = [[rng.randrange(0, 256) for _ in range(rng.randrange(1, 30))] for _ in range(5)]
    eager = load_model(d).thinker
    want = {s: _run(eager, prompts, s) for s in (False, True)}
    torch._dynamo.reset()
    compiled = compile_decoder(load_model(d).thinker)  # fullgraph=True: a graph break raises
    for staggered in (False, True):
        assert _run(compiled, prompts, staggered) == want[staggered]
    assert _run(compiled, prompts[:1], False) == {"r0": want[False]["r0"]}  # one sequence: T == 1 decode


def test_compiled_forward_on_the_cpp_kernels_equals_eager(tmp_path):
    """A model prepared for CPU serving (C++ KV write, decode attention and MoE ops, kernels/cpu_ops.py)
    compiles to one graph around those ops too, and gives the eager tokens."""
    from omniduplex.kernels.cpu_linear import prepack_linears

    d = write_checkpoint(tmp_path / "m", "tiny", seed=7, text_only=True)
    rng = random.Random(2)
    prompts = [[rng.randrange(0, 256) for _ in range(rng.randrange(1, 30))] for _ in range(5)]
    eager = load_model(d).thinker
    assert prepack_linears(eager) == 0  # fp32: nothing packed, the C++ ops attached
    assert eager.model.layers[0].mlp.experts.use_cpu_ops
    want = _run(eager, prompts, True)
    torch._dynamo.reset()
    compiled = load_model(d).thinker
    prepack_linears(compiled)
    compile_decoder(compiled)
    assert _run(compiled, prompts, True) == want
    assert _run(compiled, prompts[:1], False) == {"r0": _run(eager, prompts[:1], False)["r0"]}
