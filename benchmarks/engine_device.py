"""``omniduplex bench engine --device cuda``: our engine, eager and with CUDA graphs, vs ``transformers``
(static cache + ``torch.compile`` generate) on a Qwen3-0.6B-shaped random checkpoint, on one GPU.

Workload (issue 33): ``c`` requests × 128 random prompt tokens, 128 new tokens each, greedy, no stop token,
all submitted at once, bf16; ``c`` = 1, 8, 128 by default. The checkpoint is written by ``transformers``
(``Qwen3ForCausalLM(config).save_pretrained``, seeded init; 28 layers, hidden 1024, 16/8 heads of 128,
intermediate 3072, vocabulary 151,936, tied embeddings) and read by our loader.

Settings:

* ``ours eager``: our engine, every step eager (``graphs="off"``).
* ``ours CUDA graphs``: decode steps replayed per batch-size bucket (:mod:`omniduplex.pipeline.engine
  .decode_graphs`), captured when the engine is built (capture time reported, not timed).
* ``transformers``: ``generate`` with ``cache_implementation="static"`` and its own ``torch.compile`` of the
  decoding forward (``CompileConfig(mode="default", dynamic=True)``: one compile for every ``c``, no
  max-autotune), the ``c`` prompts batched in one call; compiled by a warm-up call outside the timed region.

Measures: tok/s = generated tokens (``c × 128``) ÷ wall time from submission to the last token (prefill
included); ms/step = mean wall time of the decode steps (ours; ``engine.step()`` returns after its tokens are
on the host, so it includes the device time); replay host time = per replayed decode step at ``c = 1``, the
wall time from the start of :meth:`DecodeGraphs.run` to the return of the replay launch (inputs gathered and
written, the one host-to-device copy enqueued, ``graph.replay()`` returned; no device sync): the host's part
of a replayed step, which must stay below the device's for the GPU never to wait.

Targets (H100/H200): c=1 ≥ 1,000 tok/s, c=128 ≥ 25,000 tok/s (ours with CUDA graphs), replay host time at
c=1 ≤ 0.5 ms. ``--device cpu --tiny`` is a dry run of every code path on the CPU (the graph runner's CPU twin,
``transformers`` compiled for the CPU) on a 2-layer model; its figures mean nothing.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPT_LEN, NEW_TOKENS = 128, 128
CONCURRENCY = (1, 8, 128)
TARGETS = {"c1_tok_s": 1000.0, "c128_tok_s": 25000.0, "replay_host_ms_c1": 0.5}
QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
TINY = dict(
    QWEN3_06B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)


class DeviceUnavailable(RuntimeError):
    """``--device cuda`` where torch sees no GPU."""


def model_config(tiny: bool = False, layers: int | None = None) -> dict:
    """The Qwen3 config of the run (``tiny``: a 2-layer model for dry runs; ``layers``: another depth)."""
    cfg = dict(TINY if tiny else QWEN3_06B)
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    return cfg


def write_random_qwen3(out: Path, cfg: dict, device: torch.device, seed: int = 0) -> Path:
    """``Qwen3ForCausalLM(config)`` with ``transformers``' seeded init, saved (bf16) to ``out`` unless a
    checkpoint of the same config is there already. Initialised on ``device`` (fast on a GPU)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    stamp = json.dumps({**cfg, "seed": seed}, sort_keys=True)
    done = out / "bench.json"
    if (out / "model.safetensors").is_file() and done.is_file() and done.read_text() == stamp:
        return out
    torch.manual_seed(seed)
    config = Qwen3Config(**cfg)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(out)
    (out / "bench.json").write_text(stamp)
    return out


def _prompts(c: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(PROMPT_LEN)] for _ in range(c)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    """Return a finished setting's memory (the next one starts from an empty cache)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def ours(model_dir: Path, cs: list[int], graphs: str, device: torch.device, dtype: torch.dtype) -> dict:
    """Our engine (``graphs``: ``off``, ``cuda`` or ``twin``) at each ``c``: ``{c: {tok_s, ms_per_step, …}}``
    plus ``capture_s`` / ``capture_mib`` (graphs). One engine serves every ``c`` (captured once)."""
    from omniduplex.models.registry import load_model
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.decode_graphs import is_decode_only
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    thinker = load_model(model_dir, parts=("thinker",), dtype=dtype, device=device).thinker
    top = max(cs)
    blocks_per_req = -(-(PROMPT_LEN + NEW_TOKENS) // 16)
    engine = Engine(
        DecoderLMAdapter(thinker),
        num_blocks=top * blocks_per_req + 16,
        max_num_seqs=top,
        max_num_batched_tokens=max(4096, min(top * PROMPT_LEN, 16384)),
        dtype=dtype,
        device=device,
        enable_prefix_caching=False,
        graphs=graphs,
        max_model_len=PROMPT_LEN + NEW_TOKENS,
        name=f"bench {graphs}",
    )
    res: dict = {}
    if engine.graphs is not None:
        res["capture_s"] = engine.graphs.runner.capture_s
        res["capture_mib"] = engine.graphs.runner.capture_bytes / 2**20
    vocab = thinker.cfg.vocab_size
    with torch.inference_mode():
        for c in cs:
            for i, p in enumerate(_prompts(c, vocab, seed=1)):  # warm-up: this c's kernels, buckets, shapes
                engine.add_request(Request(f"w{c}-{i}", p, SamplingParams(max_tokens=4)))
            while engine.has_unfinished():
                engine.step()
            g = engine.graphs
            host0, hits0 = (g.host_s, g.runner.hits) if g else (0.0, 0)
            _sync(device)
            t0 = time.perf_counter()
            for i, p in enumerate(_prompts(c, vocab)):
                engine.add_request(Request(f"r{c}-{i}", p, SamplingParams(max_tokens=NEW_TOKENS)))
            tokens, decode_s, decode_steps = 0, 0.0, 0
            while engine.has_unfinished():
                sched = engine.scheduler
                decode = not sched.waiting and is_decode_only([(r, 1) for r in sched.running])
                s0 = time.perf_counter()
                tokens += sum(len(o.new_token_ids) for o in engine.step())
                if decode:
                    decode_s += time.perf_counter() - s0
                    decode_steps += 1
            _sync(device)
            wall = time.perf_counter() - t0
            row = {
                "tok_s": tokens / wall,
                "tokens": tokens,
                "wall_s": wall,
                "ms_per_step": 1e3 * decode_s / max(decode_steps, 1),
                "decode_steps": decode_steps,
            }
            if g is not None:
                replays = g.runner.hits - hits0
                row["replays"] = replays
                row["replay_host_ms"] = 1e3 * (g.host_s - host0) / max(replays, 1)
            res[c] = row
    if engine.graphs is not None:
        res["graph_hits"], res["graph_misses"] = engine.graphs.runner.hits, engine.graphs.runner.misses
    del engine, thinker
    _free(device)
    return res


def transformers_static_compiled(
    model_dir: Path, cs: list[int], device: torch.device, dtype: torch.dtype, budget_s: float | None = None
) -> dict:
    """``generate`` with a static cache and ``torch.compile`` (mode default), the ``c`` prompts in one call:
    ``{c: {tok_s, wall_s}}`` plus ``compile_s`` (the warm-up calls, compile included). ``budget_s`` caps it:
    a level that would start after that many seconds is not run (``{c: {"skipped": ...}}``)."""
    t_start = time.perf_counter()
    from transformers import AutoModelForCausalLM
    from transformers.generation.configuration_utils import CompileConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    compile_config = CompileConfig(mode="default", dynamic=True)
    if device.type != "cuda":  # transformers compiles on accelerators only unless told (the CPU dry run)
        compile_config._compile_all_devices = True
    gen = dict(
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        cache_implementation="static",
        compile_config=compile_config,
    )
    res: dict = {"compile_s": 0.0}
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for c in cs:
            if budget_s is not None and time.perf_counter() - t_start > budget_s:
                res[c] = {"skipped": f"baseline budget of {budget_s:.0f} s spent"}
                continue
            ids = torch.tensor(_prompts(c, vocab), device=device)
            mask = torch.ones_like(ids)
            t0 = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=mask, **gen)  # compiles (first c), warms up
            _sync(device)
            res["compile_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, **gen)
            _sync(device)
            wall = time.perf_counter() - t0
            tokens = (out.shape[1] - PROMPT_LEN) * c
            res[c] = {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall}
    del model
    _free(device)
    return res


def _targets(graphs: dict, cs: list[int]) -> dict:
    got = {
        "c1_tok_s": graphs.get(1, {}).get("tok_s"),
        "c128_tok_s": graphs.get(128, {}).get("tok_s"),
        "replay_host_ms_c1": graphs.get(1, {}).get("replay_host_ms"),
    }
    out = {}
    for key, target in TARGETS.items():
        value = got[key]
        met = None if value is None else (value <= target if key.startswith("replay") else value >= target)
        out[key] = {"target": target, "value": value, "met": met}
    return out


def run(
    cs: list[int] | None = None,
    device: str = "cuda",
    json_out: Path | None = None,
    tiny: bool = False,
    layers: int | None = None,
    baseline: bool = True,
    workdir: Path | None = None,
    baseline_budget_s: float | None = 90.0,
) -> dict:
    """Measure, print the table with the targets marked met/missed, write JSON; returns the JSON dict. The
    ``transformers`` baseline runs last, capped at ``baseline_budget_s`` (its compile of each new shape can
    take minutes; ``None``: no cap), so our settings are always measured.

    Raises:
        DeviceUnavailable: ``device`` is ``cuda`` and torch sees no GPU.
    """
    cs = list(cs or CONCURRENCY)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"bench engine --device cuda: torch {torch.__version__} sees no CUDA GPU "
            "(run it on a GPU machine, or dry-run the code paths with --device cpu --tiny)"
        )
    t_start = time.perf_counter()
    cfg = model_config(tiny, layers)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    workdir = workdir or Path(tempfile.gettempdir()) / "omniduplex-bench-engine"
    name = f"qwen3-{'tiny' if tiny else '0.6b'}-{cfg['num_hidden_layers']}l"
    t0 = time.perf_counter()
    model_dir = write_random_qwen3(workdir / name, cfg, dev)
    write_s = time.perf_counter() - t0
    graph_mode = "cuda" if dev.type == "cuda" else "twin"
    settings = {
        "ours eager": lambda: ours(model_dir, cs, "off", dev, dtype),
        "ours CUDA graphs": lambda: ours(model_dir, cs, graph_mode, dev, dtype),
    }
    if baseline:
        settings["transformers static+compile"] = lambda: transformers_static_compiled(
            model_dir, cs, dev, dtype, baseline_budget_s
        )
    res: dict = {}
    for label, run in settings.items():  # each setting's figures printed (and saved) as soon as it is done,
        res[label] = run()  # so a run cut short by a device lease still leaves the settings it finished
        print(f"{label}: " + json.dumps({str(c): v for c, v in res[label].items()}), flush=True)
        if json_out:
            json_out.write_text(json.dumps({"partial": True, "settings": res}, indent=2, default=str))
    summary = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "model": cfg,
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_tokens": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "concurrency": cs,
        "settings": {k: {str(c): v for c, v in r.items()} for k, r in res.items()},
        "targets": _targets(res["ours CUDA graphs"], cs),
        "checkpoint_write_s": write_s,
        "total_s": time.perf_counter() - t_start,
    }
    print(_table(summary, res, cs))
    if json_out:
        json_out.write_text(json.dumps(summary, indent=2))
    return summary


def _table(summary: dict, res: dict, cs: list[int]) -> str:
    m = summary["model"]
    lines = [
        f"\nengine benchmark on {summary['device']} (torch {summary['torch']}), {summary['dtype']}: Qwen3 "
        f"{m['num_hidden_layers']} layers, hidden {m['hidden_size']}, vocab {m['vocab_size']}; c requests x "
        f"{PROMPT_LEN} prompt tokens, {NEW_TOKENS} new tokens, greedy",
        "| c | ours eager tok/s (ms/step) | ours CUDA graphs tok/s (ms/step) | replay host ms | "
        "transformers static+compile tok/s | graphs / transformers |",
        "|---|---|---|---|---|---|",
    ]
    hf = res.get("transformers static+compile", {})
    for c in cs:
        e, g, t = res["ours eager"][c], res["ours CUDA graphs"][c], hf.get(c)
        theirs = f"{t['tok_s']:,.1f} | {g['tok_s'] / t['tok_s']:.2f}x" if t and "tok_s" in t else "- | -"
        lines.append(
            f"| {c} | {e['tok_s']:,.1f} ({e['ms_per_step']:.2f}) | {g['tok_s']:,.1f} "
            f"({g['ms_per_step']:.2f}) | {g.get('replay_host_ms', float('nan')):.3f} | {theirs} |"
        )
    gr = res["ours CUDA graphs"]
    lines.append(f"graph capture: {gr.get('capture_s', 0):.2f} s, {gr.get('capture_mib', 0):.1f} MiB")
    if hf:
        lines.append(f"transformers warm-up calls (compile included): {hf['compile_s']:.1f} s")
    for key, t in summary["targets"].items():
        if t["value"] is None:
            state = "not measured"
        else:
            state = f"{t['value']:,.3f}: {'met' if t['met'] else 'MISSED'}"
        bound = "<=" if key.startswith("replay") else ">="
        lines.append(f"target {key} {bound} {t['target']:,}: {state}")
    lines.append(f"total {summary['total_s']:.1f} s")
    return "\n".join(lines)


def main_or_exit(**kw) -> dict:
    """:func:`run`, or one line on stderr and exit code 2 when the device is missing."""
    try:
        return run(**kw)
    except DeviceUnavailable as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":  # the device check's entry point: no typer, no server packages needed
    import argparse

    ap = argparse.ArgumentParser(description="omniduplex bench engine --device cuda (module docstring)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--no-baselines", action="store_true")
    a = ap.parse_args()
    main_or_exit(
        cs=[int(c) for c in a.concurrency.split(",")],
        device=a.device,
        json_out=a.json,
        tiny=a.tiny,
        layers=a.layers,
        baseline=not a.no_baselines,
    )
