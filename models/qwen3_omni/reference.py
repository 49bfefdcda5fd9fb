"""Sequential greedy reference of one voice turn: audio → Thinker → Talker + code predictor → Code2Wav.

One request at a time, no batching, no streaming: the oracle the engine and the pipeline are
tested against (and itself tested against ``transformers``). Decoding rules follow
``Qwen3OmniMoeForConditionalGeneration.generate``: the Talker suppresses its control ids except EOS
and applies a repetition penalty to the codebook-0 ids it has generated (CTRL, Keskar et al. 2019).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omniduplex.models.forward_batch import SequenceCache
from omniduplex.models.qwen3_omni.code2wav_stream import chunked_decode
from omniduplex.models.qwen3_omni.talker_prompt import (
    special_text_embeds,
    talker_prefill_embeds,
    trailing_text_embed,
)
from omniduplex.models.registry import LoadedModel
from omniduplex.models.sampling import repetition_penalty


@dataclass
class TurnOutput:
    """One turn: DecoderLM ids (incl. the final EOS), Talker frames ``[F][G]``, waveform ``[samples]``."""

    thinker_token_ids: list[int]
    talker_codes: list[list[int]] = field(default_factory=list)
    waveform: torch.Tensor | None = None


@torch.no_grad()
def generate_turn(
    model: LoadedModel,
    prompt_ids: list[int],
    features: torch.Tensor | None = None,
    max_new_tokens: int = 32,
    talker_max_new_tokens: int = 64,
    speaker: str = "ethan",
    talker_repetition_penalty: float = 1.05,
    return_audio: bool = True,
    decode_chunk_frames: int = 300,
    decode_left_context_frames: int = 25,
) -> TurnOutput:
    """Greedy turn. ``features``: log-mel ``[n_mels, frames]`` of the user audio (or ``None``).

    Raises:
        ValueError: unknown speaker, or prompt/audio mismatch (see :meth:`Thinker.embed`).
    """
    cfg, thinker = model.config, model.thinker
    ids = torch.tensor(prompt_ids, dtype=torch.int64)
    audio = None
    if features is not None:
        audio, _ = thinker.audio_tower(features[None], torch.tensor([features.shape[-1]]))
    dtype = thinker.lm_head.weight.dtype
    prompt_embeds = thinker.embed(ids, audio)
    seq = SequenceCache(thinker.cfg, len(prompt_ids) + max_new_tokens, dtype)
    accept = cfg.talker.accept_hidden_layer if (cfg and cfg.talker) else None
    hidden, prompt_hidden = thinker(prompt_embeds, seq.batch(len(prompt_ids)), seq.kv, capture_layer=accept)
    eos = cfg.im_end_token_id if cfg else None
    tokens = [int(thinker.compute_logits(hidden[-1:]).argmax(-1))]
    gen_embeds = []
    while tokens[-1] != eos and len(tokens) < max_new_tokens:
        x = thinker.embed(torch.tensor(tokens[-1:]))
        gen_embeds.append(x[0])
        hidden, _ = thinker(x, seq.batch(1), seq.kv)
        tokens.append(int(thinker.compute_logits(hidden).argmax(-1)))
    out = TurnOutput(tokens)
    if not return_audio or model.talker is None or len(tokens) < 2:
        return out
    out.talker_codes = _talk(
        model,
        ids,
        prompt_embeds,
        prompt_hidden,
        gen_embeds,
        talker_max_new_tokens,
        speaker,
        talker_repetition_penalty,
    )
    if out.talker_codes:
        codes = torch.tensor(out.talker_codes, dtype=torch.int64).T[None]
        out.waveform = chunked_decode(model.code2wav, codes, decode_chunk_frames, decode_left_context_frames)
        out.waveform = out.waveform.reshape(-1)
    return out


def _talk(model: LoadedModel, ids, prompt_embeds, prompt_hidden, gen_embeds, max_new, speaker, penalty):
    cfg, talker = model.config, model.talker
    if speaker.lower() not in cfg.talker.speaker_id:
        raise ValueError(f"unknown speaker {speaker!r}; this checkpoint has {sorted(cfg.talker.speaker_id)}")
    specials = special_text_embeds(talker, model.thinker.model.embed_tokens, cfg)
    prefill = talker_prefill_embeds(
        talker,
        cfg,
        ids,
        prompt_embeds,
        prompt_hidden,
        gen_embeds[0],
        specials,
        cfg.talker.speaker_id[speaker.lower()],
    )
    n_text = len(gen_embeds) + 1  # thinker tokens g_0..g_{n-1}; embeds exist for g_0..g_{n-2}
    seq = SequenceCache(talker.cfg.text, prefill.shape[0] + max_new, prefill.dtype)
    suppress = talker.suppressed_token_mask()
    eos = cfg.talker.codec_eos_token_id

    def sample(h: torch.Tensor, seen: list[int]) -> int:
        logits = repetition_penalty(talker.compute_logits(h).float(), seen, penalty)
        return int(logits.masked_fill(suppress, float("-inf")).argmax())

    hidden = talker(prefill, seq.batch(prefill.shape[0]), seq.kv)[-1]
    cb0 = [sample(hidden, [])]
    frames: list[list[int]] = []
    while cb0[-1] != eos and len(cb0) < max_new:
        code0 = torch.tensor(cb0[-1:])
        frame = talker.code_predictor.predict(hidden[None], code0, talker.model.codec_embedding(code0))
        frames.append(frame[0].tolist())
        j = len(frames) - 1
        text = trailing_text_embed(
            talker,
            gen_embeds[j + 1] if j + 1 < n_text - 1 else None,
            is_final=j + 1 == n_text - 1,
            past_end=j + 1 > n_text - 1,
            specials=specials,
        )
        x = talker.frame_embedding(frame) + text
        hidden = talker(x, seq.batch(1), seq.kv)[-1]
        cb0.append(sample(hidden, cb0))
    return frames
