"""``omniduplex init-model``, ``init-cascade`` and ``speak``: writing model checkpoints and cascade manifests,
and one utterance from any registered TTS family's checkpoint (merged into the top-level command by
:mod:`.main`; the families: :mod:`omniduplex.pipeline.speech.registry`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from omniduplex.cli.options import PLUGIN_HELP, load_plugins

models = typer.Typer()


@models.command("init-model")
def init_model(
    out: Path = typer.Option(..., "--out", help="Directory to write the checkpoint into."),
    preset: str = typer.Option("tiny", help="tiny (tests, default run) or small (~80M, CPU benchmarks)."),
    seed: int = typer.Option(0, help="Weight seed; the same seed gives byte-identical files."),
    text_only: bool = typer.Option(
        False, "--text-only", help="Write a Qwen3MoeForCausalLM text checkpoint (the Thinker decoder)."
    ),
    arch: str = typer.Option(
        "qwen3-omni",
        "--arch",
        help="qwen3-omni (Thinker-Talker), unified (delay-pattern speech LM + DAC), a registered TTS family: "
        "qwen3-tts, voxcpm2, higgs, fish-speech, a --plugin's (FAMILY-PRESET names the preset too, e.g. "
        "voxcpm2-tiny), or a real-size weightless preset: qwen3-omni-30b-a3b, qwen3-tts-12hz-1.7b, "
        "qwen3-0.6b, qwen2.5-7b (random weights built on the device at load), or moshi-tiny / moshi-small / "
        "moshi-7b (the full-duplex Moshi family).",
    ),
    depth: int | None = typer.Option(
        None, help="Real-size presets: cap every stack at this many layers (same widths; CPU runs)."
    ),
    variant: str | None = typer.Option(
        None, help="A TTS family's variant (qwen3-tts: base, custom_voice (default) or voice_design)."
    ),
    plugin: list[str] | None = typer.Option(None, "--plugin", help=PLUGIN_HELP),
) -> None:
    """Write a deterministic random-weight checkpoint (Qwen3-Omni layout, the unified delay-pattern LM, or a
    TTS family's preset) and print one JSON line describing it."""
    from omniduplex.models.real_shapes import REAL
    from omniduplex.models.registry import load_model, model_family_named

    load_plugins(plugin)
    if arch in REAL:
        _init_real(out, arch, depth, seed)
        return
    if arch == "moshi" or arch.startswith("moshi-"):
        _init_moshi(out, arch.removeprefix("moshi").removeprefix("-") or preset, seed)
        return
    family = model_family_named(arch)  # a registered model family (models/registry.py) with presets
    if family is None or family.init is None:
        _init_tts(out, arch, preset, seed, variant)
        return
    if arch != "qwen3-omni" and text_only:
        raise typer.BadParameter("--text-only applies to --arch qwen3-omni only")
    if variant is not None:
        raise typer.BadParameter(f"--variant applies to a TTS family, not --arch {arch}")
    t0 = time.perf_counter()
    family.write_preset(out, preset, seed, **({"text_only": True} if text_only else {}))
    written = time.perf_counter() - t0
    loaded = load_model(out)
    counts = loaded.num_parameters()
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "preset": preset,
                "architecture": loaded.architecture,
                "parameters": counts,
                "total_parameters": sum(counts.values()),
                "write_seconds": round(written, 3),
                "load_seconds": round(loaded.load_seconds, 3),
            }
        )
    )


def _init_real(out: Path, name: str, depth: int | None, seed: int) -> None:
    from omniduplex.models.real_shapes import memory_budget_gib, parameter_counts, write_real_dir

    write_real_dir(out, name, depth, seed)
    budget = memory_budget_gib(name)
    fp8 = {}
    if name.startswith("qwen3-omni"):  # the Thinker's LM in e4m3 (kernels/fp8_linear.py)
        fp8 = {"fp8_thinker_weights_gib": round(memory_budget_gib(name, fp8_thinker=True)["weights"], 2)}
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "preset": name,
                "depth": depth,
                "parameters": parameter_counts(name, depth),
                "full_depth_parameters": parameter_counts(name)["total"],
                "bf16_weights_gib": round(budget["weights"], 2),
                **fp8,
                "kv_bytes_per_token": budget["kv_bytes_per_token"],
            }
        )
    )


def _init_moshi(out: Path, preset: str, seed: int) -> None:
    """Write and load back a random Moshi (full-duplex) checkpoint (one JSON line).

    Raises typer.BadParameter: a preset the family does not have."""
    from omniduplex.models.moshi.checkpoint import load_moshi, write_moshi_checkpoint
    from omniduplex.models.moshi.config import PRESETS

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown --arch moshi-{preset}; choose a preset from {list(PRESETS)}")
    t0 = time.perf_counter()
    write_moshi_checkpoint(out, preset, seed)
    written = time.perf_counter() - t0
    counts = load_moshi(out).num_parameters()
    info = dict(out=str(out), preset=preset, architecture="moshi", parameters=counts)
    info.update(total_parameters=sum(counts.values()), write_seconds=round(written, 3))
    typer.echo(json.dumps(info))


def _init_tts(out: Path, arch: str, preset: str, seed: int, variant: str | None) -> None:
    """``init-model --arch FAMILY[-PRESET]`` for a registered TTS family: its ``init`` (one JSON line).

    Raises typer.BadParameter: no such family or preset, a variant the family does not have."""
    from omniduplex.pipeline.speech.registry import families

    by_length = sorted(families(), key=lambda f: -len(f.name))  # "qwen3-tts-tiny": the longest name first
    family = next((f for f in by_length if arch == f.name or arch.startswith(f.name + "-")), None)
    if family is None or family.init is None:
        from omniduplex.models.registry import model_families

        names = [*(m.name for m in model_families() if m.init), *(f.name for f in families() if f.init)]
        raise typer.BadParameter(f"unknown --arch {arch!r}; choose from {names}")
    name = arch.removeprefix(family.name).removeprefix("-") or preset
    if name not in family.presets:
        raise typer.BadParameter(
            f"unknown --arch {family.name}-{name}; choose a preset from {list(family.presets)}"
        )
    if variant is not None and variant not in family.variants:
        have = list(family.variants) or "none"
        raise typer.BadParameter(f"unknown variant {variant!r} for {family.name}; it has {have}")
    try:
        info = family.init(out, name, seed, variant)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(json.dumps(info))


@models.command("init-cascade")
def init_cascade(
    out: Path = typer.Option(Path("cascade.yaml"), "--out", help="Manifest file (or folder) to write."),
    asr: str | None = typer.Option(
        None,
        help="ASR: moonshine-base, whisper-tiny.en (packaged), or a Moonshine / Whisper CTranslate2 folder "
        "(default: moonshine-base).",
    ),
    llm: Path | None = typer.Option(
        None, help="LLM: HF Llama/Qwen3 checkpoint directory or .gguf (default: packaged Qwen2.5-Coder-1.5B)."
    ),
    tts: Path | None = typer.Option(
        None,
        help="Piper voice .onnx or a TTS checkpoint directory of a registered family: Qwen3-TTS, VoxCPM2, "
        "Higgs Audio v3, Fish Speech S2 Pro, a --plugin's, the family read from its config.json (default: "
        "packaged Piper en_US joe).",
    ),
    tts_voice: str | None = typer.Option(
        None,
        "--tts-voice",
        help="Voice of the --tts checkpoint (Qwen3-TTS: CustomVoice speaker, default its first; "
        "Higgs: a voices.json voice).",
    ),
    tts_instructions: str | None = typer.Option(
        None, "--tts-instructions", help="Qwen3-TTS VoiceDesign voice description (or CustomVoice style)."
    ),
    tts_ref_audio: Path | None = typer.Option(
        None,
        "--tts-ref-audio",
        help="Clip to clone: Qwen3-TTS Base 24 kHz (>= 1 s), VoxCPM2 16 kHz, Fish Speech 44.1 kHz.",
    ),
    tts_ref_text: str | None = typer.Option(
        None,
        "--tts-ref-text",
        help="Transcript of --tts-ref-audio (Qwen3-TTS Base: in-context; VoxCPM2: continuation; Fish).",
    ),
    plugin: list[str] | None = typer.Option(None, "--plugin", help=PLUGIN_HELP),
) -> None:
    """Write a cascade manifest (asr → llm → tts) to pass as --model; unset parts use the packaged weights.
    With a Qwen3-TTS checkpoint as --tts the assistant speaks in its voice (--tts-voice / --tts-instructions /
    --tts-ref-audio + --tts-ref-text, as the checkpoint's variant takes)."""
    from omniduplex.models import weights
    from omniduplex.models.cascade.manifest import DEFAULT_ASR, asr_path, load_manifest, write_manifest
    from omniduplex.models.checkpoint import CheckpointError
    from omniduplex.pipeline.speech.registry import family_of, known

    load_plugins(plugin)

    def pick(given: Path | None, packaged) -> Path:
        return given.resolve() if given else weights.locate(packaged)

    voice = {
        "tts_voice": tts_voice,
        "tts_instructions": tts_instructions,
        "tts_ref_audio": tts_ref_audio.resolve() if tts_ref_audio else None,
        "tts_ref_text": tts_ref_text,
    }
    family = family_of(tts) if tts is not None else None  # a registered TTS family
    if family is None and any(v is not None for v in voice.values()):
        raise typer.BadParameter(
            "--tts-voice / --tts-instructions / --tts-ref-* need a TTS checkpoint (Qwen3-TTS --tts, or a "
            "VoxCPM2 / Higgs / Fish Speech one)"
        )
    if family is None and tts is not None and tts.is_dir():
        raise typer.BadParameter(f"--tts {tts}: no registered TTS family's checkpoint ({known()})")
    if family is not None and family.voice_names is not None and tts_voice is not None:
        names = family.voice_names(tts)  # read from the checkpoint's files, no weights loaded
        if tts_voice.lower() not in [n.lower() for n in names]:
            raise typer.BadParameter(f"--tts-voice {tts_voice!r}: this checkpoint has {names}")
    try:
        path = write_manifest(
            out,
            asr=asr_path(asr or DEFAULT_ASR).resolve(),
            llm=llm.resolve() if llm else weights.assemble(weights.QWEN25_CODER_15B),
            tts=pick(tts, weights.PIPER_JOE),
            tts_config=None if tts else weights.locate(weights.PIPER_JOE_CONFIG),
            tts_voice=voice if family else None,
            llm_quantized=llm is None,  # the packaged default LLM on its quantized blocks
        )
        m = load_manifest(path)  # checks that every part exists
    except CheckpointError as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(json.dumps({"manifest": str(path), "asr": str(m.asr), "llm": str(m.llm), "tts": str(m.tts)}))


@models.command()
def speak(
    model: Path = typer.Option(
        ...,
        "--model",
        help="A registered TTS family's checkpoint (Qwen3-TTS, VoxCPM2, Higgs, Fish Speech...).",
    ),
    text: str = typer.Option(..., "--text", help="What to say."),
    output: Path = typer.Option(Path("speech.wav"), "--output", "-o", help="16-bit WAV to write."),
    rate: int | None = typer.Option(
        None, "--rate", min=1, help="Sample rate of the WAV (Hz; default: the family's own)."
    ),
    voice: str | None = typer.Option(None, "--voice", help="One of the checkpoint's voices."),
    instruct: str | None = typer.Option(
        None, "--instruct", help="Qwen3-TTS VoiceDesign / CustomVoice: voice instruction."
    ),
    ref_audio: Path | None = typer.Option(
        None, "--ref-audio", help="Reference clip to clone (resampled to the family's reference rate)."
    ),
    ref_text: str | None = typer.Option(None, "--ref-text", help="Transcript of --ref-audio."),
    language: str = typer.Option("auto", help="Qwen3-TTS: auto or a codec_language_id key (english, ...)."),
    greedy: bool = typer.Option(
        False, "--greedy", help="Deterministic decoding (default: the family's sampling)."
    ),
    seed: int = typer.Option(0, help="Sampling seed."),
    max_frames: int = typer.Option(
        2048, min=1, help="Max frames of the family incl. EOS (Qwen3-TTS: 12.5/s)."
    ),
    plugin: list[str] | None = typer.Option(None, "--plugin", help=PLUGIN_HELP),
) -> None:
    """Say one utterance with any registered TTS family's checkpoint: its engine, its decoder streamed;
    writes the family's native rate (``--rate``: resampled) and prints TTFP, audio seconds and RTF."""
    import numpy as np
    import soxr

    from omniduplex.models.checkpoint import CheckpointError
    from omniduplex.models.config import ConfigError
    from omniduplex.pipeline.audio_io import AudioInputError, load_audio, write_wav
    from omniduplex.pipeline.speech.family_runner import TTSInputError
    from omniduplex.pipeline.speech.registry import load_runner

    load_plugins(plugin)
    if ref_text is not None and ref_audio is None:
        raise typer.BadParameter("--ref-text needs --ref-audio")
    try:
        runner = load_runner(model, max_num_seqs=1)
        ref = None
        if ref_audio is not None:
            ref_rate = runner.ref_rate or runner.sample_rate
            ref = (load_audio(ref_audio, ref_rate), ref_rate)
        prompt = runner.prompt(text, voice, ref, ref_text, instruct, language)
    except (CheckpointError, ConfigError, TTSInputError, AudioInputError, ValueError) as e:
        raise typer.BadParameter(str(e)) from e
    sampling = {"seed": seed, **(runner.greedy if greedy else {})}
    out_rate = rate or runner.sample_rate
    resampler = (
        None if out_rate == runner.sample_rate else soxr.ResampleStream(runner.sample_rate, out_rate, 1)
    )
    t0 = time.perf_counter()
    ttfp, pieces = None, []
    try:
        for piece in runner.stream(prompt, max_frames, sampling):
            if piece.size:
                ttfp = ttfp if ttfp is not None else time.perf_counter() - t0
                pieces.append(piece)
    except ValueError as e:  # TTSInputError too: no room after the prompt, sampling keys the family lacks
        raise typer.BadParameter(str(e)) from e
    wall = time.perf_counter() - t0
    wav = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    if resampler is not None:
        wav = resampler.resample_chunk(wav.astype(np.float32), last=True)
    write_wav(output, wav, out_rate)
    seconds = wav.shape[0] / out_rate
    typer.echo(
        json.dumps(
            {
                "output": str(output),
                "family": runner.family,
                "sample_rate": out_rate,
                "audio_seconds": round(seconds, 3),
                "ttfp_ms": round(1000 * ttfp, 1) if ttfp is not None else None,
                "rtf": round(wall / seconds, 3) if seconds else None,
            }
        )
    )
