"""Fish Speech S2 Pro on our engine: the slow AR with continuous batching over a paged KV cache (voice prompts
shared through the prefix cache), the fast AR filling each step's frames in one batched call, the frames
streamed to the 44.1 kHz DAC decoder.

The engine's :class:`~.engine.adapters.TalkerAdapter` drives it as it drives Qwen3-TTS's talker: the engine
samples codebook 0 among the semantic tokens and ``<|im_end|>`` (:meth:`~omniduplex.models.fish_speech.model
.FishLM.compute_logits`), the fast AR fills codebooks 1..N−1 of all the step's frames at once, and the next
input row is the frame's embedding (there is no text stream during decoding: the prompt holds the text).

Levers (both on by default, ``decode_fast_path`` / ``static_buffers`` off for comparisons; same codes):

- the q_len = 1 decode-attention fast path of the slow AR (:func:`omniduplex.kernels.attention.gqa_decode`:
  one work item per sequence and KV head over its query heads, each K/V block read once per GQA group; falls
  back to the dispatcher outside its shape, and whenever a step holds a prefill chunk);
- the fast AR's buffers (input rows, positions and rotary table, per-layer K/V) allocated once and reused
  every step (:class:`~omniduplex.models.qwen3_omni.code_predictor.PredictorWorkspace`).

Differences from Fish Audio's reference generation (``fish_speech/models/text2semantic/inference.py``):
sampling is the engine's (temperature, top-k, top-p, seeded per request; the fast codebooks use the
request's settings as the reference does) without the reference's repetition-aware resampling of codebook
0; the id that ends a request at ``max_tokens`` gets no frame (as ``<|im_end|>`` gets none). Greedy frames
are those of a sequential run of the published math (``tests/fish_speech_reference.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from omniduplex.kernels import cpu_ops
from omniduplex.kernels.attention import set_decode_fast_path
from omniduplex.models.codecs.dac import DacCodec
from omniduplex.models.codecs.dac_stream import DacDecodeStream
from omniduplex.models.fish_speech.config import SAMPLE_RATE
from omniduplex.models.fish_speech.load import FishSpeech, is_fish_speech
from omniduplex.models.fish_speech.presets import PRESETS
from omniduplex.models.fish_speech.prompt import (
    DEFAULT_VOICE,
    FishPrompt,
    FishVoice,
    PromptError,
    build_prompt,
    clone_voice,
)
from omniduplex.pipeline.engine.adapters import TalkerAdapter
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.speech.family_runner import FamilyRunner, VoiceInfo, known_voice, no_context, refuse
from omniduplex.pipeline.speech.frame_engine import FrameEngine
from omniduplex.pipeline.speech.registry import TTSFamily, init_checkpoint, register_family
from omniduplex.pipeline.stages.engine_build import EngineSettings

NAME = "fish-speech"
"""The family's name (``init-model --arch fish-speech-PRESET``, ``GET /v1/audio/voices``)."""

_ids = itertools.count()
DEFAULT_SAMPLING = dict(temperature=0.8, top_k=30, top_p=0.8, repetition_penalty=1.0, max_tokens=1024)
"""Fish Audio's serving defaults (temperature 0.8, top-p 0.8, top-k 30)."""


class FishSpeechEngine(FrameEngine):
    """Continuous-batching Dual-AR generation of one loaded checkpoint.

    Args:
        model: a checkpoint loaded with at least ``lm`` (``codec_encoder`` too for :meth:`register_voice`).
        tokenizer: its ``tokenizer.json``.
        engine: the engine's settings (:class:`EngineSettings`).
        decode_fast_path, static_buffers: the levers (module docstring).
    """

    def __init__(
        self,
        model: FishSpeech,
        tokenizer: Tokenizer,
        engine: EngineSettings = EngineSettings(),
        decode_fast_path: bool = True,
        static_buffers: bool = True,
    ) -> None:
        if model.lm is None:
            raise ValueError("FishSpeechEngine needs the 'lm' part loaded")
        self.model, self.lm, self.tokenizer = model, model.lm, tokenizer
        cpu_ops.attach(self.lm)  # C++ KV write, RMSNorm, RoPE and SiLU·up where they build
        self.set_levers(decode_fast_path, static_buffers)
        dtype = self.lm.model.embeddings.weight.dtype
        pad = torch.zeros(
            self.lm.cfg.slow.hidden_size, dtype=dtype, device=self.lm.model.embeddings.weight.device
        )
        self.adapter = TalkerAdapter(
            self.lm, pad, code0_embed=self.lm.code0_embedding, predictor_filters=None
        )
        self.engine = engine.build(self.adapter, self.lm.model.embeddings.weight, "fish-speech")
        self.voices: dict[str, FishVoice] = {}

    def set_levers(self, decode_fast_path: bool, static_buffers: bool) -> None:
        """Turn the two levers on or off (between steps; the codes do not change)."""
        set_decode_fast_path(self.lm.model, decode_fast_path)
        self.lm.code_predictor.static_buffers = static_buffers

    # -- voices and prompts --------------------------------------------------------------------------
    def register_voice(self, name: str, pcm, sample_rate: int, transcript: str) -> FishVoice:
        """Clone a voice from a reference clip (float ``[samples]`` at 44.1 kHz) and its transcript; later
        prompts name it as ``voice``.

        Raises PromptError: a bad clip or transcript (see :func:`~omniduplex.models.fish_speech.prompt
        .clone_voice`), the reserved name ``default``, or no codec encoder loaded."""
        if name == DEFAULT_VOICE or not name:
            raise PromptError(f"voice name {name!r} is reserved")
        if self.model.codec_encoder is None:
            raise PromptError("cloning a voice needs the codec encoder (load the 'codec_encoder' part)")
        voice = clone_voice(
            self.model.codec_encoder, name, pcm, sample_rate, transcript, self.lm.cfg.num_codebooks
        )
        self.voices[name] = voice
        return voice

    def voice_names(self) -> list[str]:
        """The voices a request may name: ``default`` and every registered clone."""
        return [DEFAULT_VOICE, *sorted(self.voices)]

    def prompt(self, text: str, voice: str | FishVoice | None = None) -> FishPrompt:
        """The prompt of ``text`` spoken in ``voice`` (a registered name, a :class:`FishVoice`, or ``None`` /
        ``"default"``: the model's own voice).

        Raises PromptError: an unknown voice (the message lists the known ones), empty text, a control
        token."""
        if isinstance(voice, str) and voice != DEFAULT_VOICE:
            if voice not in self.voices:
                raise PromptError(f"unknown voice {voice!r}; known voices: {self.voice_names()}")
            voice = self.voices[voice]
        return build_prompt(self.lm, self.tokenizer, text, voice if isinstance(voice, FishVoice) else None)

    # -- requests ------------------------------------------------------------------------------------
    def add(self, request_id: str, prompt: FishPrompt, sampling: dict | None = None) -> None:
        """Queue one utterance. ``sampling``: :class:`SamplingParams` fields over :data:`DEFAULT_SAMPLING`
        (``temperature=0`` is greedy; ``max_tokens`` counts codebook-0 ids, at most one frame each).

        Raises:
            PromptError: the prompt plus ``max_tokens`` frames exceed the context (``max_seq_len``).
            ValueError: bad sampling parameters, a duplicate id, or a prompt larger than the KV cache.
        """
        sp = {**DEFAULT_SAMPLING, **(sampling or {})}
        limit = self.lm.cfg.max_seq_len
        if len(prompt) + sp["max_tokens"] > limit:
            raise PromptError(
                f"text past the context: {len(prompt)} prompt tokens + max_tokens {sp['max_tokens']} > "
                f"max_seq_len {limit}"
            )
        sp.update(stop_token_ids=(self.lm.cfg.codebook_size,))  # <|im_end|> in the compact logits
        req = Request(
            request_id,
            list(prompt.ids),
            SamplingParams(**sp),
            prompt_embeds=prompt.embeds.to(self.adapter.tts_pad.dtype),
            embed_inputs=True,
        )
        self.engine.add_request(req)
        self.adapter.end_text(req)  # no text stream: every decode row is the frame's embedding alone


class FishStreamDecoder:
    """One utterance's streaming DAC decode: every frame decoded once, per-layer state kept between chunks
    (:class:`~omniduplex.models.codecs.dac_stream.DacDecodeStream`); the concatenated output equals the
    one-shot ``codec.decode`` of all frames (float rounding).

    ``feed(frames)``: int64 ``[F, num_codebooks]`` (``F >= 0``) → float32 ``[n]`` samples at 44.1 kHz, the
    ones no later frame can change. ``flush()`` → the rest; the decoder is spent afterwards.

    Raises ValueError: frames of the wrong shape or ids outside the codebook, a feed after ``flush``.
    """

    def __init__(self, codec: DacCodec) -> None:
        self.codec = codec
        self.stream = DacDecodeStream(codec)
        self.frames = 0

    def feed(self, frames: torch.Tensor) -> torch.Tensor:
        frames = torch.as_tensor(frames, dtype=torch.int64)
        if frames.dim() != 2 or frames.shape[1] != self.codec.cfg.n_codebooks:
            raise ValueError(f"frames must be [F, {self.codec.cfg.n_codebooks}], got {list(frames.shape)}")
        self.frames += frames.shape[0]
        dev = next(self.codec.parameters()).device
        return self.stream.push(frames.t()[None].to(dev)).reshape(-1).float().cpu()

    def flush(self) -> torch.Tensor:
        return self.stream.flush().reshape(-1).float().cpu()


@torch.no_grad()
def synthesize(
    model: FishSpeech,
    tokenizer: Tokenizer,
    text: str,
    voice: str | FishVoice | None = None,
    sampling: dict | None = None,
    engine: FishSpeechEngine | None = None,
    chunk_frames: Sequence[int] = (1,),
) -> tuple[np.ndarray, int]:
    """Speak ``text`` alone: ``(pcm float32 [samples], 44100)``, streamed through :class:`FishStreamDecoder`
    in pieces of ``chunk_frames`` frames (cycled).

    Raises:
        PromptError: a bad request (see :meth:`FishSpeechEngine.prompt` / :meth:`FishSpeechEngine.add`) or no
            codec decoder loaded.
        ValueError: ``engine`` has requests in flight (their events would be lost here).
    """
    if model.codec is None:
        raise PromptError("speaking needs the codec decoder (load the 'codec' part)")
    engine = engine or FishSpeechEngine(model, tokenizer)
    if engine.has_unfinished():
        raise ValueError(
            "synthesize speaks alone: the engine has other requests in flight (read their events)"
        )
    decoder = FishStreamDecoder(model.codec)
    rid = f"synthesize-{next(_ids)}"
    engine.add(rid, engine.prompt(text, voice), sampling)
    pending: list[torch.Tensor] = []
    pieces: list[torch.Tensor] = []
    sizes = list(chunk_frames)
    done = False
    while not done:
        for ev in engine.step():
            if ev.codes is not None:
                pending.append(ev.codes)
            if len(pending) >= sizes[0] or (ev.finished and pending):
                pieces.append(decoder.feed(torch.stack(pending)))
                pending, sizes = [], sizes[1:] + sizes[:1]
            done = done or ev.finished
    pieces.append(decoder.flush())
    return torch.cat(pieces).numpy(), SAMPLE_RATE


class FishRunner(FamilyRunner):
    """Fish Speech S2 Pro: the levers are the q_len = 1 decode-attention fast path and the fast AR's static
    buffers (:class:`FishSpeechEngine`)."""

    family, cloning = NAME, True

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from omniduplex.models.fish_speech.config import SAMPLE_RATE
        from omniduplex.models.fish_speech.load import load_fish_speech
        from omniduplex.models.tokenizer import load_tokenizer

        self.model = load_fish_speech(model_dir)
        self.engine = FishSpeechEngine(
            self.model,
            load_tokenizer(model_dir),
            EngineSettings(num_blocks=num_blocks, max_num_seqs=max_num_seqs),
            decode_fast_path=lever,
            static_buffers=lever,
        )
        self.sample_rate = self.ref_rate = SAMPLE_RATE
        self.limit = min(self.model.lm.cfg.max_seq_len, num_blocks * 16)

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(n, i > 0) for i, n in enumerate(self.engine.voice_names())]

    def prompt(self, text, voice=None, ref=None, ref_text=None, instructions=None, language="auto"):
        from omniduplex.models.fish_speech.prompt import PromptError, clone_voice

        known_voice(voice, [v.name for v in self.voices()])
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
                raise refuse(e, "ref_text" if "ref_text" in str(e) else "ref_audio") from e
        try:
            return self.engine.prompt(text, voice)
        except PromptError as e:
            raise refuse(e, "input") from e

    def register(self, name, ref, ref_text=None):
        from omniduplex.models.fish_speech.prompt import PromptError

        try:
            self.engine.register_voice(name, ref[0], ref[1], ref_text or "")
        except PromptError as e:
            raise refuse(e, "ref_text" if "ref_text" in str(e) else "ref_audio") from e
        return name

    def budget(self, prompt, max_frames):
        room = self.limit - len(prompt)
        if room < 1:
            raise no_context(self.family, len(prompt), self.limit)
        return {"max_tokens": min(max_frames, room)}

    def decoder(self, prompt):
        return FishStreamDecoder(self.model.codec)


def _init(out: Path, preset: str, seed: int, variant: str | None) -> dict:
    from omniduplex.models.fish_speech.load import load_fish_speech
    from omniduplex.models.fish_speech.presets import write_fish_checkpoint

    write = lambda: write_fish_checkpoint(out, preset, seed)  # noqa: E731
    return init_checkpoint(out, preset, write, load_fish_speech, "fish_qwen3_omni")


register_family(
    TTSFamily(
        NAME,
        detect=is_fish_speech,
        runner=FishRunner,
        sample_rate=SAMPLE_RATE,
        cloning=True,
        presets=PRESETS,
        init=_init,
        bench="omniduplex.benchmarks.tts_fish:bench",
    )
)
