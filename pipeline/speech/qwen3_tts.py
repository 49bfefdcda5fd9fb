"""Qwen3-TTS on our engine: talker + code predictor with continuous batching over a paged KV cache (voice
prompts shared through the prefix cache), codec frames streamed to the 12 Hz decoder.

The engine's :class:`~.engine.adapters.TalkerAdapter` drives the talker as it drives Qwen3-Omni's: codebook
0 is sampled by the engine, the code predictor fills the frame's residual codebooks for all sampled rows of a
step at once, and the next input row (frame embedding + the next text row, ``tts_pad`` once the text is
used up) is appended. The whole text is known up front, so it is queued at admission.

Differences from the reference's ``generate`` (qwen-tts 0.1.1): EOS is not banned for the first two
steps (``min_new_tokens=2``: the engine has no per-step ban), and when sampling, the code predictor uses
top-p 0.8 (the adapter's Qwen3-Omni setting; the reference's is 1.0). Greedy frames are identical to
:func:`omniduplex.models.qwen3_tts.generate.generate_codes` unless EOS wins one of the first two steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from omniduplex.kernels import cpu_ops
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.config import ARCHITECTURE, VARIANTS
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE, Qwen3TTS, is_qwen3_tts
from omniduplex.models.qwen3_tts.presets import PRESETS
from omniduplex.models.qwen3_tts.prompt import PromptError, TalkerPrompt
from omniduplex.pipeline.engine.adapters import TalkerAdapter
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.speech.family_runner import FamilyRunner, TTSInputError, VoiceInfo, no_context
from omniduplex.pipeline.speech.frame_engine import FrameEngine
from omniduplex.pipeline.speech.registry import TTSFamily, init_checkpoint, register_family
from omniduplex.pipeline.stages.engine_build import EngineSettings

NAME = "qwen3-tts"
"""The family's name (``init-model --arch qwen3-tts``, ``GET /v1/audio/voices``)."""

DEFAULT_SAMPLING = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, max_tokens=2048)
"""``Qwen3TTSForConditionalGeneration.generate`` defaults (qwen-tts 0.1.1; max_new_tokens 4096 there)."""


class Qwen3TTSEngine(FrameEngine):
    """Continuous-batching talker of one loaded checkpoint.

    Args:
        model: a checkpoint loaded with at least the talker.
        engine: the engine's settings (:class:`EngineSettings`); with ``cuda_graphs``, decode steps and the
            code predictor replay as CUDA graphs on a CUDA device.
    """

    def __init__(
        self,
        model: Qwen3TTS,
        engine: EngineSettings = EngineSettings(),
    ) -> None:
        if model.talker is None:
            raise ValueError("Qwen3TTSEngine needs the talker loaded")
        self.model, self.talker = model, model.talker
        cpu_ops.attach(self.talker)  # C++ KV write + decode attention where they build (~15% of a step)
        with torch.no_grad():
            pad = self.talker.text_embed(torch.tensor([model.config.text_ids["tts_pad"]]))[0]
        self.adapter = TalkerAdapter(self.talker, pad)
        self.engine = engine.build(self.adapter, self.talker.codec_head.weight, "tts_talker")

    def add(self, request_id: str, prompt: TalkerPrompt, sampling: dict | None = None) -> None:
        """Queue one utterance. ``sampling``: :class:`SamplingParams` fields over :data:`DEFAULT_SAMPLING`
        (``temperature=0`` is greedy).

        Raises ValueError: bad sampling parameters, a duplicate id, or a prompt larger than the KV cache.
        """
        sp = {**DEFAULT_SAMPLING, **(sampling or {})}
        sp.update(
            stop_token_ids=(self.model.config.codec_ids["eos"],), suppress_token_ids=self.adapter.suppress_ids
        )
        dtype = self.talker.codec_head.weight.dtype
        req = Request(
            request_id,
            [self.model.config.text_ids["tts_pad"]] * prompt.prefill.shape[0],
            SamplingParams(**sp),
            prompt_embeds=prompt.prefill.to(dtype),
            embed_inputs=True,
        )
        self.engine.add_request(req)
        if prompt.trailing.shape[0]:
            self.adapter.feed_text(req, prompt.trailing.to(dtype))
        self.adapter.end_text(req)


@torch.no_grad()
def stream_speech(
    engine: Qwen3TTSEngine, prompt: TalkerPrompt, sampling: dict | None = None
) -> Iterator[torch.Tensor]:
    """Speak one utterance alone on ``engine``: yields 24 kHz waveform pieces fp32 ``[n]`` as the streaming
    decoder completes them (first after one frame, then every 25 frames, the rest at the end).

    Raises PromptError when the model has no codec decoder loaded.
    """
    codec = engine.model.codec
    if codec is None:
        raise PromptError("speaking needs the codec decoder (load the 'codec' part)")
    stream = StreamingDecoder(codec)
    engine.add("speak", prompt, sampling)
    done = False
    while not done:
        for ev in engine.step():
            pieces = stream.push(ev.codes.view(1, -1, 1)) if ev.codes is not None else []
            if ev.finished:
                done = True
                pieces += stream.push(
                    torch.zeros((1, codec.cfg.num_quantizers, 0), dtype=torch.long), final=True
                )
            for p in pieces:
                yield p.reshape(-1).float()


class Qwen3TTSRunner(FamilyRunner):
    """Qwen3-TTS (24 kHz out) as a :class:`FamilyRunner`: CustomVoice speakers (the first is the default),
    VoiceDesign ``instructions`` (required), Base cloning from a 24 kHz clip (≥ 1 s) with its transcript as
    in-context prompt (:class:`~omniduplex.models.qwen3_tts.voice.VoicePrompter` does every check). The
    lever (``lever``) is the engine's prefix cache.

    Args: as :class:`FamilyRunner`. Raises CheckpointError: not loadable (a missing tensor is named)."""

    family = NAME

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from omniduplex.models.forward_batch import BLOCK_SIZE
        from omniduplex.models.qwen3_tts.model import load_qwen3_tts
        from omniduplex.models.qwen3_tts.voice import VoicePrompter
        from omniduplex.models.tokenizer import load_tokenizer

        self.model = load_qwen3_tts(model_dir)
        sizes = EngineSettings(num_blocks=num_blocks, max_num_seqs=max_num_seqs, enable_prefix_caching=lever)
        self.engine = Qwen3TTSEngine(self.model, sizes)
        self.context = min(self.model.config.talker.max_position_embeddings, num_blocks * BLOCK_SIZE)
        self.prompter = VoicePrompter(self.model, load_tokenizer(model_dir), self.context)
        variant = self.model.config.variant
        self.cloning, self.instructions = variant == "base", variant != "base"
        self.sample_rate = self.ref_rate = SAMPLE_RATE
        self._empty = torch.zeros((1, self.model.codec.cfg.num_quantizers, 0), dtype=torch.long)

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(n) for n in self.prompter.voices]

    def prompt(self, text, voice=None, ref=None, ref_text=None, instructions=None, language="auto"):
        from omniduplex.models.qwen3_tts.voice import MIN_REF_SECONDS, VoiceError

        wav = None
        if ref is not None:
            wav, rate = ref
            # a variant without cloning: the prompter refuses the clip with the reason
            if self.cloning and rate != SAMPLE_RATE:
                raise TTSInputError(f"ref_audio is {rate} Hz; send {SAMPLE_RATE} Hz audio", "ref_audio")
            if self.cloning and wav.shape[0] < MIN_REF_SECONDS * SAMPLE_RATE:
                raise TTSInputError(f"ref_audio is shorter than {MIN_REF_SECONDS:g} s", "ref_audio")
        if voice is None and self.prompter.voices:
            voice = self.prompter.voices[0]
        try:
            v = self.prompter.voice(voice, instructions, language, wav, ref_text)
            return self.prompter.prompt(text, v)
        except VoiceError as e:
            raise TTSInputError(str(e), e.param, e.code) from e

    def budget(self, prompt, max_frames):
        room = self.context - prompt.prefill.shape[0]
        if room < 1:
            raise no_context(self.family, prompt.prefill.shape[0], self.context)
        return {"max_tokens": min(max_frames, room)}

    def decoder(self, prompt):
        return StreamingDecoder(self.model.codec)

    def _decode(self, decoder, event):
        pieces = decoder.push(event.codes.view(1, -1, 1)) if event.codes is not None else []
        return torch.cat(pieces) if pieces else torch.zeros(0)

    def flush(self, decoder) -> np.ndarray:
        pieces = decoder.push(self._empty, final=True)
        return (
            torch.cat([p.reshape(-1) for p in pieces]).float().cpu().numpy()
            if pieces
            else np.zeros(0, np.float32)
        )


def _init(out: Path, preset: str, seed: int, variant: str | None) -> dict:
    from omniduplex.models.qwen3_tts.model import load_qwen3_tts
    from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint

    variant = variant or "custom_voice"
    write = lambda: write_tts_checkpoint(out, preset, seed, variant)  # noqa: E731
    return init_checkpoint(out, preset, write, load_qwen3_tts, ARCHITECTURE, variant=variant)


def _speakers(model_dir: Path) -> list[str]:
    from omniduplex.models.checkpoint import read_config
    from omniduplex.models.qwen3_tts.config import TTSConfig

    return sorted(TTSConfig.from_dict(read_config(model_dir)).speakers)


register_family(
    TTSFamily(
        NAME,
        detect=is_qwen3_tts,
        runner=Qwen3TTSRunner,
        sample_rate=SAMPLE_RATE,
        cloning=True,
        presets=PRESETS,
        init=_init,
        variants=VARIANTS,
        voice_names=_speakers,
        service="omniduplex.app.host.speech.qwen3_graph:qwen3_service",
        bench="omniduplex.benchmarks.tts_graph:bench",
    )
)
