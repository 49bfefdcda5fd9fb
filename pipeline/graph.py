"""How each stage's worker is built from a checkpoint (routing lives in :mod:`.topology`).

Used both in-process and by the stage processes, so the wiring is defined once.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omniduplex.models.checkpoint import iter_tensors, weight_files
from omniduplex.models.code2wav_stream import Code2WavStream
from omniduplex.models.dac_stream import DacDecodeStream
from omniduplex.models.registry import load_model
from omniduplex.models.talker_prompt import TalkerTextEmbeds

from .config import PipelineConfig, StageConfig
from .connector import ChunkingConfig
from .stages.codec_encoder import CodecEncoderWorker
from .stages.encoder import EncoderWorker
from .stages.talker import TalkerWorker
from .stages.thinker import ThinkerWorker
from .stages.unified import UnifiedWorker
from .stages.vocoder import VocoderWorker
from .topology import topology_for

PARTS = {
    "encoder": ("audio_tower",),
    "thinker": ("thinker",),
    "talker": ("talker",),
    "code2wav": ("code2wav",),
    "codec_encoder": ("codec_encoder",),
    "unified": ("unified",),
    "codec": ("codec",),
}


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_worker(stage: str, model_dir: str | Path, cfg: StageConfig, chunking: ChunkingConfig):
    """Load the parts of the checkpoint ``stage`` runs and wrap them in its worker."""
    model = load_model(model_dir, parts=PARTS[stage], dtype=_dtype(cfg.dtype), device=cfg.device)
    if stage == "codec_encoder":
        return CodecEncoderWorker(model, max_batch=cfg.max_num_seqs)
    if stage == "unified":
        return UnifiedWorker(model, cfg.num_kv_blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens)
    if stage == "codec":
        return VocoderWorker(lambda: DacDecodeStream(model.codec), chunking)
    if stage == "encoder":
        return EncoderWorker(model, max_batch=cfg.max_num_seqs)
    if stage == "thinker":
        return ThinkerWorker(model, cfg.num_kv_blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens)
    if stage == "talker":
        return TalkerWorker(
            model,
            talker_specials(model, model_dir),
            cfg.num_kv_blocks,
            cfg.max_num_seqs,
            cfg.max_num_batched_tokens,
        )
    return VocoderWorker(lambda: Code2WavStream(model.code2wav), chunking)


@torch.no_grad()
def talker_specials(model, model_dir) -> TalkerTextEmbeds:
    """Projected ``tts_bos/eos/pad`` rows, reading just those three rows of the Thinker's embedding table."""
    cfg, files = model.config, weight_files(model_dir)
    name = "thinker.model.embed_tokens.weight"
    ((_, table),) = iter_tensors(files, [name])
    ids = [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
    rows = table[ids].to(model.talker.codec_head.weight.dtype)
    bos, eos, pad = model.talker.text_projection(rows).unbind(0)
    return TalkerTextEmbeds(bos, eos, pad)


def build_all(pcfg: PipelineConfig) -> dict[str, object]:
    """Every worker of the checkpoint's graph (:func:`.topology.topology_for`), in-process."""
    return {
        s: build_worker(s, pcfg.model, pcfg.stage(s), pcfg.chunking) for s in topology_for(pcfg.model).stages
    }
