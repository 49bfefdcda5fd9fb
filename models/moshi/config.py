"""Moshi / Mimi configurations in the ``moshi`` package's keyword layout (``moshi/models/loaders.py``:
``_seanet_kwargs``, ``_quantizer_kwargs``, ``_transformer_kwargs``, ``_lm_kwargs``), and the random presets.

Constants of the published model (Moshi paper, arXiv 2410.00037, §3.3 and Table 1; ``loaders.py``): 24 kHz
mono,
SEANet ratios ``[8, 6, 5, 4]`` (hop 960 → 25 Hz) then a learnt stride-2 conv to 12.5 Hz, so one frame is
1920 samples (80 ms); a split RVQ of 1 semantic + 31 acoustic codebooks of 2048 entries, of which Moshi
uses 8;
the LM sees 17 streams (text, 8 model audio, 8 user audio) with acoustic delays
``[0, 0, 1×7, 0, 1×7]`` (one frame of delay for codebooks 2..8, §3.4.4).
"""

from __future__ import annotations

import copy

SAMPLE_RATE = 24_000
"""Hz (Mimi's input and output rate)."""
FRAME_RATE = 12.5
"""Hz, Mimi's code rate."""
FRAME_SAMPLES = 1920
"""Samples in one 80 ms frame at 24 kHz."""
DELAYS_8 = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
"""Per-stream delays in frames: text, model audio codebooks 0..7, user audio codebooks 0..7."""


def mimi_config(preset: str) -> dict:
    """Mimi's config (``{"seanet", "quantizer", "transformer", "num_codebooks"}``) for ``tiny``, ``small`` or
    ``7b`` (the published Mimi). Raises ValueError for an unknown preset."""
    nf, dim, qdim, bins, n_q, heads, layers, ff = {
        "tiny": (4, 32, 16, 64, 8, 2, 1, 64),
        "small": (8, 64, 32, 512, 8, 4, 2, 256),
        "7b": (64, 512, 256, 2048, 32, 8, 8, 2048),
    }[_check(preset)]
    seanet = dict(
        channels=1,
        dimension=dim,
        causal=True,
        n_filters=nf,
        n_residual_layers=1,
        activation="ELU",
        compress=2,
        dilation_base=2,
        disable_norm_outer_blocks=0,
        kernel_size=7,
        residual_kernel_size=3,
        last_kernel_size=3,
        norm="none",
        pad_mode="constant",
        ratios=[8, 6, 5, 4],
        true_skip=True,
    )
    quantizer = dict(dimension=qdim, n_q=n_q, bins=bins, input_dimension=dim, output_dimension=dim)
    transformer = dict(
        d_model=dim,
        num_heads=heads,
        num_layers=layers,
        causal=True,
        layer_scale=0.01,
        context=250,
        conv_layout=True,
        max_period=10000,
        gating="none",
        norm="layer_norm",
        positional_embedding="rope",
        dim_feedforward=ff,
        input_dimension=dim,
        output_dimensions=[dim],
    )
    return dict(
        sample_rate=SAMPLE_RATE,
        channels=1,
        frame_rate=FRAME_RATE,
        seanet=seanet,
        quantizer=quantizer,
        transformer=transformer,
        num_codebooks=8,
    )


def lm_config(preset: str) -> dict:
    """The Moshi LM's ``lm_kwargs`` (``loaders._lm_kwargs`` keys) for a preset. ``tiny`` keeps a 32-frame
    context so that tests wrap the ring KV cache; ``7b`` is the published Moshi (7.7B parameters)."""
    dim, text, heads, layers, ctx, ddim, dheads, dlayers = {
        "tiny": (32, 64, 2, 2, 32, 32, 2, 1),
        "small": (256, 4000, 4, 6, 3000, 128, 4, 2),
        "7b": (4096, 32000, 32, 32, 3000, 1024, 16, 6),
    }[_check(preset)]
    card = mimi_config(preset)["quantizer"]["bins"]
    return dict(
        dim=dim,
        text_card=text,
        existing_text_padding_id=3,
        n_q=16,
        dep_q=8,
        card=card,
        num_heads=heads,
        num_layers=layers,
        hidden_scale=4.125,
        causal=True,
        layer_scale=None,
        context=ctx,
        max_period=10000,
        gating="silu",
        norm="rms_norm_f32",
        positional_embedding="rope",
        depformer_dim=ddim,
        depformer_dim_feedforward=int(4.125 * ddim),
        depformer_num_heads=dheads,
        depformer_num_layers=dlayers,
        depformer_layer_scale=None,
        depformer_multi_linear=True,
        depformer_context=8,
        depformer_max_period=10000,
        depformer_gating="silu",
        depformer_pos_emb="none",
        depformer_weights_per_step=True,
        delays=list(DELAYS_8),
    )


PRESETS = ("tiny", "small", "7b")


def _check(preset: str) -> str:
    if preset not in PRESETS:
        raise ValueError(f"unknown moshi preset {preset!r}; choose from {list(PRESETS)}")
    return preset


def copy_config(cfg: dict) -> dict:
    """A deep copy (configs are nested dicts that modules must not share)."""
    return copy.deepcopy(cfg)
