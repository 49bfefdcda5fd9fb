"""Sequential reference decode of the unified LM: one request (plus its CFG companion), no batching.

The oracle the batched engine is tested against: with ``greedy=True`` in fp32 the engine must emit
exactly these step tokens. Each forward runs on its own contiguous paged KV cache
(``ForwardBatch.contiguous``), like :mod:`.reference`. The phase rules are those of
:mod:`.unified_phases`, applied with batch size 1.

Random-weight presets rarely decide to speak on their own (or decide at once). ``max_text_tokens`` is
the deterministic knob: when a request has written that many text tokens the transition is forced
(``max_text_tokens=0`` speaks immediately). ``max_audio_frames`` likewise forces the drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omniduplex.models.forward_batch import SequenceCache
from omniduplex.models.unified.delay_pattern import deinterleave
from omniduplex.models.unified.model import UnifiedLM, null_prompt_ids, text_steps
from omniduplex.models.unified.phases import (
    AUDIO,
    DONE,
    DRAIN,
    TEXT,
    PhaseState,
    PhaseTables,
    cfg_active,
    decode_step,
    merge_cfg,
)


@dataclass
class UnifiedOutput:
    """One generated turn.

    Attributes:
        text_ids: stream-0 ids of the TEXT steps (the text EOS included when the turn ended on it).
        codes: int64 ``[S, F]`` local codec ids in ``[0, codebook_size)``, de-interleaved (``F = 0`` when
            the turn had no audio).
        phases: phase (``unified_phases.TEXT``..``DRAIN``) of every emitted step.
        steps: int64 ``[N, S]`` every emitted step's flat tokens (``-1`` = absent), in order.
    """

    text_ids: list[int]
    codes: torch.Tensor
    phases: list[int] = field(default_factory=list)
    steps: torch.Tensor | None = None


def _forward(model: UnifiedLM, seq: SequenceCache, tokens: torch.Tensor) -> torch.Tensor:
    """Append step tokens ``[T, S]`` to ``seq`` → hidden ``[1, H]`` of the last one."""
    return model(model.embed_step(tokens), seq.batch(tokens.shape[0]), seq.kv)[-1:]


def _as_steps(prompt, num_streams: int) -> torch.Tensor:
    p = torch.as_tensor(prompt, dtype=torch.int64)
    return p if p.dim() == 2 else text_steps(p, num_streams)


@torch.no_grad()
def generate(
    model: UnifiedLM,
    prompt_ids: list[int] | torch.Tensor,
    max_text_tokens: int,
    max_audio_frames: int,
    cfg_scale: float = 1.0,
    greedy: bool = True,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> UnifiedOutput:
    """Decode one turn: text, then (unless the text ends on EOS) ``S`` delayed codec streams.

    Args:
        prompt_ids: text ids ``[T]``, or step tokens ``[T, S]`` (``-1`` = absent) for prompts with audio.
        max_text_tokens: text budget; reaching it forces the transition (module docstring).
        max_audio_frames: frame budget; reaching it forces the drain.
        cfg_scale: ``w``; ``!= 1`` runs a companion on :func:`~.unified.null_prompt_ids` and merges
            ``w·cond + (1 − w)·uncond`` in AUDIO/DRAIN; every emitted step is fed to both sequences.
        greedy / temperature / generator: sampling of the non-forced slots.

    Raises:
        ValueError: an empty prompt or negative budgets.
    """
    cfg = model.cfg
    s = cfg.num_streams
    prompt = _as_steps(prompt_ids, s)
    if prompt.shape[0] == 0:
        raise ValueError("empty prompt")
    if max_text_tokens < 0 or max_audio_frames < 0:
        raise ValueError("budgets must be >= 0")
    dtype = model.lm_head.weight.dtype
    device = model.lm_head.weight.device
    tables = PhaseTables.from_config(cfg, device)
    budget = max_text_tokens + len(cfg.bridge_token_ids) + max_audio_frames + s
    use_cfg = cfg_scale != 1.0
    main = SequenceCache(cfg.decoder, prompt.shape[0] + budget, dtype, device)
    hidden = _forward(model, main, prompt.to(device))
    if use_cfg:
        null = text_steps(null_prompt_ids(cfg), s).to(device)
        comp = SequenceCache(cfg.decoder, null.shape[0] + budget, dtype, device)
        hidden_u = _forward(model, comp, null)
    state = PhaseState.initial(1, max_text_tokens, max_audio_frames, device)
    steps, phases = [], []
    while True:
        logits = model.stream_logits(hidden).float()
        if use_cfg and bool(cfg_active(state)):  # the companion's logits matter in AUDIO/DRAIN only
            logits = merge_cfg(logits, model.stream_logits(hidden_u), cfg_scale, cfg_active(state))
        res = decode_step(state, logits, tables, greedy, temperature, generator)
        phase = int(res.step.phase)
        if phase == DONE:  # no token: audio EOS with S = 1
            break
        steps.append(res.tokens[0])
        phases.append(phase)
        state = res.state
        if int(state.phase) == DONE:
            break
        hidden = _forward(model, main, res.tokens)
        if use_cfg:
            hidden_u = _forward(model, comp, res.tokens)
    return _output(cfg, torch.stack(steps).cpu() if steps else torch.empty(0, s, dtype=torch.int64), phases)


def _output(cfg, steps: torch.Tensor, phases: list[int]) -> UnifiedOutput:
    s = cfg.num_streams
    ph = torch.tensor(phases, dtype=torch.int64)
    text = steps[ph == TEXT, 0].tolist()
    audio = steps[(ph == AUDIO) | (ph == DRAIN)]
    if audio.shape[0] == 0:
        codes = torch.empty(s, 0, dtype=torch.int64)
    else:
        offsets = torch.tensor([cfg.stream_offset(i) for i in range(s)])
        codes = deinterleave((audio - offsets[None]).T)
    return UnifiedOutput(text_ids=text, codes=codes, phases=phases, steps=steps)
