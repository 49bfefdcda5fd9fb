"""Moshi checkpoints in Kyutai's published folder layout (``kyutai/moshiko-pytorch-bf16``): ``config.json``
(the LM's ``lm_kwargs`` plus ``moshi_name`` / ``mimi_name``), the LM's ``model.safetensors`` and Mimi's
``tokenizer-e351c8d8-checkpoint125.safetensors``, tensors named as published (attention projections as
``self_attn.in_proj_weight`` ``[steps·3D, D]`` / ``self_attn.out_proj.weight``). Random presets add
``mimi_config`` (the published folder implies the default Mimi). Loading also accepts the ``moshi`` package's
own module names (``in_projs.{i}.weight``, one block per depth step).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from omniduplex.models.moshi.config import FRAME_SAMPLES, lm_config, mimi_config
from omniduplex.models.moshi.lm import MoshiLM
from omniduplex.models.moshi.mimi import Mimi

MOSHI_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
ARCHITECTURE = "moshi"


def published_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s tensors under their published names (``in_proj.weight`` → ``in_proj_weight``)."""
    return {
        re.sub(r"self_attn\.in_proj\.weight$", "self_attn.in_proj_weight", k): v.contiguous()
        for k, v in module.state_dict().items()
    }


def to_module_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Published or ``moshi``-package names → ours. ``in_projs.{i}.weight`` blocks are stacked in step
    order."""
    out: dict[str, torch.Tensor] = {}
    split: dict[str, dict[int, torch.Tensor]] = {}
    for k, v in state.items():
        m = re.match(r"(.*self_attn\.)(in|out)_projs\.(\d+)\.weight$", k)
        if m:
            split.setdefault(f"{m.group(1)}{m.group(2)}_proj.weight", {})[int(m.group(3))] = v
        else:
            out[re.sub(r"self_attn\.in_proj_weight$", "self_attn.in_proj.weight", k)] = v
    for k, parts in split.items():
        out[k] = torch.cat([parts[i] for i in sorted(parts)], 0)
    return out


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Load ``state`` (any accepted naming) strictly. Raises ValueError naming missing / unexpected
    tensors."""
    state = to_module_names(state)
    own = module.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise ValueError(f"{what}: missing tensors {missing[:5]}, unexpected {extra[:5]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ValueError(f"{what}: tensor {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def random_models(
    preset: str, seed: int, device: str | torch.device = "cpu", lm_dtype: torch.dtype = torch.float32
) -> tuple[MoshiLM, Mimi]:
    """A preset's LM and Mimi with random weights drawn from ``torch.manual_seed(seed)``.

    LM: PyTorch's default inits, embeddings N(0, 1/dim). Mimi: convolutions He-normal (N(0, 2/fan_in)), zero
    biases, so the latent depends on the input (PyTorch's default shrinks it into the biases); codebook
    centroids N(0, s²) with ``s`` the spread of a calibration signal's projected latent (seeded noise at three
    levels and silence), shrinking 0.75× per residual level, so different audio gets different codes; the
    decoder's output conv scaled so that decoded speech has an RMS of about 0.1 (neither silent nor clipped).
    The LM is built directly on ``device`` in ``lm_dtype`` (the 7B preset in bf16 on a GPU); Mimi in fp32.
    """
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(lm_dtype)
    try:
        with torch.device(device):
            lm = MoshiLM(lm_config(preset))
    finally:
        torch.set_default_dtype(default)
    mimi = Mimi(mimi_config(preset))
    for m in lm.modules():
        if isinstance(m, torch.nn.Embedding):
            torch.nn.init.normal_(m.weight, std=m.embedding_dim**-0.5)
    for m in mimi.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)) and m.groups == 1:
            w = m.weight
            fan_in = w.shape[1] * w.shape[2] if isinstance(m, torch.nn.Conv1d) else w.shape[0] * w.shape[2]
            torch.nn.init.normal_(w, std=(2 / fan_in) ** 0.5)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
    g = torch.Generator().manual_seed(seed)
    calib = torch.cat([a * torch.randn(1, 1, 4 * FRAME_SAMPLES, generator=g) for a in (0.0, 0.05, 0.3, 0.8)])
    with torch.no_grad():
        emb = mimi.downsample(mimi.encoder_transformer(mimi.encoder(calib)))
        q = mimi.quantizer
        for rvq in (q.rvq_first, q.rvq_rest):
            spread = rvq.input_proj(emb).std().item()
            for k, layer in enumerate(rvq.vq.layers):
                layer._codebook.embedding_sum.normal_(std=spread * 0.75**k, generator=g)
        last = mimi.decoder.model[-1].conv.conv
        rms = mimi.decode(mimi.encode(calib)).pow(2).mean().sqrt().item()
        last.weight.mul_(0.1 / max(rms, 1e-6))
    return lm.eval(), mimi.to(device).eval()


def write_moshi_checkpoint(out: str | Path, preset: str, seed: int = 0) -> Path:
    """Write a random preset to ``out`` (``7b`` in bf16, others fp32). Raises ValueError for an
    unknown preset."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lm, mimi = random_models(preset, seed)
    dtype = torch.bfloat16 if preset == "7b" else torch.float32
    save_file({k: v.to(dtype) for k, v in published_state(lm).items()}, str(out / MOSHI_NAME))
    save_file(published_state(mimi), str(out / MIMI_NAME))
    cfg = dict(
        lm_config(preset),
        moshi_name=MOSHI_NAME,
        mimi_name=MIMI_NAME,
        model_type="moshi",
        architecture=ARCHITECTURE,
        preset=preset,
        mimi_config=mimi_config(preset),
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


@dataclass
class MoshiModels:
    """A loaded Moshi folder: the LM, Mimi and the config (``lm_kwargs`` keys)."""

    lm: MoshiLM
    mimi: Mimi
    config: dict
    load_seconds: float = 0.0
    voices: dict = field(default_factory=dict)

    def num_parameters(self) -> dict[str, int]:
        return {
            "lm": sum(p.numel() for p in self.lm.parameters()),
            "mimi": sum(p.numel() for p in self.mimi.parameters()),
        }


LM_KEYS = (
    "dim",
    "text_card",
    "existing_text_padding_id",
    "n_q",
    "dep_q",
    "card",
    "num_heads",
    "num_layers",
    "hidden_scale",
    "causal",
    "layer_scale",
    "context",
    "max_period",
    "gating",
    "norm",
    "positional_embedding",
    "depformer_dim",
    "depformer_dim_feedforward",
    "depformer_num_heads",
    "depformer_num_layers",
    "depformer_layer_scale",
    "depformer_multi_linear",
    "depformer_context",
    "depformer_max_period",
    "depformer_gating",
    "depformer_pos_emb",
    "depformer_weights_per_step",
    "delays",
)


def load_moshi(folder: str | Path, dtype: torch.dtype = torch.float32) -> MoshiModels:
    """Load a folder written by :func:`write_moshi_checkpoint` or published by Kyutai (with the default Mimi).

    Raises:
        ValueError: no ``config.json``, or tensors that do not match the config.
    """
    folder = Path(folder)
    t0 = time.perf_counter()
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json in {folder}")
    raw = json.loads(path.read_text())
    cfg = {k: raw[k] for k in LM_KEYS if k in raw}
    base = lm_config("7b")
    cfg = {**base, **cfg}
    mcfg = raw.get("mimi_config") or mimi_config("7b")
    lm, mimi = MoshiLM(cfg).to(dtype), Mimi(mcfg)
    load_into(lm, load_file(str(folder / raw.get("moshi_name", MOSHI_NAME))), "moshi LM")
    load_into(mimi, load_file(str(folder / raw.get("mimi_name", MIMI_NAME))), "mimi")
    return MoshiModels(lm.eval(), mimi.eval(), raw, time.perf_counter() - t0)
