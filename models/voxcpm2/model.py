"""VoxCPM2's networks and loading a checkpoint in the published layout, by tensor name.

Layout (openbmb/VoxCPM2): ``config.json`` (``architecture: "voxcpm2"``), ``model.safetensors`` (``base_lm.*``,
``residual_lm.*``, ``feat_encoder.*``, ``feat_decoder.estimator.*``, ``fsq_layer.*``, ``enc_to_lm_proj``,
``lm_to_dit_proj``, ``res_to_dit_proj``, ``fusion_concat_proj``, ``stop_proj``, ``stop_head``), the AudioVAE
in ``audiovae.safetensors`` (or ``audiovae.pth``, read with ``weights_only``), and ``tokenizer.json``.

One generation step of a request (``VoxCPM2Model._inference`` of ``voxcpm`` 2.0.3):

1. the base LM (MiniCPM4) reads the previous patch's embedding; its output, through the FSQ bottleneck
   (``tanh`` → round to ``1/scale`` steps), is ``lm_hidden``;
2. the residual LM reads ``fusion_concat_proj([lm_hidden, patch embedding])``: ``res_hidden``;
3. the LocDiT, conditioned on ``[lm_to_dit_proj(lm_hidden), res_to_dit_proj(res_hidden)]`` and on the previous
   patch, turns noise into the next patch of ``patch_size`` latent frames (:mod:`.cfm`);
4. the stop head on ``lm_hidden`` decides whether this was the last patch; the LocEnc embeds the patch
   (``enc_to_lm_proj``) as the next input.

Prompt rows are text ids (``embed_tokens`` × ``scale_emb``) or audio patches (LocEnc embeddings); on audio
rows the base LM's output goes through the FSQ and the residual LM sees the patch embedding, on text rows
neither.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from omniduplex.models.checkpoint import (
    CheckpointError,
    LoadedParts,
    config_value,
    load_state_dict_into,
    read_config,
    weight_files,
)
from omniduplex.models.codecs.dac import copy_codec_tensors, fold_weight_norm
from omniduplex.models.config import ConfigError
from omniduplex.models.voxcpm2.audio_vae import AudioVAE
from omniduplex.models.voxcpm2.config import ARCHITECTURE, VoxCPM2Config
from omniduplex.models.voxcpm2.local import LocDiT, LocEnc
from omniduplex.models.voxcpm2.minicpm import MiniCPMStack

PARTS = ("lm", "vae")
VAE_FILES = ("audiovae.safetensors", "audiovae.pth")


class FSQ(nn.Module):
    """Finite scalar quantisation (Mentzer et al. 2023): ``out_proj(round(tanh(in_proj(h)) · s) / s)``."""

    def __init__(self, hidden: int, latent: int, scale: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(hidden, latent)
        self.out_proj = nn.Linear(latent, hidden)
        self.scale = scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.round(torch.tanh(self.in_proj(h)) * self.scale) / self.scale)


class FeatDecoder(nn.Module):
    """Holder of the LocDiT under the published prefix ``feat_decoder.estimator``."""

    def __init__(self, estimator: LocDiT) -> None:
        super().__init__()
        self.estimator = estimator


class VoxCPM2Model(nn.Module):
    """Every network of ``model.safetensors`` (the AudioVAE is separate: :class:`.audio_vae.AudioVAE`)."""

    def __init__(self, cfg: VoxCPM2Config) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        hd = cfg.dit.decoder.hidden_size
        self.base_lm = MiniCPMStack(cfg.lm, embed=True)
        self.residual_lm = MiniCPMStack(cfg.residual)
        self.feat_encoder = LocEnc(cfg.encoder, cfg.feat_dim)
        self.feat_decoder = FeatDecoder(LocDiT(cfg.dit, cfg.feat_dim))
        self.fsq_layer = FSQ(h, cfg.fsq_latent_dim, cfg.fsq_scale)
        self.enc_to_lm_proj = nn.Linear(cfg.encoder.decoder.hidden_size, h)
        self.lm_to_dit_proj = nn.Linear(h, hd)
        self.res_to_dit_proj = nn.Linear(h, hd)
        self.fusion_concat_proj = nn.Linear(2 * h, h)
        self.stop_proj = nn.Linear(h, h)
        self.stop_head = nn.Linear(h, 2, bias=False)

    @property
    def estimator(self) -> LocDiT:
        return self.feat_decoder.estimator

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text ids int64 ``[n]`` → base-LM input rows ``[n, H]`` (``embed_tokens`` × ``scale_emb``)."""
        e = self.base_lm.embed_tokens(ids)
        return e * self.cfg.scale_emb if self.cfg.scale_emb != 1.0 else e

    def patch_embed(self, patches: torch.Tensor) -> torch.Tensor:
        """Latent patches ``[n, P, D]`` → base-LM input rows ``[n, H]`` (LocEnc, ``enc_to_lm_proj``)."""
        return self.enc_to_lm_proj(self.feat_encoder(patches[None]))[0]

    def stop(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` → bool ``[B]``: the stop head's argmax is 1 (this patch is the last)."""
        return self.stop_head(nn.functional.silu(self.stop_proj(lm_hidden))).argmax(dim=-1) == 1

    def dit_condition(self, lm_hidden: torch.Tensor, res_hidden: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` twice → the LocDiT's ``mu`` ``[B, 2·Hd]``."""
        return torch.cat((self.lm_to_dit_proj(lm_hidden), self.res_to_dit_proj(res_hidden)), dim=-1)


@dataclass
class VoxCPM2(LoadedParts, parts=PARTS):
    """The loaded parts of one checkpoint (``lm``: :class:`VoxCPM2Model`; ``vae``: :class:`AudioVAE`)."""

    path: Path
    config: VoxCPM2Config
    raw_config: dict
    lm: VoxCPM2Model | None = None
    vae: AudioVAE | None = None

    @property
    def sample_rate(self) -> int:
        """Output rate (Hz) of the decoder (48 kHz published)."""
        return self.config.vae.out_sample_rate


def is_voxcpm2(model_dir: str | Path) -> bool:
    """Whether ``model_dir/config.json`` names ``architecture: voxcpm2`` (False when unreadable)."""
    return config_value(model_dir, "architecture") == ARCHITECTURE


def vae_weight_file(model_dir: Path) -> Path:
    """The AudioVAE weights of a checkpoint. Raises CheckpointError when there are none."""
    for name in VAE_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise CheckpointError(f"no AudioVAE weights in {model_dir} (expected one of {list(VAE_FILES)})")


def _vae_tensors(path: Path) -> dict[str, torch.Tensor]:
    """AudioVAE tensors by name with weight-norm pairs (``weight_g``, ``weight_v``) folded
    (:func:`~omniduplex.models.codecs.dac.fold_weight_norm`). Raises CheckpointError."""
    try:
        if path.suffix == ".safetensors":
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state) if isinstance(state, dict) else state
    except Exception as e:  # safetensors, pickle and zip errors come in many types
        raise CheckpointError(f"{path.name}: unreadable ({e})") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path.name}: not a state dict (got {type(state).__name__})")
    return fold_weight_norm(state, f"{path.name}: ")


def load_voxcpm2(
    model_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> VoxCPM2:
    """Build and load the requested parts (``"lm"``: every network of ``model.safetensors``; ``"vae"``: the
    AudioVAE, kept in fp32 whatever ``dtype``, as the reference keeps it).

    Raises:
        CheckpointError: not a VoxCPM2 checkpoint, a config our modules do not support, unreadable files, or
            missing / mis-shaped / unexpected tensors (the message names the first one).
    """
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    raw = read_config(model_dir)
    if raw.get("architecture") != ARCHITECTURE:
        raise CheckpointError(
            f"{model_dir}/config.json: architecture {raw.get('architecture')!r} is not voxcpm2"
        )
    try:
        cfg = VoxCPM2Config.from_dict(raw)
    except ConfigError as e:
        raise CheckpointError(f"{model_dir}: {e}") from e
    out = VoxCPM2(model_dir, cfg, raw, parts=parts)
    if "lm" in parts:
        out.lm = VoxCPM2Model(cfg)
        files = {n: f for n, f in weight_files(model_dir).items() if f.name not in VAE_FILES}
        load_state_dict_into(out.lm, files)
        out.lm.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if "vae" in parts:
        out.vae = AudioVAE(cfg.vae)
        path = vae_weight_file(model_dir)
        copy_codec_tensors(out.vae, _vae_tensors(path), "", "AudioVAE", "audio_vae_config", f"{path.name}: ")
        out.vae.to(device=device, dtype=torch.float32).eval().requires_grad_(False)
    out.load_seconds = time.perf_counter() - t0
    return out
