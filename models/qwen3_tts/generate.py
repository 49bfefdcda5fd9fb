"""Sequential greedy generation of one Qwen3-TTS utterance: the oracle the served path is tested against.

Decoding rules follow ``Qwen3TTSForConditionalGeneration.generate`` (qwen-tts 0.1.1) with greedy
sampling: codebook 0 suppresses the 1024 control ids at the top of the vocabulary except EOS, EOS is
suppressed for the first ``min_new_tokens`` (2) steps, and a CTRL repetition penalty (Keskar et al. 2019;
1.05 by default) applies to the codebook-0 ids generated so far. Decode step ``k`` first completes
frame ``k − 1`` with the code predictor (from the hidden state that produced its codebook-0 id), then
feeds the sum of that frame's embeddings plus the next text embedding. Generation stops at EOS or after
``max_new_tokens`` codebook-0 ids; the last id (EOS, or the id the budget cut) has no frame.
"""

from __future__ import annotations

import torch

from omniduplex.models.forward_batch import SequenceCache
from omniduplex.models.qwen3_tts.prompt import TalkerPrompt
from omniduplex.models.qwen3_tts.talker import Talker
from omniduplex.models.sampling import repetition_penalty


@torch.no_grad()
def generate_codes(
    talker: Talker,
    prompt: TalkerPrompt,
    max_new_tokens: int = 2048,
    min_new_tokens: int = 2,
    penalty: float = 1.05,
) -> torch.Tensor:
    """Greedy frames of one utterance: int64 ``[F, G]`` (``F ≤ max_new_tokens − 1``).

    Raises ValueError when ``max_new_tokens < 1``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    cfg = talker.cfg
    eos = cfg.codec_ids["eos"]
    suppress = talker.suppressed_token_mask()
    cache = SequenceCache(
        cfg.talker, prompt.prefill.shape[0] + max_new_tokens, prompt.prefill.dtype, prompt.prefill.device
    )
    x = prompt.prefill
    seen: list[int] = []
    last_hidden = x[-1]  # replaced by the prefill's before its first use
    frames: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        if step > 0:
            prev = torch.tensor([seen[-1]], device=x.device)
            frame = talker.code_predictor.predict(last_hidden[None], prev, talker.codec_embed(prev))
            frames.append(frame[0])
            x = talker.frame_embedding(frame) + prompt.step_text(step)
        hidden = talker(x, cache.batch(x.shape[0]), cache.kv)
        last_hidden = hidden[-1]
        logits = talker.compute_logits(hidden[-1:])[0].float()
        logits = repetition_penalty(logits, seen, penalty)
        logits = logits.masked_fill(suppress.to(logits.device), float("-inf"))
        if step < min_new_tokens:
            logits[eos] = float("-inf")
        seen.append(int(logits.argmax()))
        if seen[-1] == eos:
            break
    g = cfg.num_code_groups
    return torch.stack(frames) if frames else torch.zeros((0, g), dtype=torch.long)
