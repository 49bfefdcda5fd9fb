"""Chat-format token ids of a Qwen3-TTS request (the strings ``qwen_tts.Qwen3TTSModel`` builds).

- text: ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``
- instruction: ``<|im_start|>user\\n{instruct}<|im_end|>\\n``
- reference transcript: ``<|im_start|>assistant\\n{ref_text}<|im_end|>\\n``

The prompt builder slices the text by position (3 role tokens, 5 tail tokens, as the reference does), which
holds for the published Qwen tokenizer (``assistant`` and ``\\n`` are one token each). The presets' byte
tokenizer spells ``assistant`` byte by byte, so there the role is ``<|im_start|>``, its ``<|assistant|>``
special token and ``\\n``.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from omniduplex.models.qwen3_tts.prompt import PromptError


def _one(tok: Tokenizer, s: str) -> list[int]:
    return tok.encode(s, add_special_tokens=False).ids


def role_ids(tok: Tokenizer, role: str) -> list[int]:
    """``<|im_start|>{role}\\n`` as 3 ids. Raises PromptError when the tokenizer cannot spell it so."""
    ids = _one(tok, f"<|im_start|>{role}\n")
    if len(ids) == 3:
        return ids
    special = tok.token_to_id(f"<|{role}|>")
    start = tok.token_to_id("<|im_start|>")
    nl = _one(tok, "\n")
    if special is None or start is None or len(nl) != 1:
        raise PromptError(f"the tokenizer spells '<|im_start|>{role}\\n' as {len(ids)} tokens, not 3")
    return [start, special, nl[0]]


def text_ids(tok: Tokenizer, text: str) -> list[int]:
    """Ids of the text to speak in chat format. Raises PromptError for empty text."""
    body = _one(tok, text)
    if not body:
        raise PromptError("nothing to say: the text is empty")
    role = role_ids(tok, "assistant")
    return role + body + _one(tok, "<|im_end|>\n") + role


def instruct_ids(tok: Tokenizer, instruct: str) -> list[int]:
    """Ids of a voice instruction (VoiceDesign / CustomVoice)."""
    return role_ids(tok, "user") + _one(tok, instruct) + _one(tok, "<|im_end|>\n")


def ref_text_ids(tok: Tokenizer, ref_text: str) -> list[int]:
    """Ids of a cloning reference transcript. Raises PromptError for an empty transcript."""
    body = _one(tok, ref_text)
    if not body:
        raise PromptError("the reference transcript is empty")
    return role_ids(tok, "assistant") + body + _one(tok, "<|im_end|>\n")
