"""The engine families behind one interface: VoxCPM2, Higgs Audio v3 and Fish Speech S2 Pro, each a loaded
checkpoint with its continuous-batching engine, its voices, and a streaming decoder per request.

A :class:`FamilyRunner` is what the speech service (``POST /v1/audio/speech``,
:mod:`omniduplex.app.host.speech.family`) and the cascade's TTS stage (:mod:`.stages.family_tts`) share:

- :meth:`~FamilyRunner.prompt` checks a request (voice, reference clip, text) and builds its prompt; every
  refusal is one :class:`TTSInputError` naming the field, raised before anything is queued;
- :meth:`~FamilyRunner.add` queues it on :attr:`~FamilyRunner.engine` (the family's own engine class:
  ``add / abort / has_unfinished / step``), with a frame budget capped by the context;
- :meth:`~FamilyRunner.decoder` gives the request's streaming decoder, :meth:`~FamilyRunner.decode` turns
  one engine event into float32 PCM at :attr:`~FamilyRunner.sample_rate` (every frame decoded once, streamed
  equals one-shot), :meth:`~FamilyRunner.flush` the rest.

Per family (``voice`` / cloning; :meth:`~FamilyRunner.voices` lists them):

- VoxCPM2 (48 kHz out): ``default`` and voices registered on :attr:`VoxCPM2Runner.bank`; a request clones from
  a 16 kHz clip (≥ 0.5 s), with its transcript as a continuation prompt when given.
- Higgs v3 (24 kHz out): the checkpoint's ``voices.json`` voices (none: the model's own voice); a raw clip is
  refused with the reason (the audio tokenizer's encoder is not in this build).
- Fish Speech S2 Pro (44.1 kHz out): ``default`` and registered clones; a request clones from a 44.1 kHz clip
  (≥ 1 s) with its transcript (required).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omniduplex.models.tts_family import FISH_SPEECH, HIGGS, VOXCPM2, tts_family


class TTSInputError(ValueError):
    """A request the family cannot speak: ``str(e)`` for the client, ``param`` the request field at fault
    (``voice``, ``ref_audio``, ``ref_text``, ``input``), ``code`` the OpenAI-style error code
    (``context_length_exceeded`` for text past the context, else ``invalid_value``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        past = param == "input" and "past the context" in message
        self.code = "context_length_exceeded" if past else "invalid_value"


@dataclass(frozen=True)
class VoiceInfo:
    """One voice a request may name: ``cloned`` when it came from a registered clip."""

    name: str
    cloned: bool = False


class FamilyRunner(ABC):
    """One loaded checkpoint of an engine family (module docstring).

    Args:
        model_dir: the checkpoint folder.
        max_num_seqs: requests batched per engine step; ``num_blocks``: KV cache blocks (16 positions each).
        lever: the family's serving lever on (``False``: off, for comparisons; same output).
    """

    family: str
    cloning: bool = False
    """Whether a request may carry a reference clip to clone (``ref_audio``)."""
    instructions: bool = False
    """Whether the family reads a style instruction (none of these three do)."""
    ref_rate: int = 0
    """Sample rate a reference clip must have (Hz; 0 without cloning)."""
    sample_rate: int
    engine: Any

    @abstractmethod
    def voices(self) -> list[VoiceInfo]:
        """The voices a request may name (the first is the default)."""

    @abstractmethod
    def prompt(
        self,
        text: str,
        voice: str | None = None,
        ref: tuple[np.ndarray, int] | None = None,
        ref_text: str | None = None,
    ) -> Any:
        """Check one request and build its prompt. ``ref``: a reference clip (float32 ``[n]``, its rate).

        Raises TTSInputError: an unknown voice, a clip of the wrong rate or too short, cloning where the
        family has none, empty text, text past the context.
        """

    def register(self, name: str, ref: tuple[np.ndarray, int], ref_text: str | None = None) -> str:
        """Clone a voice from ``ref`` (float32 ``[n]``, its rate) once, as the voice ``name``; returns
        ``name``.

        Raises TTSInputError: the family cannot clone, or refuses the clip."""
        raise TTSInputError(f"{self.family} cannot clone a voice from a clip in this build", "ref_audio")

    @abstractmethod
    def budget(self, prompt: Any, max_frames: int) -> dict:
        """The engine sampling keys capping ``prompt`` at ``max_frames`` frames and at the context.

        Raises TTSInputError: no frame fits after the prompt."""

    @abstractmethod
    def decoder(self, prompt: Any) -> Any:
        """A fresh streaming decoder for one request."""

    @abstractmethod
    def _decode(self, decoder: Any, event: Any) -> torch.Tensor:
        """The samples one engine event completes (maybe none)."""

    def add(self, request_id: str, prompt: Any, max_frames: int, sampling: dict | None = None) -> None:
        """Queue ``prompt`` on the engine: ``sampling`` (the family's keys) over the frame budget.

        Raises TTSInputError: the prompt leaves no room; ValueError: bad sampling keys, a duplicate id."""
        try:
            self.engine.add(request_id, prompt, {**self.budget(prompt, max_frames), **(sampling or {})})
        except TTSInputError:
            raise
        except ValueError as e:  # the families' PromptError is a ValueError too
            raise TTSInputError(str(e), "input") from e

    def decode(self, decoder: Any, event: Any) -> np.ndarray:
        """float32 ``[n]`` at :attr:`sample_rate`: the samples ``event`` completes (``n >= 0``)."""
        return self._decode(decoder, event).reshape(-1).float().cpu().numpy()

    def flush(self, decoder: Any) -> np.ndarray:
        """float32 ``[n]``: the decoder's last samples (the decoder is spent afterwards)."""
        return decoder.flush().reshape(-1).float().cpu().numpy()


def _refuse(e: Exception, param: str) -> TTSInputError:
    return TTSInputError(str(e), param)


def _known_voice(voice: str | None, known: list[str]) -> None:
    if voice is not None and voice not in known:
        raise TTSInputError(f"unknown voice {voice!r}; this model has {known or 'no named voices'}", "voice")


def _no_context(family: str, prompt_len: int, limit: int) -> TTSInputError:
    return TTSInputError(
        f"input past the context: the {family} prompt takes {prompt_len} of {limit} positions, leaving no "
        "room for audio",
        "input",
    )


class VoxCPM2Runner(FamilyRunner):
    """VoxCPM2: the lever is the batched flow-matching solver (:class:`~.voxcpm2.VoxCPM2Engine`)."""

    family, cloning = VOXCPM2, True

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from tokenizers import Tokenizer

        from omniduplex.models.voxcpm2.model import load_voxcpm2
        from omniduplex.models.voxcpm2.prompt import TextTokenizer, VoiceBank
        from omniduplex.pipeline.speech.voxcpm2 import VoxCPM2Engine

        self.model = load_voxcpm2(model_dir)
        self.tok = TextTokenizer(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))
        self.bank = VoiceBank(self.model.lm, self.model.vae)
        self.engine = VoxCPM2Engine(
            self.model, num_blocks=num_blocks, max_num_seqs=max_num_seqs, batch_solver=lever
        )
        self.sample_rate, self.ref_rate = self.model.sample_rate, self.model.vae.cfg.sample_rate
        self.context = min(self.model.config.context, num_blocks * 16)

    def voices(self) -> list[VoiceInfo]:
        from omniduplex.models.voxcpm2.prompt import DEFAULT_VOICE

        return [VoiceInfo(n, n != DEFAULT_VOICE) for n in self.bank.names]

    def prompt(self, text, voice=None, ref=None, ref_text=None):
        from omniduplex.models.voxcpm2.prompt import PromptError, build_prompt, make_voice

        try:
            v = self.bank.get(voice)
        except PromptError as e:
            raise _refuse(e, "voice") from e
        if ref is not None:
            try:
                cont = ref if ref_text else None
                v = make_voice(self.model.lm, self.model.vae, "request", ref, cont, ref_text or "")
            except PromptError as e:
                raise _refuse(e, "ref_audio") from e
        try:
            return build_prompt(self.model.lm, self.tok, text, v, self.context)
        except PromptError as e:
            raise _refuse(e, "input") from e

    def register(self, name, ref, ref_text=None):
        from omniduplex.models.voxcpm2.prompt import PromptError

        try:
            self.bank.register(name, ref, ref if ref_text else None, ref_text or "")
        except PromptError as e:
            raise _refuse(e, "ref_audio") from e
        return name

    def budget(self, prompt, max_frames):
        # one patch (160 ms) per step: frames are patches here; the prompt's own budget also caps it
        room = self.context - len(prompt.ids)
        if room < 1:
            raise _no_context(self.family, len(prompt.ids), self.context)
        return {"max_len": max(1, min(max_frames, room))}

    def decoder(self, prompt):
        from omniduplex.models.voxcpm2.vae_stream import VAEStream

        return VAEStream(self.model.vae, prompt.context)

    def _decode(self, decoder, event):
        return decoder.feed(event.latents) if event.latents is not None else torch.zeros(0)


class HiggsRunner(FamilyRunner):
    """Higgs Audio v3: the lever is the batched delay-pattern decode state (:class:`~.higgs.HiggsEngine`)."""

    family = HIGGS

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from omniduplex.models.higgs.model import load_higgs
        from omniduplex.pipeline.speech.higgs import HiggsEngine

        self.model = load_higgs(model_dir)
        self.engine = HiggsEngine(self.model, lever=lever, num_blocks=num_blocks, max_num_seqs=max_num_seqs)
        self.sample_rate = self.ref_rate = self.model.codec.cfg.sample_rate

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(n) for n in sorted(self.model.voices)]

    def prompt(self, text, voice=None, ref=None, ref_text=None):
        from omniduplex.models.higgs.prompt import PromptError, check_reference_audio

        if ref is not None:
            try:
                check_reference_audio(ref[0], ref[1], self.model.config)  # always refuses, with the reason
            except PromptError as e:
                raise _refuse(e, "ref_audio") from e
        _known_voice(voice, [v.name for v in self.voices()])
        try:
            return self.engine.prompt(text, voice)
        except PromptError as e:
            raise _refuse(e, "input") from e

    def budget(self, prompt, max_frames):
        # a step per delayed row: N − 1 more steps than frames (the delay pattern's tail)
        n, limit = self.model.config.num_codebooks, self.engine.max_len
        room = min(limit - len(prompt), self.engine.adapter.max_steps)
        if room < n:
            raise _no_context(self.family, len(prompt), limit)
        return {"max_tokens": min(max_frames + n - 1, room)}

    def decoder(self, prompt):
        from omniduplex.models.higgs.codec_stream import StreamingDecoder

        return StreamingDecoder(self.model.codec)

    def _decode(self, decoder, event):
        return decoder.feed(event.codes[None]) if event.codes is not None else torch.zeros(0)


class FishRunner(FamilyRunner):
    """Fish Speech S2 Pro: the levers are the q_len = 1 decode-attention fast path and the fast AR's static
    buffers (:class:`~.fish_speech.FishSpeechEngine`)."""

    family, cloning = FISH_SPEECH, True

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from omniduplex.models.fish_speech.config import SAMPLE_RATE
        from omniduplex.models.fish_speech.load import load_fish_speech
        from omniduplex.models.tokenizer import load_tokenizer
        from omniduplex.pipeline.speech.fish_speech import FishSpeechEngine

        self.model = load_fish_speech(model_dir)
        self.engine = FishSpeechEngine(
            self.model,
            load_tokenizer(model_dir),
            num_blocks=num_blocks,
            max_num_seqs=max_num_seqs,
            decode_fast_path=lever,
            static_buffers=lever,
        )
        self.sample_rate = self.ref_rate = SAMPLE_RATE
        self.limit = min(self.model.lm.cfg.max_seq_len, num_blocks * 16)

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(n, i > 0) for i, n in enumerate(self.engine.voice_names())]

    def prompt(self, text, voice=None, ref=None, ref_text=None):
        from omniduplex.models.fish_speech.prompt import PromptError, clone_voice

        _known_voice(voice, [v.name for v in self.voices()])
        if ref is not None:
            try:
                voice = clone_voice(
                    self.model.codec_encoder,
                    "request",
                    ref[0],
                    ref[1],
                    ref_text or "",
                    self.model.lm.cfg.num_codebooks,
                )
            except PromptError as e:
                raise _refuse(e, "ref_text" if "ref_text" in str(e) else "ref_audio") from e
        try:
            return self.engine.prompt(text, voice)
        except PromptError as e:
            raise _refuse(e, "input") from e

    def register(self, name, ref, ref_text=None):
        from omniduplex.models.fish_speech.prompt import PromptError

        try:
            self.engine.register_voice(name, ref[0], ref[1], ref_text or "")
        except PromptError as e:
            raise _refuse(e, "ref_text" if "ref_text" in str(e) else "ref_audio") from e
        return name

    def budget(self, prompt, max_frames):
        room = self.limit - len(prompt)
        if room < 1:
            raise _no_context(self.family, len(prompt), self.limit)
        return {"max_tokens": min(max_frames, room)}

    def decoder(self, prompt):
        from omniduplex.pipeline.speech.fish_speech import FishStreamDecoder

        return FishStreamDecoder(self.model.codec)

    def _decode(self, decoder, event):
        return decoder.feed(event.codes[None]) if event.codes is not None else torch.zeros(0)


RUNNERS: dict[str, type[FamilyRunner]] = {VOXCPM2: VoxCPM2Runner, HIGGS: HiggsRunner, FISH_SPEECH: FishRunner}
"""The engine families by name (Qwen3-TTS has its own service and stage: :mod:`.qwen3_tts`)."""


def load_runner(model_dir: str | Path, **kw) -> FamilyRunner:
    """The runner of the checkpoint in ``model_dir`` (its family from ``config.json``); ``kw``: the runner's
    arguments.

    Raises:
        CheckpointError: a checkpoint of the family that does not load (a missing tensor: named).
        ValueError: not a VoxCPM2, Higgs or Fish Speech checkpoint.
    """
    family = tts_family(model_dir)
    if family not in RUNNERS:
        raise ValueError(
            f"{model_dir}: not a checkpoint of {sorted(RUNNERS)} (config.json; found {family or 'none'})"
        )
    return RUNNERS[family](model_dir, **kw)
