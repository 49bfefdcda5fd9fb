"""``omniduplex bench messages``: what typed stage messages cost, beside a decode step of the cascade's LLM.

Every stage message is a declared kind (:mod:`omniduplex.pipeline.messages`), validated when it is built and
again when it arrives from another stage process. Per sampled token of one turn the LLM stage builds one
:class:`~omniduplex.pipeline.messages.DecoderOutput` and the relay carries it on two edges (LLM → TTS, LLM →
orchestrator): one build + two wire round trips (:func:`~omniduplex.pipeline.messages.meta_to_wire` /
:func:`~omniduplex.pipeline.messages.meta_from_wire`). The benchmark times that per message and compares
``concurrency`` of them (one per request of a decode step) with a decode step of the packaged LLM at batch
``concurrency`` (the LLM stage's engine, its KV cache warm). Issue 39's bound: under 2 % of a step at c = 8.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from omniduplex.pipeline.events import CallDone
from omniduplex.pipeline.messages import DecoderOutput, TurnOptions, meta_from_wire, meta_to_wire

TURN = TurnOptions(
    system_prompt="You are a helpful voice assistant. Answer in one or two short spoken sentences.",
    history=[["user", "What's the weather like in Lisbon?"], ["assistant", "Sunny and mild today."]] * 3,
    sampling={"max_tokens": 64, "temperature": 0.0},
)


def per_message_us(n: int = 20_000) -> dict[str, float]:
    """Microseconds per message: ``build`` (a token's DecoderOutput), ``hop`` (one wire round trip),
    ``token`` (build + two hops: what one sampled token costs), ``first`` (the turn's first message, with its
    options, build + two hops), ``call`` (a finished tool call's message, build + two hops)."""

    def timed(fn, k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        return 1e6 * (time.perf_counter() - t0) / k

    def token():
        m = DecoderOutput(text=" word")
        meta_from_wire(meta_to_wire(m))
        meta_from_wire(meta_to_wire(m))

    def first():
        m = DecoderOutput(turn=TURN, text=" Sunny")
        meta_from_wire(meta_to_wire(m))
        meta_from_wire(meta_to_wire(m))

    def call():
        done = CallDone("call_0123456789abcdef01234567", "get_weather", '{"city": "Lisbon"}')
        m = DecoderOutput(call_done=done)
        meta_from_wire(meta_to_wire(m))
        meta_from_wire(meta_to_wire(m))

    one = DecoderOutput(text=" word")
    return {
        "build": timed(lambda: DecoderOutput(text=" word"), n),
        "hop": timed(lambda: meta_from_wire(meta_to_wire(one)), n),
        "token": timed(token, n),
        "first": timed(first, n // 10),
        "call": timed(call, n // 10),
    }


def decode_step_ms(concurrency: int, steps: int = 24, dtype: str = "float32") -> float:
    """Median wall time (ms) of one decode step of the packaged cascade LLM with ``concurrency`` requests in
    flight (greedy, after their prefill)."""
    from omniduplex.benchmarks.prefix import load_llm
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    model = load_llm(dtype)
    engine = Engine(DecoderLMAdapter(model.thinker), num_blocks=256, max_num_seqs=max(8, concurrency))
    prompt = list(range(100, 164))
    for i in range(concurrency):
        sp = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
        engine.add_request(Request(f"r{i}", prompt, sp))
    while engine.scheduler.waiting or any(not r.output_ids for r in engine.scheduler.running):
        engine.step()  # prefill
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def run(concurrency: int = 8, json_out: Path | None = None, dtype: str = "float32") -> dict:
    """Print and return the per-message costs and their share of a decode step at ``concurrency``."""
    msg = per_message_us()
    step = decode_step_ms(concurrency, dtype=dtype)
    share = concurrency * msg["token"] / 1000 / step
    print("typed stage messages (us per message; token = build + 2 wire hops)")
    for k, v in msg.items():
        print(f"  {k:6s} {v:8.2f}")
    print(f"decode step of the cascade LLM at c={concurrency}: {step:.2f} ms")
    print(f"messages of one step: {concurrency} x {msg['token']:.1f} us = {share * 100:.2f} % of the step "
          f"(bound: 2 %)")
    out = {"per_message_us": msg, "concurrency": concurrency, "decode_step_ms": step, "share": share}
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=2))
    return out
