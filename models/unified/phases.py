"""Per-request decode phases of the unified LM, as pure functions over batched state tensors.

Every request moves TEXT → TRANSITION → AUDIO → DRAIN → DONE (or TEXT → DONE). The state is five
int64 ``[B]`` tensors (:class:`PhaseState`), so the engine runs these same functions over its whole
batch with no per-request Python; the sequential reference (:mod:`.unified_reference`) runs them with
``B = 1``. One decode step, given the logits ``[B, S, V]`` of every stream at the request's last
position (after the CFG merge, :func:`merge_cfg`):

1. ``argmax0`` = the UNMASKED argmax of stream 0's logits over the whole flat vocabulary. The phase is
   inferred from which disjoint region it falls in, never from positions (:func:`resolve_step`):

   * TEXT: if ``argmax0`` is in any audio region, is ``speech_start_token_id`` or a bridge token, or the
     request already wrote ``max_text_tokens`` text tokens (a voice turn must speak: the budget forces
     the transition), this step becomes TRANSITION (bridge index 0). Otherwise it stays TEXT.
   * AUDIO: if ``argmax0`` is stream 0's audio EOS, or ``max_audio_frames`` frames are out, this step
     becomes DRAIN (drain index 0) — or DONE with no token when ``S = 1`` (nothing to flush).
   * TRANSITION and DRAIN run their fixed number of steps; DONE emits nothing.

2. Tokens of the step (flat ids, ``-1`` = stream absent; :func:`assemble`). A slot is SAMPLED (argmax,
   or a draw, restricted by the phase's vocabulary mask) or FORCED:

   ========== ============================================ ==========================================
   phase      stream 0                                     stream i >= 1
   ========== ============================================ ==========================================
   TEXT       sampled from the text region minus bos,      absent (-1)
              null prompt, speech-start and bridge ids
   TRANSITION forced ``bridge_token_ids[count]``            absent (-1)
   AUDIO      sampled from stream 0's codebook ids          sampled from stream i's codebook ids if
              (``frames`` = audio step ``a``)               ``a >= i``, else forced pad_i (delay)
   DRAIN      forced audio EOS at drain step 0, pad after   sampled from stream i's codebook ids while
                                                            it still owes frames (``count < i`` and
                                                            ``a >= i``), else forced pad_i
   ========== ============================================ ==========================================

   with ``a = frames + count`` in DRAIN: delayed step ``a`` carries frame ``a − i`` on stream ``i``
   (:func:`.delay_pattern.step_validity` with ``num_frames = frames``). Codebook ids exclude the pad and
   EOS ids, so pads and the EOS only ever appear where the rules force them.

3. Next state (:func:`next_state`): TEXT + text ``eos_token_id`` → DONE (no audio); TRANSITION after the
   last bridge token → AUDIO; AUDIO counts one frame; DRAIN after ``S − 1`` steps → DONE.

So a spoken turn is ``n_text`` text steps, ``len(bridge)`` bridge steps, ``F`` audio steps and ``S − 1``
drain steps; the ``F + S − 1`` audio+drain steps de-interleave into a complete ``[S, F]`` code matrix.
This follows ESPnet-SpeechLM / OpusLM's delay inference (stream 0 predicts EOS, then ``S − 1`` more
steps flush the delayed streams; phases switched by special tokens on stream 0). Where OpusLM is not
specific we chose: the unmasked-argmax rule, forced bridge tokens, the budget-forced transition, and
CFG (``w·cond + (1 − w)·uncond`` over the whole logit row, so the EOS decision is guided too) active
exactly when the request's phase before the step is AUDIO or DRAIN (:func:`cfg_active`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omniduplex.models.unified.delay_pattern import step_validity
from omniduplex.models.unified.model import UnifiedConfig

TEXT, TRANSITION, AUDIO, DRAIN, DONE = range(5)
PHASE_NAMES = ("text", "transition", "audio", "drain", "done")
_NO_END = torch.iinfo(torch.int64).max // 2


@dataclass(frozen=True)
class PhaseTables:
    """Constant tensors of one checkpoint's vocabulary layout.

    Attributes:
        num_streams: ``S``.
        text_eos: text EOS id; audio_eos: stream 0's audio EOS id (flat).
        bridge: int64 ``[NB]`` forced bridge ids; pad_ids: int64 ``[S]`` per-stream pad ids.
        trigger: bool ``[V]`` ids whose unmasked argmax in TEXT starts the transition.
        allowed: bool ``[5, S, V]`` ids stream ``s`` may sample in phase ``p`` (before delay validity).
        sampled: bool ``[5, S]`` = ``allowed.any(-1)``: which streams phase ``p`` samples at all.
    """

    num_streams: int
    text_eos: int
    audio_eos: int
    bridge: torch.Tensor
    pad_ids: torch.Tensor
    trigger: torch.Tensor
    allowed: torch.Tensor
    sampled: torch.Tensor

    @classmethod
    def from_config(cls, cfg: UnifiedConfig, device: torch.device | str = "cpu") -> PhaseTables:
        s, v, tv = cfg.num_streams, cfg.vocab_size, cfg.text_vocab_size
        allowed = torch.zeros(5, s, v, dtype=torch.bool)
        allowed[TEXT, 0, :tv] = True
        forced_only = [cfg.bos_token_id, cfg.null_prompt_id, cfg.speech_start_token_id, *cfg.bridge_token_ids]
        allowed[TEXT, 0, forced_only] = False
        for i in range(s):
            lo = cfg.stream_offset(i)
            allowed[AUDIO, i, lo : lo + cfg.codebook_size] = True
            if i > 0:
                allowed[DRAIN, i, lo : lo + cfg.codebook_size] = True
        trigger = torch.zeros(v, dtype=torch.bool)
        trigger[tv:] = True
        trigger[[cfg.speech_start_token_id, *cfg.bridge_token_ids]] = True
        return cls(
            num_streams=s,
            text_eos=cfg.eos_token_id,
            audio_eos=cfg.audio_eos_id(0),
            bridge=torch.tensor(cfg.bridge_token_ids, dtype=torch.int64, device=device),
            pad_ids=torch.tensor([cfg.audio_pad_id(i) for i in range(s)], dtype=torch.int64, device=device),
            trigger=trigger.to(device),
            allowed=allowed.to(device),
            sampled=allowed.any(-1).to(device),
        )


@dataclass
class PhaseState:
    """Decode state of ``B`` requests, all int64 ``[B]``.

    ``phase``: TEXT..DONE. ``count``: tokens emitted in the current phase (text tokens, bridge tokens,
    audio frames, drain steps). ``frames``: audio frames ``F`` emitted (stream-0 codes; fixed from DRAIN
    on). ``max_text`` / ``max_frames``: the request's budgets.
    """

    phase: torch.Tensor
    count: torch.Tensor
    frames: torch.Tensor
    max_text: torch.Tensor
    max_frames: torch.Tensor

    @classmethod
    def initial(cls, batch: int, max_text_tokens, max_audio_frames, device="cpu") -> PhaseState:
        """``B`` fresh requests in TEXT; budgets are ints or int64 ``[B]``."""
        zeros = torch.zeros(batch, dtype=torch.int64, device=device)
        return cls(
            phase=zeros.clone(),
            count=zeros.clone(),
            frames=zeros.clone(),
            max_text=zeros + torch.as_tensor(max_text_tokens, device=device),
            max_frames=zeros + torch.as_tensor(max_audio_frames, device=device),
        )

    def replace(self, **kw: torch.Tensor) -> PhaseState:
        d = dict(self.__dict__)
        d.update(kw)
        return PhaseState(**d)


def cfg_active(state: PhaseState) -> torch.Tensor:
    """bool ``[B]``: CFG merges this step's logits (phase before the step is AUDIO or DRAIN)."""
    return (state.phase == AUDIO) | (state.phase == DRAIN)


def merge_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale, active: torch.Tensor) -> torch.Tensor:
    """``w·cond + (1 − w)·uncond`` where ``active`` (bool ``[B]``), ``cond`` elsewhere.

    ``cond``/``uncond`` ``[B, ...]`` logits of a request and its null-prompt companion; ``scale`` a float
    or ``[B]`` tensor (Ho & Salimans 2022; ``w = 1`` is no guidance). Computed in fp32. Also applied to
    final hidden states ``[B, H]`` by the engine, which is the same merge for the linear bias-free head.
    """
    cond, uncond = cond.float(), uncond.float()
    w = torch.as_tensor(scale, dtype=torch.float32, device=cond.device).reshape(-1, *[1] * (cond.dim() - 1))
    merged = w * cond + (1 - w) * uncond
    return torch.where(active.reshape(-1, *[1] * (cond.dim() - 1)), merged, cond)


def resolve_step(state: PhaseState, argmax0: torch.Tensor, tables: PhaseTables) -> PhaseState:
    """The state of the step being emitted now, from the unmasked stream-0 argmax ``argmax0`` int64 ``[B]``.

    TEXT may become TRANSITION, AUDIO may become DRAIN (or DONE when ``S = 1``); ``count`` restarts at 0
    on a switch. See the module docstring for the exact rules.
    """
    p, c = state.phase, state.count
    to_bridge = (p == TEXT) & (tables.trigger[argmax0] | (c >= state.max_text))
    stop = (p == AUDIO) & ((argmax0 == tables.audio_eos) | (state.frames >= state.max_frames))
    phase = torch.where(to_bridge, TRANSITION, p)
    phase = torch.where(stop, DRAIN if tables.num_streams > 1 else DONE, phase)
    return state.replace(phase=phase, count=torch.where(to_bridge | stop, 0, c))


def sampled_slots(step: PhaseState, tables: PhaseTables) -> torch.Tensor:
    """bool ``[B, S]``: slots this step samples (the rest are forced, see :func:`forced_tokens`)."""
    p = step.phase
    drain = p == DRAIN
    audio_step = step.frames + torch.where(drain, step.count, 0)
    end = torch.where(drain, step.frames, _NO_END)
    in_delay = step_validity(audio_step, tables.num_streams, end)
    is_audio = (p == AUDIO) | drain
    return tables.sampled[p] & (in_delay | ~is_audio[:, None])


def sample_masks(step: PhaseState, tables: PhaseTables) -> torch.Tensor:
    """bool ``[B, S, V]``: ids each stream may sample this step (rows of forced slots are all False)."""
    return tables.allowed[step.phase] & sampled_slots(step, tables)[..., None]


def forced_tokens(step: PhaseState, tables: PhaseTables) -> torch.Tensor:
    """int64 ``[B, S]``: the token of every forced slot (``-1`` = absent); sampled slots hold junk."""
    p, c = step.phase, step.count
    is_audio = (p == AUDIO) | (p == DRAIN)
    forced = torch.where(is_audio[:, None], tables.pad_ids[None, :], -1)
    first = forced[:, 0]
    first = torch.where(p == TRANSITION, tables.bridge[c.clamp(0, tables.bridge.numel() - 1)], first)
    first = torch.where((p == DRAIN) & (c == 0), tables.audio_eos, first)
    return torch.cat((first[:, None], forced[:, 1:]), dim=1)


def assemble(step: PhaseState, sampled: torch.Tensor, tables: PhaseTables) -> torch.Tensor:
    """Step tokens int64 ``[B, S]``: ``sampled`` ``[B, S]`` in sampled slots, forced tokens elsewhere."""
    return torch.where(sampled_slots(step, tables), sampled, forced_tokens(step, tables))


def next_state(step: PhaseState, tokens: torch.Tensor, tables: PhaseTables) -> PhaseState:
    """State after emitting ``tokens`` ``[B, S]`` in ``step`` (see the module docstring, rule 3)."""
    p, c1 = step.phase, step.count + 1
    new = torch.where((p == TEXT) & (tokens[:, 0] == tables.text_eos), DONE, p)
    new = torch.where((p == TRANSITION) & (c1 >= tables.bridge.numel()), AUDIO, new)
    new = torch.where((p == DRAIN) & (c1 >= tables.num_streams - 1), DONE, new)
    count = torch.where(p == DONE, step.count, torch.where(new != p, 0, c1))
    return step.replace(phase=new, count=count, frames=step.frames + (p == AUDIO).to(torch.int64))


def sample_tokens(
    logits: torch.Tensor,
    allowed: torch.Tensor,
    greedy: bool = True,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one id per ``[B, S]`` slot from ``logits`` ``[B, S, V]`` restricted to ``allowed``.

    Greedy: the first maximum (``torch.argmax``). Otherwise a draw from ``softmax(logits / T)`` over the
    allowed ids. Slots with no allowed id return an arbitrary id (they are forced, see :func:`assemble`).
    """
    masked = logits.float().masked_fill(~allowed, float("-inf"))
    if greedy:
        return masked.argmax(-1)
    masked = masked.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    probs = torch.softmax(masked / temperature, dim=-1)
    b, s, v = probs.shape
    return torch.multinomial(probs.reshape(b * s, v), 1, generator=generator).reshape(b, s)


@dataclass
class StepResult:
    """One decode step: ``step`` (the emitted step's phase state), ``tokens`` ``[B, S]`` (all ``-1`` for
    requests already DONE), ``state`` after it."""

    step: PhaseState
    tokens: torch.Tensor
    state: PhaseState


def decode_step(
    state: PhaseState,
    logits: torch.Tensor,
    tables: PhaseTables,
    greedy: bool = True,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> StepResult:
    """Rules 1–3 on ``logits`` ``[B, S, V]`` (CFG already merged): resolve, sample, assemble, advance."""
    step = resolve_step(state, logits[:, 0].argmax(-1), tables)
    sampled = sample_tokens(logits, sample_masks(step, tables), greedy, temperature, generator)
    tokens = assemble(step, sampled, tables)
    return StepResult(step, tokens, next_state(step, tokens, tables))
