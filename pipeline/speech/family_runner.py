"""What every TTS family gives the shared parts: a loaded checkpoint with its continuous-batching engine,
its voices, and a streaming decoder per request (the family's :class:`FamilyRunner`, declared with its
family in :mod:`.registry`).

A runner is what the speech service (``POST /v1/audio/speech``,
:mod:`omniduplex.app.host.speech.runner_speech`), the cascade's TTS stage (:mod:`.stages.runner_tts`),
``omniduplex speak`` and ``bench tts`` share:

- :meth:`~FamilyRunner.prompt` checks a request (voice, reference clip, text, style) and builds its prompt;
  every refusal is one :class:`TTSInputError` naming the field, raised before anything is queued;
- :meth:`~FamilyRunner.add` queues it on :attr:`~FamilyRunner.engine` (the family's own engine class:
  ``add / abort / has_unfinished / step``), with a frame budget capped by the context;
- :meth:`~FamilyRunner.decoder` gives the request's streaming decoder, :meth:`~FamilyRunner.decode` turns
  one engine event into float32 PCM at :attr:`~FamilyRunner.sample_rate` (every frame decoded once, streamed
  equals one-shot), :meth:`~FamilyRunner.flush` the rest; :meth:`~FamilyRunner.stream` does all of it for
  one request alone.

The families' voices and cloning: each family's module (:mod:`.qwen3_tts`, :mod:`.voxcpm2`, :mod:`.higgs`,
:mod:`.fish_speech`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import soxr
import torch


class TTSInputError(ValueError):
    """A request the family cannot speak: ``str(e)`` for the client, ``param`` the request field at fault
    (``voice``, ``ref_audio``, ``ref_text``, ``input``), ``code`` the OpenAI-style error code
    (``context_length_exceeded`` for text past the context, else ``invalid_value``)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        past = param == "input" and "past the context" in message
        self.code = code or ("context_length_exceeded" if past else "invalid_value")


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
    """Whether the family reads a style instruction (``instructions``)."""
    ref_rate: int = 0
    """Sample rate a reference clip must have (Hz; 0 without cloning)."""
    sample_rate: int
    engine: Any
    greedy: dict = {"temperature": 0.0}
    """The sampling keys that make the family's output deterministic (``speak --greedy``)."""

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
        instructions: str | None = None,
        language: str = "auto",
    ) -> Any:
        """Check one request and build its prompt. ``ref``: a reference clip (float32 ``[n]``, its rate);
        ``instructions`` / ``language``: read by the families that have them, ignored by the others.

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

    def _decode(self, decoder: Any, event: Any) -> torch.Tensor:
        """The samples one engine event completes (maybe none). This default serves decoders fed one
        codebook frame at a time: ``decoder.feed(codes [1, num_codebooks])``; a family whose events or
        decoder differ overrides it."""
        return decoder.feed(event.codes[None]) if event.codes is not None else torch.zeros(0)

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

    def rate_decoder(self, prompt: Any, rate: int) -> tuple[Any, soxr.ResampleStream | None]:
        """A fresh streaming decoder for ``prompt`` (:meth:`decoder`) with a stream resampler from
        :attr:`sample_rate` to ``rate`` Hz (``None`` when the two match): the state :meth:`rate_pcm`
        reads."""
        r = self.sample_rate
        return self.decoder(prompt), None if r == rate else soxr.ResampleStream(r, rate, 1, "float32")

    def rate_pcm(self, state: tuple[Any, soxr.ResampleStream | None], event: Any) -> np.ndarray:
        """float32 ``[n]`` at the rate of ``state`` (from :meth:`rate_decoder`): the samples ``event``
        completes and, when it finishes, the decoder's last ones (the resampler drained too)."""
        decoder, resampler = state
        pcm = self.decode(decoder, event)
        if event.finished:
            pcm = np.concatenate([pcm, self.flush(decoder)])
        if resampler is not None:
            pcm = resampler.resample_chunk(pcm, last=event.finished)
        return pcm

    def stream(
        self, prompt: Any, max_frames: int, sampling: dict | None = None, request_id: str = "speak"
    ) -> Iterator[np.ndarray]:
        """Speak ``prompt`` alone on the engine: float32 pieces ``[n]`` at :attr:`sample_rate` as its decoder
        completes them (the last one at the end; pieces may be empty). Steps the engine until the request
        finishes, so other requests queued on it advance too.

        Raises TTSInputError: the prompt leaves no room; ValueError: bad sampling keys."""
        decoder = self.decoder(prompt)
        self.add(request_id, prompt, max_frames, sampling)
        while self.engine.has_unfinished():
            for ev in self.engine.step():
                if ev.request_id != request_id:
                    continue
                yield self.decode(decoder, ev)
                if ev.finished:
                    yield self.flush(decoder)
                    return


def refuse(e: Exception, param: str) -> TTSInputError:
    """``e``'s message as the refusal of the request field ``param``."""
    return TTSInputError(str(e), param)


def known_voice(voice: str | None, known: list[str]) -> None:
    """Raises TTSInputError (``voice``) when ``voice`` is given and not one of ``known``."""
    if voice is not None and voice not in known:
        raise TTSInputError(f"unknown voice {voice!r}; this model has {known or 'no named voices'}", "voice")


def no_context(family: str, prompt_len: int, limit: int) -> TTSInputError:
    """The refusal of a prompt of ``prompt_len`` positions that leaves no room in ``limit``."""
    return TTSInputError(
        f"input past the context: the {family} prompt takes {prompt_len} of {limit} positions, leaving no "
        "room for audio",
        "input",
    )
