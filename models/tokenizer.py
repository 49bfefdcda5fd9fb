"""Tokenizer loading, the locally built byte-level tokenizer of the tiny/small presets, and chat prompts.

Real checkpoints ship ``tokenizer.json`` (Qwen2 byte-level BPE, 151k ids); the presets write a
byte-level tokenizer with no merges (256 byte ids + Qwen chat special tokens), built without a download.
Prompt ids are assembled from the config's special ids, so the Talker's role detection
(``<|im_start|>`` + role id) works with either tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from omniduplex.models.config import OmniConfig

# Order defines the ids 256.. of the preset tokenizer; names are the published Qwen3-Omni tokens.
PRESET_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
]
"""The last three stand for the role words ("system", "user", "assistant") that are single BPE tokens in
the published vocabulary; as bracketed special tokens they never match inside ordinary text."""
DEFAULT_SYSTEM_PROMPT = "You are a helpful voice assistant. Answer briefly."


def build_byte_tokenizer() -> Tokenizer:
    """A byte-level tokenizer: ids 0..255 are the GPT-2 byte alphabet, then :data:`PRESET_SPECIAL_TOKENS`."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=_byte_of))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(PRESET_SPECIAL_TOKENS)
    return tok


def _byte_of(ch: str) -> int:
    """Inverse of the GPT-2 bytes→unicode map (printable bytes map to themselves, the rest to U+0100..)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    o = ord(ch)
    if o in printable:
        return o
    others = [b for b in range(256) if b not in printable]
    return others[o - 256]


def preset_token_ids() -> dict[str, int]:
    """Special token name → id in the preset tokenizer."""
    return {name: 256 + i for i, name in enumerate(PRESET_SPECIAL_TOKENS)}


def write_tokenizer(out_dir: Path) -> None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (loadable by ``transformers.AutoTokenizer``)."""
    tok = build_byte_tokenizer()
    (out_dir / "tokenizer.json").write_text(tok.to_str(pretty=True))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a checkpoint directory.

    Raises:
        FileNotFoundError: the checkpoint has no ``tokenizer.json``.
    """
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    return Tokenizer.from_file(str(path))


def voice_turn_prompt(
    cfg: OmniConfig,
    tok: Tokenizer,
    num_audio_tokens: int,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    history: list[tuple[str, str]] = (),
    user_text: str | None = None,
) -> list[int]:
    """Prompt ids of a spoken user turn, ending with the assistant header ``<|im_start|>assistant\\n``.

    Layout (Qwen3-Omni chat template): optional system turn, earlier ``(role, text)`` turns, then
    ``<|im_start|>user\\n<|audio_start|>`` + ``num_audio_tokens`` × ``<|audio_pad|>`` + ``<|audio_end|>``.
    A typed turn (``user_text``, ``num_audio_tokens`` 0) has the text as its user turn instead; "" adds no
    user turn (the reply continues the conversation as it stands).
    """
    nl = tok.encode("\n", add_special_tokens=False).ids
    role_ids = {"system": cfg.system_token_id, "user": cfg.user_token_id, "assistant": cfg.assistant_token_id}

    def turn(role: str, body: list[int]) -> list[int]:
        return [cfg.im_start_token_id, role_ids[role], *nl, *body, cfg.im_end_token_id, *nl]

    ids: list[int] = []
    if system_prompt:
        ids += turn("system", tok.encode(system_prompt, add_special_tokens=False).ids)
    for role, text in history:
        ids += turn(role, tok.encode(text, add_special_tokens=False).ids)
    th = cfg.thinker
    if user_text is not None:
        if user_text:
            ids += turn("user", tok.encode(user_text, add_special_tokens=False).ids)
    else:
        ids += turn(
            "user", [th.audio_start_token_id, *[th.audio_token_id] * num_audio_tokens, th.audio_end_token_id]
        )
    return ids + [cfg.im_start_token_id, cfg.assistant_token_id, *nl]
