"""How each stage's worker is built from a checkpoint (routing lives in :mod:`.topology`).

Used both in-process and by the stage processes, so the wiring is defined once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omniduplex.kernels.cpu_linear import prepack_linears, warm_up
from omniduplex.kernels.int8_linear import choose_weights, quantize_linears
from omniduplex.models.cascade.manifest import is_cascade, load_manifest, resolve_llm
from omniduplex.models.checkpoint import iter_tensors, weight_files
from omniduplex.models.codecs.dac_stream import DacDecodeStream
from omniduplex.models.forward_batch import BLOCK_SIZE
from omniduplex.models.qwen3_omni.code2wav_batch import push_together, stack_key
from omniduplex.models.qwen3_omni.code2wav_stream import Code2WavStream
from omniduplex.models.qwen3_omni.talker_prompt import TalkerTextEmbeds
from omniduplex.models.registry import load_model
from omniduplex.models.weights import WHISPER_TINY_EN, cache_dir, locate
from omniduplex.pipeline.config import ChunkingConfig, PipelineConfig, StageConfig
from omniduplex.pipeline.runtime.stage_engines import check_backends
from omniduplex.pipeline.stages.codec_encoder import CodecEncoderWorker
from omniduplex.pipeline.stages.contract import StageWorker
from omniduplex.pipeline.stages.encoder import EncoderWorker
from omniduplex.pipeline.stages.engine_build import EngineSettings
from omniduplex.pipeline.stages.kinds import STAGE_KINDS, builds
from omniduplex.pipeline.stages.talker import TalkerWorker
from omniduplex.pipeline.stages.thinker import ThinkerWorker
from omniduplex.pipeline.stages.unified import UnifiedWorker
from omniduplex.pipeline.stages.vocoder import VocoderWorker
from omniduplex.pipeline.topology import CASCADE_OUTPUT_RATE


def _dtype(cfg: StageConfig) -> torch.dtype:
    """The stage's parameter dtype: ``auto`` is bf16 on an accelerator, :func:`auto_dtype` on the CPU."""
    if cfg.dtype == "auto":
        return auto_dtype() if torch.device(cfg.device).type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.dtype]


def auto_dtype(cpuinfo: str | None = None) -> torch.dtype:
    """bf16 on a CPU with native bf16 matrix units (AMX or AVX512-BF16 in ``/proc/cpuinfo`` flags), else fp32
    (where bf16 GEMMs are emulated and run slower than fp32)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    return torch.bfloat16 if flags & {"amx_bf16", "avx512_bf16"} else torch.float32


"""Stages whose decoder runs on our engine (besides the cascade's ``llm``)."""

WARM_UP_ROWS = 256
"""Most GEMM rows whose oneDNN kernels are built at start-up (decode batches and short prefill chunks);
longer prefills build theirs on first use (:mod:`omniduplex.kernels.cpu_linear`)."""


def _prepack(model: torch.nn.Module, cfg: StageConfig) -> None:
    """bf16 on a CPU with native bf16: pack the linear weights for oneDNN once and build the GEMM kernels
    of small batches now rather than during the first turns (no-op otherwise)."""
    if prepack_linears(model):
        warm_up(model, min(WARM_UP_ROWS, cfg.max_num_batched_tokens))


def code2wav_graphs(model, cfg: StageConfig, chunking: ChunkingConfig):
    """The Code2Wav stage's CUDA graphs of pushes of ``initial_codec_chunk_frames`` and ``codec_chunk_frames``
    frames, of 1 … ``max_num_seqs`` turns at once (batch buckets), on a CUDA device with ``cuda_graphs`` on;
    else ``None`` (eager pushes)."""
    from omniduplex.pipeline.engine.graph_runner import make_backend
    from omniduplex.pipeline.stages.code2wav_graphs import Code2WavGraphs

    backend = make_backend("auto" if cfg.cuda_graphs else "off", model.code_embedding.weight.device)
    if backend is None:
        return None
    sizes = [chunking.initial_codec_chunk_frames, chunking.codec_chunk_frames]
    return Code2WavGraphs(model, backend, sizes, max_batch=cfg.max_num_seqs)


@dataclass(frozen=True)
class StageBuild:
    """What a stage's builder gets: the checkpoint (or cascade manifest) directory, the stage's settings, the
    graph's chunking, and the side ASR's Whisper directory (``"packaged"``: the packaged tiny.en)."""

    model_dir: Path
    cfg: StageConfig
    chunking: ChunkingConfig
    side_asr: str | None = None

    def load(self, stage: str):
        """The checkpoint's parts of ``stage`` (its :class:`~.stages.kinds.StageKind` ``parts``), in the
        stage's dtype on its device; the decoders of engine stages prepacked (:func:`_prepack`)."""
        kind = STAGE_KINDS[stage]
        model = load_model(self.model_dir, parts=kind.parts, dtype=_dtype(self.cfg), device=self.cfg.device)
        if kind.engine:
            _prepack(getattr(model, stage), self.cfg)
        return model


def _engine_settings(cfg: StageConfig) -> EngineSettings:
    """The engine settings of an engine stage's worker, from the stage's config."""
    return EngineSettings(
        num_blocks=cfg.num_kv_blocks,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enable_prefix_caching=cfg.enable_prefix_caching,
        cuda_graphs=cfg.cuda_graphs,
    )


def _register_one_part(stage: str, worker: Callable[..., StageWorker], engine: bool) -> None:
    """The builder of a stage whose worker takes the stage's loaded parts alone: with the engine settings
    (``engine``, :func:`_engine_settings`) or batching ``max_num_seqs`` requests per step."""

    def build(b: StageBuild) -> StageWorker:
        extra = dict(engine=_engine_settings(b.cfg)) if engine else dict(max_batch=b.cfg.max_num_seqs)
        return worker(b.load(stage), **extra)

    builds(stage)(build)


for _stage, _worker, _engine in (
    ("encoder", EncoderWorker, False),
    ("codec_encoder", CodecEncoderWorker, False),
    ("thinker", ThinkerWorker, True),
    ("unified", UnifiedWorker, True),
):
    _register_one_part(_stage, _worker, _engine)


@builds("talker")
def _talker(b: StageBuild) -> StageWorker:
    model = b.load("talker")
    return TalkerWorker(model, talker_specials(model, b.model_dir), **asdict(_engine_settings(b.cfg)))


@builds("code2wav")
def _code2wav(b: StageBuild) -> StageWorker:
    model = b.load("code2wav")
    graphs = code2wav_graphs(model.code2wav, b.cfg, b.chunking)
    return VocoderWorker(
        lambda: Code2WavStream(model.code2wav), b.chunking, graphs,
        push_batch=push_together, batch_key=stack_key, max_batch=b.cfg.max_num_seqs,
    )


@builds("codec")
def _codec(b: StageBuild) -> StageWorker:
    model = b.load("codec")
    return VocoderWorker(lambda: DacDecodeStream(model.codec), b.chunking)


@builds("asr")
def _asr(b: StageBuild) -> StageWorker:
    """The cascade's ASR, or the side ASR of a speech-LM graph (``model_dir`` is then not a cascade)."""
    if is_cascade(b.model_dir):
        return _asr_worker(load_manifest(b.model_dir).asr, b.cfg)
    return _asr_worker(_side_asr_dir(b.side_asr), b.cfg)


TTS_TALKER_PARTS = ("talker", "speaker_encoder", "codec_encoder")
"""Qwen3-TTS parts the talker stage loads: the talker, and what voice cloning needs (Base checkpoints)."""


@builds("tts_talker")
def _tts_talker(b: StageBuild) -> StageWorker:
    """The Qwen3-TTS graph's talker (+ code predictor) on our engine."""
    from omniduplex.models.qwen3_tts.model import load_qwen3_tts
    from omniduplex.pipeline.stages.qwen3_tts_talker import Qwen3TTSTalkerWorker

    model = load_qwen3_tts(b.model_dir, parts=TTS_TALKER_PARTS, dtype=_dtype(b.cfg), device=b.cfg.device)
    return Qwen3TTSTalkerWorker(*_qwen3_tts_engine(model, b.model_dir, b.cfg))


@builds("tts_codec")
def _tts_codec(b: StageBuild) -> StageWorker:
    """The Qwen3-TTS graph's streamed, batched codec decoder (``max_num_seqs`` utterances per decode call)."""
    from omniduplex.models.qwen3_tts.model import load_qwen3_tts
    from omniduplex.pipeline.stages.qwen3_tts_codec import Qwen3TTSCodecWorker

    model = load_qwen3_tts(b.model_dir, parts=("codec",), dtype=_dtype(b.cfg), device=b.cfg.device)
    chunking = b.chunking
    return Qwen3TTSCodecWorker(
        model.codec, chunking.tts_first_chunk_frames, chunking.tts_chunk_frames, b.cfg.max_num_seqs
    )


def _qwen3_tts_engine(model, model_dir, cfg: StageConfig):
    """``(Qwen3TTSEngine, VoicePrompter)`` of a loaded Qwen3-TTS ``model`` with the stage's engine settings;
    the prompter's context is what the model's positions and the stage's KV blocks both hold."""
    from omniduplex.models.qwen3_tts.voice import VoicePrompter
    from omniduplex.models.tokenizer import load_tokenizer
    from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine

    tts = Qwen3TTSEngine(model, _engine_settings(cfg))
    context = min(model.config.talker.max_position_embeddings, cfg.num_kv_blocks * BLOCK_SIZE)
    return tts, VoicePrompter(model, load_tokenizer(model_dir), context)


def _qwen3_tts_worker(manifest, cfg: StageConfig, chunking: ChunkingConfig):
    """The cascade's TTS stage on a Qwen3-TTS checkpoint, speaking in the manifest's voice (checked here: a
    bad voice fails the stage's start with the reason)."""
    from omniduplex.models.qwen3_tts.model import load_qwen3_tts
    from omniduplex.models.qwen3_tts.voice import read_ref_audio
    from omniduplex.pipeline.stages.qwen3_tts_stage import Qwen3TTSStageWorker

    model = load_qwen3_tts(manifest.tts, device=cfg.device)
    tts, prompter = _qwen3_tts_engine(model, manifest.tts, cfg)
    name = manifest.tts_voice
    if name is None and model.config.variant == "custom_voice":
        name = prompter.voices[0]
    ref = read_ref_audio(manifest.tts_ref_audio.read_bytes()) if manifest.tts_ref_audio else None
    voice = prompter.voice(name, manifest.tts_instructions, "auto", ref, manifest.tts_ref_text)
    return Qwen3TTSStageWorker(
        tts,
        prompter,
        voice,
        CASCADE_OUTPUT_RATE,
        max_frames=manifest.tts_max_frames,
        chunks=(chunking.tts_first_chunk_frames, chunking.tts_chunk_frames),
    )


def _family_tts_worker(manifest, cfg: StageConfig) -> StageWorker:
    """The cascade's TTS stage on any other registered family's checkpoint (VoxCPM2, Higgs, Fish Speech,
    plugins'; its family from ``config.json``), speaking in the manifest's voice (checked here: a bad voice
    or clip fails the stage's start with the reason)."""
    import soundfile as sf

    from omniduplex.pipeline.speech.registry import load_runner
    from omniduplex.pipeline.stages.runner_tts import RunnerTTSStageWorker

    runner = load_runner(manifest.tts, max_num_seqs=cfg.max_num_seqs, num_blocks=cfg.num_kv_blocks)
    voice = manifest.tts_voice
    if manifest.tts_ref_audio is not None:
        wav, rate = sf.read(manifest.tts_ref_audio, dtype="float32", always_2d=True)
        voice = (wav.mean(axis=1), int(rate), manifest.tts_ref_text)
    return RunnerTTSStageWorker(runner, voice, CASCADE_OUTPUT_RATE, max_frames=manifest.tts_max_frames)


def _tts_worker(manifest, cfg: StageConfig, chunking: ChunkingConfig) -> StageWorker:
    """The cascade's TTS: Qwen3-TTS on our engine when the manifest names a Qwen3-TTS checkpoint, VoxCPM2,
    Higgs or Fish Speech on theirs (:func:`_family_tts_worker`), else Piper on ``cfg.torch_threads``
    threads."""
    if manifest.tts_is_qwen3:
        return _qwen3_tts_worker(manifest, cfg, chunking)
    if manifest.tts_is_checkpoint:
        return _family_tts_worker(manifest, cfg)
    from omniduplex.models.cascade.tts import PiperTTS
    from omniduplex.pipeline.stages.tts import TTSWorker

    # a 4-word first clause: the first audio waits for ~5 LLM tokens instead of ~8 (TTFP)
    tts = PiperTTS(manifest.tts, manifest.tts_config, threads=cfg.torch_threads)
    return TTSWorker(tts, CASCADE_OUTPUT_RATE, first_max_words=4)


def _llm_worker(manifest, cfg: StageConfig) -> StageWorker:
    """The cascade's LLM: our engine; vLLM with ``backend: vllm`` (its CPU backend binds its own OpenMP
    threads); an OpenAI-compatible server with ``backend: openai``."""
    if cfg.backend == "openai":  # an OpenAI-compatible server is the brain: no local LLM to load
        from omniduplex.pipeline.stages.openai_llm import OpenAILLMWorker

        return OpenAILLMWorker(cfg)
    llm_dir = resolve_llm(manifest, cache_dir())
    if cfg.backend == "vllm":
        from omniduplex.pipeline.stages.vllm_llm import VLLMLLMWorker

        return VLLMLLMWorker(llm_dir, cfg, _dtype(cfg))
    from omniduplex.pipeline.stages.llm import LLMWorker

    spec, draft = None, None
    if manifest.llm_speculative is not None:  # speculative decoding (pipeline/stages/llm_speculative.py)
        from omniduplex.pipeline.engine.speculative import SpeculativeConfig
        from omniduplex.pipeline.stages.llm_speculative import load_draft

        spec = SpeculativeConfig.parse(manifest.llm_speculative, f"{manifest.path}: llm_speculative")
        if spec.draft is not None:
            draft = load_draft(spec.draft, _dtype(cfg), cfg.device, cache_dir())
            _prepack(draft.thinker, cfg)
    weights = choose_weights() if manifest.llm_weights == "auto" else manifest.llm_weights  # or "float"
    dtype = torch.bfloat16 if weights == "bf16" else _dtype(cfg)
    if manifest.llm_quantized:  # GGUF blocks on our C++ kernels, no float copy (cascade/gguf_quantized.py)
        from omniduplex.models.cascade.gguf_quantized import load_quantized

        model = load_quantized(llm_dir, manifest.llm, dtype)
    else:
        model = load_model(llm_dir, parts=("thinker",), dtype=dtype, device=cfg.device)
    if weights == "int8":  # per-channel int8 on aten's weight-only kernel (kernels/int8_linear.py)
        quantize_linears(model.thinker)
    _prepack(model.thinker, cfg)
    return LLMWorker(
        model,
        _engine_settings(cfg),
        max_tool_calls=cfg.max_tool_calls,
        call_threshold=cfg.call_threshold,
        speculative=spec,
        draft=draft,
    )


def _asr_worker(model_dir: Path, cfg: StageConfig):
    from omniduplex.models.cascade.asr import load_asr
    from omniduplex.pipeline.stages.asr import ASRWorker

    return ASRWorker(load_asr(model_dir, cpu_threads=cfg.torch_threads), max_batch=cfg.max_num_seqs)


def _side_asr_dir(side_asr: str | None) -> Path:
    if side_asr in (None, "packaged"):
        return locate(WHISPER_TINY_EN).parent
    return Path(side_asr)


@builds("llm")
def _llm(b: StageBuild) -> StageWorker:
    return _llm_worker(load_manifest(b.model_dir), b.cfg)


@builds("tts")
def _tts(b: StageBuild) -> StageWorker:
    return _tts_worker(load_manifest(b.model_dir), b.cfg, b.chunking)


def build_worker(
    stage: str, model_dir: str | Path, cfg: StageConfig, chunking: ChunkingConfig, side_asr: str | None = None
) -> StageWorker:
    """Load the parts of the checkpoint (or cascade manifest) ``stage`` runs and wrap them in its worker
    (its :class:`~.stages.kinds.StageKind`'s builder).

    ``side_asr``: the Whisper directory of the side ASR stage of a speech-LM graph (``"packaged"`` = the
    packaged tiny.en), used when ``stage`` is ``asr`` and ``model_dir`` is not a cascade.

    Raises:
        ValueError: ``stage`` is no stage kind of any graph.
    """
    kind = STAGE_KINDS.get(stage)
    if kind is None or kind.build is None:
        raise ValueError(f"no stage kind {stage!r} (known: {', '.join(STAGE_KINDS)})")
    return kind.build(StageBuild(Path(model_dir), cfg, chunking, side_asr))


def prepare(pcfg: PipelineConfig) -> None:
    """Work to do once in the parent before stage processes start: a cascade's GGUF LLM is imported
    (and a Moonshine ASR converted) into the cache here, so the stages (and their restarts) only read the
    result.

    A stage on ``backend: vllm`` is checked here too, so a missing vLLM stops the start before any stage
    process is spawned.

    Raises:
        CheckpointError / WeightsError: a part that cannot be loaded, named in one line.
        VLLMUnavailableError: a stage of the graph asks for vLLM and it is not installed (names the fix).
    """
    check_backends(pcfg, pcfg.topology().all_stages)
    if is_cascade(pcfg.model):
        manifest = load_manifest(pcfg.model)
        if pcfg.stage("llm").backend != "openai":
            resolve_llm(manifest, cache_dir())
        from omniduplex.models.cascade.moonshine_files import converted_dir, is_moonshine_dir

        if is_moonshine_dir(manifest.asr):  # one-time int8 -> fp32 conversion, before the stage starts
            converted_dir(manifest.asr, cache_dir())


@torch.no_grad()
def talker_specials(model, model_dir) -> TalkerTextEmbeds:
    """Projected ``tts_bos/eos/pad`` rows, reading just those three rows of the Thinker's embedding table."""
    cfg, files = model.config, weight_files(model_dir)
    name = "thinker.model.embed_tokens.weight"
    ((_, table),) = iter_tensors(files, [name])
    ids = [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
    weight = model.talker.codec_head.weight
    rows = table[ids].to(device=weight.device, dtype=weight.dtype)
    bos, eos, pad = model.talker.text_projection(rows).unbind(0)
    return TalkerTextEmbeds(bos, eos, pad)


def build_all(pcfg: PipelineConfig) -> dict[str, StageWorker]:
    """Every worker of the graph (:meth:`.config.PipelineConfig.topology`), in-process."""
    prepare(pcfg)
    return {
        s: build_worker(s, pcfg.model, pcfg.stage(s), pcfg.chunking, pcfg.side_asr)
        for s in pcfg.topology().all_stages
    }
