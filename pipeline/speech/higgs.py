"""Higgs Audio v3 on our engine: the talker with continuous batching over a paged KV cache (voice prompts
shared through the prefix cache), ``N`` codebooks per step in the delay pattern, un-delayed code frames
streamed to the audio tokenizer's decoder (:class:`~omniduplex.models.higgs.codec_stream.StreamingDecoder`).

The delay-pattern decode state is a slot table updated in one batched step (the lever,
:mod:`omniduplex.pipeline.engine.higgs_adapter`); ``lever=False`` runs the same rules request by request.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omniduplex.kernels import cpu_ops
from omniduplex.models.higgs.codec_stream import StreamingDecoder
from omniduplex.models.higgs.model import Higgs, is_higgs
from omniduplex.models.higgs.presets import PRESETS
from omniduplex.models.higgs.prompt import HiggsPrompt, PromptError, Voice, build_prompt, check_codes
from omniduplex.models.higgs.rules import RULES, V3
from omniduplex.pipeline.engine.higgs_adapter import ENDED, PLACEHOLDER_ID, HiggsAdapter
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.speech.family_runner import FamilyRunner, VoiceInfo, known_voice, no_context, refuse
from omniduplex.pipeline.speech.frame_engine import FrameEngine
from omniduplex.pipeline.speech.registry import TTSFamily, init_checkpoint, register_family
from omniduplex.pipeline.stages.engine_build import EngineSettings

NAME = "higgs"
"""The family's name (``init-model --arch higgs-PRESET``, ``GET /v1/audio/voices``)."""

DEFAULT_SAMPLING = dict(temperature=1.0, top_k=0, top_p=1.0, max_tokens=2048)
"""sglang-omni ``HiggsTtsState`` defaults (temperature 1.0, no top-k / top-p, 2048 new steps)."""


class HiggsEngine(FrameEngine):
    """Continuous-batching Higgs talker of one loaded checkpoint.

    Args:
        model: a checkpoint loaded with at least the talker.
        rules: ``"v3"`` (Higgs v3 serving, default) or ``"transformers"`` (``transformers``' v2 generate), see
            :mod:`omniduplex.models.higgs.rules`.
        lever: batched slot-table decode state (True) or a per-request loop (False).
        max_steps: most steps one request may take.
        engine: the engine's settings (:class:`EngineSettings`).

    Raises:
        ValueError: no talker loaded, or an unknown rule set.
    """

    def __init__(
        self,
        model: Higgs,
        rules: str = V3.name,
        lever: bool = True,
        max_steps: int = 2048,
        engine: EngineSettings = EngineSettings(),
    ) -> None:
        if model.talker is None:
            raise ValueError("HiggsEngine needs the talker loaded")
        if rules not in RULES:
            raise ValueError(f"unknown rules {rules!r}; choose from {sorted(RULES)}")
        self.model, self.cfg = model, model.config
        cpu_ops.attach(model.talker)
        self.adapter = HiggsAdapter(model.talker, RULES[rules], max_steps=max_steps, lever=lever)
        self.max_len = min(self.cfg.text.max_position_embeddings, engine.num_blocks * 16)
        self.engine = engine.build(self.adapter, model.talker.text_embedding.weight, "higgs")

    def prompt(
        self, text: str, voice: str | Voice | None = None, ref_codes=None, ref_text: str | None = None
    ):
        """The :class:`HiggsPrompt` of ``text`` in a named voice, or cloned from ``ref_codes`` ``[T, N]`` (+
        ``ref_text``).

        Raises:
            PromptError: an unknown voice (the message lists the known ones), both a voice and reference
                codes,
                bad codes, empty text, text past the context, or a checkpoint without a tokenizer.
        """
        if self.model.tokenizer is None:
            raise PromptError(f"{self.model.path} has no tokenizer.json")
        if isinstance(voice, str):
            if voice not in self.model.voices:
                known = sorted(self.model.voices) or "none"
                raise PromptError(f"unknown voice {voice!r}; this checkpoint has: {known}")
            voice = self.model.voices[voice]
        if ref_codes is not None:
            if voice is not None:
                raise PromptError("give a voice or reference codes, not both")
            voice = Voice("reference", check_codes(ref_codes, self.cfg), ref_text)
        return build_prompt(self.model.tokenizer, self.cfg, text, voice, max_len=self.max_len)

    def add(self, request_id: str, prompt: HiggsPrompt, sampling: dict | None = None) -> None:
        """Queue one utterance. ``sampling``: :class:`SamplingParams` fields over :data:`DEFAULT_SAMPLING`
        (``temperature=0`` is greedy; ``max_tokens`` counts steps, i.e. frames plus the delay).

        Raises:
            PromptError: prompt plus ``max_tokens`` past the context.
            ValueError: bad sampling parameters, ``max_tokens`` over ``max_steps``, a duplicate id, or a
                prompt larger than the KV cache.
            TypeError: ``prompt`` is not a :class:`HiggsPrompt`.
        """
        sp = SamplingParams(**{**DEFAULT_SAMPLING, **(sampling or {}), "stop_token_ids": (ENDED,)})
        if sp.max_tokens > self.adapter.max_steps:
            raise ValueError(f"max_tokens={sp.max_tokens} > max_steps={self.adapter.max_steps}")
        if not isinstance(prompt, HiggsPrompt):
            raise TypeError(
                f"prompt must be a HiggsPrompt (see HiggsEngine.prompt), got {type(prompt).__name__}"
            )
        if len(prompt) + sp.max_tokens > self.max_len:
            raise PromptError(
                f"text past the context: {len(prompt)} prompt rows + {sp.max_tokens} steps > {self.max_len}"
            )
        ids = prompt.ids.clamp(min=PLACEHOLDER_ID).tolist()
        self.engine.add_request(Request(request_id, ids, sp, extra={"prompt": prompt}))


@torch.no_grad()
def synthesize(
    model: Higgs,
    text: str,
    voice: str | None = None,
    sampling: dict | None = None,
    ref_codes=None,
    ref_text: str | None = None,
    rules: str = V3.name,
) -> tuple[torch.Tensor, int]:
    """Speak ``text`` alone on a fresh engine, streaming frames through the decoder: ``(pcm fp32 [samples],
    sample_rate)``.

    Raises:
        PromptError: as :meth:`HiggsEngine.prompt`, or a checkpoint loaded without its codec.
    """
    if model.codec is None:
        raise PromptError("speaking needs the codec (load the 'codec' part)")
    engine = HiggsEngine(model, rules=rules, engine=EngineSettings(num_blocks=256, max_num_seqs=1))
    engine.add("say", engine.prompt(text, voice, ref_codes, ref_text), sampling)
    stream = StreamingDecoder(model.codec)
    pieces = []
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.codes is not None:
                pieces.append(stream.feed(ev.codes[None]))
    pieces.append(stream.flush())
    return torch.cat(pieces), model.codec.cfg.sample_rate


class HiggsRunner(FamilyRunner):
    """Higgs Audio v3: the lever is the batched delay-pattern decode state (:class:`HiggsEngine`)."""

    family = NAME

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from omniduplex.models.higgs.model import load_higgs

        self.model = load_higgs(model_dir)
        sizes = EngineSettings(num_blocks=num_blocks, max_num_seqs=max_num_seqs)
        self.engine = HiggsEngine(self.model, lever=lever, engine=sizes)
        self.sample_rate = self.ref_rate = self.model.codec.cfg.sample_rate

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(n) for n in sorted(self.model.voices)]

    def prompt(self, text, voice=None, ref=None, ref_text=None, instructions=None, language="auto"):
        from omniduplex.models.higgs.prompt import PromptError, check_reference_audio

        if ref is not None:
            try:
                check_reference_audio(ref[0], ref[1], self.model.config)  # always refuses, with the reason
            except PromptError as e:
                raise refuse(e, "ref_audio") from e
        known_voice(voice, [v.name for v in self.voices()])
        try:
            return self.engine.prompt(text, voice)
        except PromptError as e:
            raise refuse(e, "input") from e

    def budget(self, prompt, max_frames):
        # a step per delayed row: N − 1 more steps than frames (the delay pattern's tail)
        n, limit = self.model.config.num_codebooks, self.engine.max_len
        room = min(limit - len(prompt), self.engine.adapter.max_steps)
        if room < n:
            raise no_context(self.family, len(prompt), limit)
        return {"max_tokens": min(max_frames + n - 1, room)}

    def decoder(self, prompt):
        from omniduplex.models.higgs.codec_stream import StreamingDecoder

        return StreamingDecoder(self.model.codec)


def _init(out: Path, preset: str, seed: int, variant: str | None) -> dict:
    from omniduplex.models.higgs.model import load_higgs
    from omniduplex.models.higgs.presets import write_higgs_checkpoint

    write = lambda: write_higgs_checkpoint(out, preset, seed)  # noqa: E731
    return init_checkpoint(out, preset, write, load_higgs, "HiggsMultimodalQwen3ForConditionalGeneration")


register_family(
    TTSFamily(
        NAME,
        detect=is_higgs,
        runner=HiggsRunner,
        sample_rate=24_000,
        presets=PRESETS,
        init=_init,
        bench="omniduplex.benchmarks.tts_higgs:bench",
    )
)
