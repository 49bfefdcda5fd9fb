"""Per-session voice and role prompts of a duplex session (NVIDIA's PersonaPlex: the Moshi architecture
fine-tuned to follow a voice prompt and a text role prompt given before the conversation).

A :class:`DuplexPrompt` is prefilled as the model's own streams at session start: the voice prompt's Mimi
codes (a reference clip encoded by Mimi, 12.5 Hz) on the model's audio stream with text padding on its text
stream, then the role prompt's tokens on the text stream (its audio sampled). :func:`prompt_schedule` turns it
into the tokens each engine step forces (``MoshiLM.step(force=...)``), the acoustic delays applied: prompt
frame ``i``'s codebook ``k`` is forced at step ``i + delays[k]``, so the schedule runs ``frames +
max(delays)`` steps and its last ``max(delays)`` steps force the prompt's late codebooks while the text is
sampled already. The engine holds every row's schedule in one batched tensor and advances them all with the
tick (:mod:`.engine`): one prompt frame per tick in the same batched step as the other sessions, so a joining
session's prefill costs the others nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_PROMPT_FRAMES = 250
"""Longest prompt (voice + role frames): 20 s at 12.5 Hz."""


@dataclass
class DuplexPrompt:
    """A session's prompts.

    Attributes:
        voice_codes: Mimi codes of the voice prompt, int64 ``[frames, dep_q]`` (codebooks of the model's audio
            stream; ``frames`` at 12.5 Hz), or ``None``.
        role_tokens: text-stream token ids of the role prompt (the model's text vocabulary).
    """

    voice_codes: torch.Tensor | None = None
    role_tokens: list[int] = field(default_factory=list)

    @property
    def frames(self) -> int:
        """Prompt frames: voice frames plus one per role token."""
        voice = 0 if self.voice_codes is None else int(self.voice_codes.shape[0])
        return voice + len(self.role_tokens)


def check_prompt(prompt: DuplexPrompt, dep_q: int, card: int, text_card: int) -> None:
    """Raise ValueError for a prompt the model cannot take: codes not int64 ``[frames, dep_q]`` in
    ``[0, card)``, role tokens outside ``[0, text_card)``, or more than :data:`MAX_PROMPT_FRAMES` frames."""
    c = prompt.voice_codes
    if c is not None:
        if c.dim() != 2 or c.shape[1] != dep_q or c.dtype != torch.long:
            got = f"{c.dtype} {list(c.shape)}"
            raise ValueError(f"voice prompt codes must be int64 [frames, {dep_q}], got {got}")
        if c.numel() and (int(c.min()) < 0 or int(c.max()) >= card):
            raise ValueError(f"voice prompt codes must lie in [0, {card})")
    bad = [t for t in prompt.role_tokens if not isinstance(t, int) or not 0 <= t < text_card]
    if bad:
        raise ValueError(f"role prompt tokens must be ints in [0, {text_card}), got {bad[:3]}")
    if prompt.frames > MAX_PROMPT_FRAMES:
        raise ValueError(
            f"prompt of {prompt.frames} frames is longer than {MAX_PROMPT_FRAMES} (20 s at 12.5 Hz)"
        )


def prompt_schedule(prompt: DuplexPrompt, delays: list[int], dep_q: int, pad_id: int) -> torch.Tensor:
    """The tokens each step forces: int64 ``[frames + max(delays), 1 + dep_q]`` (text, then the model's
    ``dep_q`` codebooks; ``-1``: sampled). ``delays``: the LM's per-stream delays (text first); ``pad_id``:
    the text padding token forced under the voice prompt (``existing_text_padding_id``)."""
    voice = 0 if prompt.voice_codes is None else int(prompt.voice_codes.shape[0])
    frames = prompt.frames
    lag = max(delays[: dep_q + 1])
    per_frame = torch.full((frames, 1 + dep_q), -1, dtype=torch.long)
    if voice:
        per_frame[:voice, 0] = pad_id
        per_frame[:voice, 1:] = prompt.voice_codes.to(torch.long).cpu()
    if prompt.role_tokens:
        per_frame[voice:, 0] = torch.tensor(prompt.role_tokens, dtype=torch.long)
    out = torch.full((frames + lag, 1 + dep_q), -1, dtype=torch.long)
    for k in range(1 + dep_q):  # stream k of frame i is generated at step i + delays[k]
        d = delays[k]
        out[d : d + frames, k] = per_frame[:, k]
    return out


def encode_voice_prompt(mimi, pcm: torch.Tensor, dep_q: int) -> torch.Tensor:
    """A reference clip → the voice prompt's codes: ``pcm`` float ``[samples]`` in [-1, 1] at 24 kHz (any
    length; the last frame is zero-padded) → int64 ``[frames, dep_q]`` (the first ``dep_q`` of Mimi's
    codebooks, 12.5 Hz). ``mimi`` must not be streaming (a copy kept for prompts, not the engine's: the
    engine's Mimi holds every session's streaming state).

    Raises:
        ValueError: an empty, non-1-D or non-finite clip, or one longer than :data:`MAX_PROMPT_FRAMES`.
    """
    from omniduplex.models.moshi.config import FRAME_SAMPLES

    pcm = torch.as_tensor(pcm, dtype=torch.float32)
    if pcm.dim() != 1 or pcm.numel() == 0:
        raise ValueError(f"a voice prompt is 1-D audio at 24 kHz, got shape {list(pcm.shape)}")
    if not torch.isfinite(pcm).all():
        raise ValueError("voice prompt audio holds NaN or inf samples")
    if -(-pcm.numel() // FRAME_SAMPLES) > MAX_PROMPT_FRAMES:
        raise ValueError(f"voice prompt longer than {MAX_PROMPT_FRAMES * FRAME_SAMPLES / 24000:.0f} s")
    dev = next(mimi.parameters()).device
    with torch.no_grad():
        codes = mimi.encode(pcm.to(dev)[None, None])[0, :dep_q]
    return codes.T.contiguous().cpu()
