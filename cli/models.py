"""``omniduplex init-model``, ``init-cascade`` and ``speak``: writing model checkpoints and cascade manifests,
and one utterance from a Qwen3-TTS checkpoint (merged into the top-level command by :mod:`.main`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

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
        help="qwen3-omni (Thinker-Talker), unified (delay-pattern speech LM + DAC), qwen3-tts, or "
        "voxcpm2-tiny / voxcpm2-small, higgs-tiny / higgs-small, fish-speech-tiny / fish-speech-small, "
        "moshi-tiny / moshi-small / moshi-7b (full duplex; the preset in the name).",
    ),
    variant: str = typer.Option(
        "custom_voice",
        help="qwen3-tts only: base (voice cloning), custom_voice (named speakers) or voice_design.",
    ),
) -> None:
    """Write a deterministic random-weight checkpoint (Qwen3-Omni layout, the unified delay-pattern LM, or
    Qwen3-TTS)."""
    from omniduplex.models.qwen3_omni.presets import write_checkpoint
    from omniduplex.models.registry import load_model
    from omniduplex.models.unified.presets import write_unified_checkpoint

    # the preset in the name, or --arch FAMILY --preset P
    for family in ("voxcpm2", "higgs", "fish-speech", "moshi"):
        if arch == family or arch.startswith(family + "-"):
            name = arch.removeprefix(family).removeprefix("-") or preset
            _init_family(out, family.replace("-", "_"), name, seed)
            return
    if arch not in ("qwen3-omni", "unified", "qwen3-tts"):
        raise typer.BadParameter(f"unknown --arch {arch!r}; choose qwen3-omni, unified or qwen3-tts")
    if arch != "qwen3-omni" and text_only:
        raise typer.BadParameter("--text-only applies to --arch qwen3-omni only")
    if arch == "qwen3-tts":
        _init_qwen3_tts(out, preset, seed, variant)
        return
    t0 = time.perf_counter()
    if arch == "unified":
        write_unified_checkpoint(out, preset, seed)
    else:
        write_checkpoint(out, preset, seed, text_only)
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


def _init_qwen3_tts(out: Path, preset: str, seed: int, variant: str) -> None:
    from omniduplex.models.qwen3_tts.model import load_qwen3_tts
    from omniduplex.models.qwen3_tts.presets import PRESETS, write_tts_checkpoint

    if preset not in PRESETS:
        raise typer.BadParameter(f"unknown --preset {preset!r} for qwen3-tts; choose from {list(PRESETS)}")
    t0 = time.perf_counter()
    try:
        write_tts_checkpoint(out, preset, seed, variant)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    written = time.perf_counter() - t0
    loaded = load_qwen3_tts(out)
    counts = loaded.num_parameters()
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "preset": preset,
                "architecture": "Qwen3TTSForConditionalGeneration",
                "variant": variant,
                "parameters": counts,
                "total_parameters": sum(counts.values()),
                "write_seconds": round(written, 3),
                "load_seconds": round(loaded.load_seconds, 3),
            }
        )
    )


def _init_family(out: Path, family: str, preset: str, seed: int) -> None:
    """Write and load back a random VoxCPM2 / Higgs Audio v3 / Fish Speech / Moshi checkpoint (one JSON line).

    Raises typer.BadParameter: a preset the family does not have."""
    if family == "voxcpm2":
        from omniduplex.models.voxcpm2.model import load_voxcpm2 as load
        from omniduplex.models.voxcpm2.presets import PRESETS
        from omniduplex.models.voxcpm2.presets import write_voxcpm2_checkpoint as write

        architecture = "voxcpm2"
    elif family == "higgs":
        from omniduplex.models.higgs.model import load_higgs as load
        from omniduplex.models.higgs.presets import PRESETS
        from omniduplex.models.higgs.presets import write_higgs_checkpoint as write

        architecture = "HiggsMultimodalQwen3ForConditionalGeneration"
    elif family == "moshi":
        from omniduplex.models.moshi.checkpoint import load_moshi as load
        from omniduplex.models.moshi.checkpoint import write_moshi_checkpoint as write
        from omniduplex.models.moshi.config import PRESETS

        architecture = "moshi"
    else:
        from omniduplex.models.fish_speech.load import load_fish_speech as load
        from omniduplex.models.fish_speech.presets import PRESETS
        from omniduplex.models.fish_speech.presets import write_fish_checkpoint as write

        architecture = "fish_qwen3_omni"
    if preset not in PRESETS:
        name = family.replace("_", "-")
        raise typer.BadParameter(f"unknown --arch {name}-{preset}; choose a preset from {list(PRESETS)}")
    t0 = time.perf_counter()
    write(out, preset, seed)
    written = time.perf_counter() - t0
    loaded = load(out)
    counts = loaded.num_parameters()
    info = dict(out=str(out), preset=preset, architecture=architecture, parameters=counts)
    if getattr(loaded, "voices", None):
        info["voices"] = sorted(loaded.voices)
    info.update(total_parameters=sum(counts.values()), write_seconds=round(written, 3))
    if hasattr(loaded, "load_seconds"):
        info["load_seconds"] = round(loaded.load_seconds, 3)
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
        None, help="LLM: HF Llama/Qwen3 checkpoint directory or .gguf (default: packaged SmolLM2-135M)."
    ),
    tts: Path | None = typer.Option(
        None,
        help="Piper voice .onnx or a TTS checkpoint directory: Qwen3-TTS, VoxCPM2, Higgs Audio v3 or "
        "Fish Speech S2 Pro, the family read from its config.json (default: packaged Piper en_US joe).",
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
) -> None:
    """Write a cascade manifest (asr → llm → tts) to pass as --model; unset parts use the packaged weights.
    With a Qwen3-TTS checkpoint as --tts the assistant speaks in its voice (--tts-voice / --tts-instructions /
    --tts-ref-audio + --tts-ref-text, as the checkpoint's variant takes)."""
    from omniduplex.models import weights
    from omniduplex.models.cascade.manifest import DEFAULT_ASR, asr_path, load_manifest, write_manifest
    from omniduplex.models.checkpoint import CheckpointError, read_config
    from omniduplex.models.qwen3_tts.config import TTSConfig
    from omniduplex.models.qwen3_tts.model import is_qwen3_tts
    from omniduplex.models.tts_family import tts_family

    def pick(given: Path | None, packaged) -> Path:
        return given.resolve() if given else weights.locate(packaged)

    voice = {
        "tts_voice": tts_voice,
        "tts_instructions": tts_instructions,
        "tts_ref_audio": tts_ref_audio.resolve() if tts_ref_audio else None,
        "tts_ref_text": tts_ref_text,
    }
    family = tts_family(tts) if tts is not None else None  # Qwen3-TTS, VoxCPM2, Higgs or Fish Speech
    if family is None and any(v is not None for v in voice.values()):
        raise typer.BadParameter(
            "--tts-voice / --tts-instructions / --tts-ref-* need a TTS checkpoint (Qwen3-TTS --tts, or a "
            "VoxCPM2 / Higgs / Fish Speech one)"
        )
    if family is None and tts is not None and tts.is_dir():
        raise typer.BadParameter(f"--tts {tts}: no TTS family's checkpoint (config.json)")
    qwen3 = tts is not None and is_qwen3_tts(tts)
    if qwen3 and tts_voice is not None:
        speakers = TTSConfig.from_dict(read_config(tts)).speakers
        if tts_voice.lower() not in speakers:
            raise typer.BadParameter(f"--tts-voice {tts_voice!r}: this checkpoint has {sorted(speakers)}")
    try:
        path = write_manifest(
            out,
            asr=asr_path(asr or DEFAULT_ASR).resolve(),
            llm=pick(llm, weights.SMOLLM2_135M),
            tts=pick(tts, weights.PIPER_JOE),
            tts_config=None if tts else weights.locate(weights.PIPER_JOE_CONFIG),
            tts_voice=voice if family else None,
        )
        m = load_manifest(path)  # checks that every part exists
    except CheckpointError as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(json.dumps({"manifest": str(path), "asr": str(m.asr), "llm": str(m.llm), "tts": str(m.tts)}))


@models.command()
def speak(
    model: Path = typer.Option(..., "--model", help="Qwen3-TTS checkpoint directory (12 Hz, any variant)."),
    text: str = typer.Option(..., "--text", help="What to say."),
    output: Path = typer.Option(Path("speech.wav"), "--output", "-o", help="24 kHz 16-bit WAV to write."),
    voice: str | None = typer.Option(
        None, "--voice", help="CustomVoice: speaker name (talker_config.spk_id)."
    ),
    instruct: str | None = typer.Option(
        None, "--instruct", help="VoiceDesign / CustomVoice: voice instruction."
    ),
    ref_audio: Path | None = typer.Option(
        None, "--ref-audio", help="Base: reference clip to clone (x-vector)."
    ),
    ref_text: str | None = typer.Option(
        None, "--ref-text", help="Base: transcript of --ref-audio (in-context cloning with its codes)."
    ),
    language: str = typer.Option("auto", help="auto or a codec_language_id key (english, chinese, ...)."),
    greedy: bool = typer.Option(
        False, "--greedy", help="Greedy decoding (default: the reference's sampling)."
    ),
    seed: int = typer.Option(0, help="Sampling seed."),
    max_frames: int = typer.Option(2048, help="Max codec frames incl. EOS (12.5 frames = 1 s)."),
) -> None:
    """Say one utterance with a Qwen3-TTS checkpoint: the talker on our engine, the codec streamed
    (1-frame first chunk, then 25-frame chunks); prints TTFP, audio seconds and RTF."""
    import numpy as np
    import torch

    from omniduplex.models.checkpoint import CheckpointError
    from omniduplex.models.qwen3_tts import text as tts_text
    from omniduplex.models.qwen3_tts.model import SAMPLE_RATE, load_qwen3_tts
    from omniduplex.models.qwen3_tts.prompt import PromptError, build_prompt
    from omniduplex.models.tokenizer import load_tokenizer
    from omniduplex.pipeline.audio_io import AudioInputError, load_audio, write_wav
    from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine, stream_speech

    try:
        loaded = load_qwen3_tts(model)
        tok = load_tokenizer(model)
        xvector = None
        if ref_audio is not None:
            if loaded.speaker_encoder is None:
                raise PromptError(f"--ref-audio needs a Base checkpoint; {model} is {loaded.config.variant}")
            ref_wav = torch.from_numpy(load_audio(ref_audio, SAMPLE_RATE))
            xvector = loaded.speaker_encoder.embed(ref_wav)
        ref_ids = ref_codes = None
        if ref_text is not None:
            if ref_audio is None:
                raise PromptError("--ref-text needs --ref-audio")
            if loaded.codec_encoder is None:
                raise PromptError(f"{model}/speech_tokenizer has no codec encoder: in-context cloning is off")
            ref_ids, ref_codes = tts_text.ref_text_ids(tok, ref_text), loaded.codec_encoder.encode(ref_wav)
        prompt = build_prompt(
            loaded.talker,
            tts_text.text_ids(tok, text),
            language=language,
            speaker=voice,
            instruct_ids=tts_text.instruct_ids(tok, instruct) if instruct else None,
            xvector=xvector,
            ref_ids=ref_ids,
            ref_codes=ref_codes,
        )
    except (CheckpointError, PromptError, AudioInputError) as e:
        raise typer.BadParameter(str(e)) from e
    sampling = {"max_tokens": max_frames, "seed": seed}
    if greedy:
        sampling["temperature"] = 0.0
    t0 = time.perf_counter()
    ttfp, pieces = None, []
    for piece in stream_speech(Qwen3TTSEngine(loaded, max_num_seqs=1), prompt, sampling):
        ttfp = ttfp if ttfp is not None else time.perf_counter() - t0
        pieces.append(piece.numpy())
    wall = time.perf_counter() - t0
    wav = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    write_wav(output, wav, SAMPLE_RATE)
    seconds = wav.shape[0] / SAMPLE_RATE
    typer.echo(
        json.dumps(
            {
                "output": str(output),
                "audio_seconds": round(seconds, 3),
                "ttfp_ms": round(1000 * ttfp, 1) if ttfp is not None else None,
                "rtf": round(wall / seconds, 3) if seconds else None,
            }
        )
    )
