"""A toy TTS family registered from outside the package (``--plugin tests/toy_family.py``): a checkpoint is a
folder whose ``config.json`` says ``"architecture": "toy-tone"``; its engine speaks one frame per character
per step, a 20 ms sine at 16 kHz whose pitch is the character's (:func:`tone`), so any output can be checked
sample by sample. It has one voice and no cloning."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omniduplex.pipeline.speech.family_runner import FamilyRunner, TTSInputError, VoiceInfo, known_voice
from omniduplex.pipeline.speech.registry import TTSFamily, register_family

RATE = 16_000
FRAME = 320  # 20 ms at 16 kHz


def tone(ch: str) -> np.ndarray:
    """The frame of character ``ch``: float32 ``[320]``, a 0.3-amplitude sine at 200 + 10·(ord % 60) Hz."""
    t = np.arange(FRAME) / RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 10 * (ord(ch) % 60)) * t)).astype(np.float32)


def speech(text: str) -> np.ndarray:
    """What the toy family says for ``text`` (every frame in order) at 16 kHz."""
    return np.concatenate([tone(c) for c in text])


@dataclass
class Event:
    request_id: str
    char: str | None
    finished: bool


class ToyEngine:
    """One character per request per :meth:`step` (``add / abort / has_unfinished / step``)."""

    def __init__(self) -> None:
        self.queued: dict[str, list[str]] = {}

    def add(self, request_id: str, text: str, sampling: dict) -> None:
        if request_id in self.queued:
            raise ValueError(f"duplicate request id {request_id!r}")
        unknown = set(sampling) - {"max_frames", "seed", "temperature"}
        if unknown:
            raise ValueError(f"unknown sampling keys {sorted(unknown)}")
        self.queued[request_id] = list(text[: sampling["max_frames"]])

    def abort(self, request_id: str) -> None:
        self.queued.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.queued)

    def step(self) -> list[Event]:
        out = []
        for rid, chars in list(self.queued.items()):
            ch = chars.pop(0)
            out.append(Event(rid, ch, not chars))
            if not chars:
                del self.queued[rid]
        return out


class ToyDecoder:
    def feed(self, ch: str) -> torch.Tensor:
        return torch.from_numpy(tone(ch))

    def flush(self) -> torch.Tensor:
        return torch.zeros(0)


class ToyRunner(FamilyRunner):
    family = "toy-tone"
    sample_rate = RATE

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        self.config = json.loads((Path(model_dir) / "config.json").read_text())
        self.engine = ToyEngine()

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo("default")]

    def prompt(self, text, voice=None, ref=None, ref_text=None, instructions=None, language="auto"):
        known_voice(voice, ["default"])
        if ref is not None:
            raise TTSInputError("toy-tone cannot clone a voice", "ref_audio")
        if not text:
            raise TTSInputError("input is empty", "input")
        return text

    def budget(self, prompt, max_frames):
        return {"max_frames": max_frames}

    def decoder(self, prompt):
        return ToyDecoder()

    def _decode(self, decoder, event):
        return decoder.feed(event.char)


def is_toy(model_dir: Path) -> bool:
    try:
        return json.loads((model_dir / "config.json").read_text()).get("architecture") == "toy-tone"
    except (OSError, ValueError):
        return False


def write_toy(out: Path, preset: str, seed: int, variant: str | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"architecture": "toy-tone", "preset": preset, "seed": seed}))
    return {"out": str(out), "preset": preset, "architecture": "toy-tone"}


register_family(
    TTSFamily(
        "toy-tone", detect=is_toy, runner=ToyRunner, sample_rate=RATE, presets=("tiny",), init=write_toy
    )
)
