"""The cascade's TTS stage on Qwen3-TTS (manifest ``tts:`` a Qwen3-TTS checkpoint): the LLM's streamed reply
text → 24 kHz speech in the manifest's voice, every turn's clauses on one continuous-batching engine.

Contract and turn plumbing: :class:`~.engine_tts.EngineTTSStageWorker` (the Piper stage's contract,
:mod:`.tts`): ``pcm`` float32 at 24 kHz.

Voice: the manifest's, except that ``voice`` on a turn's first message (the Realtime API's session
``voice``, passed on by the LLM stage) naming a CustomVoice speaker of the checkpoint speaks that turn in
that speaker; any other name (``alloy``, or any name on a Base / VoiceDesign checkpoint) keeps the
manifest's voice, so a client's default voice never fails a turn.

Each clause (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`) is one utterance on
:class:`~omniduplex.pipeline.speech.qwen3_tts.Qwen3TTSEngine`, its frames streamed through its own
:class:`~omniduplex.models.qwen3_tts.codec_stream.StreamingDecoder`, each frame decoded once (first piece
after ``tts_first_chunk_frames`` frames, 1 = 80 ms of audio, then ``tts_chunk_frames``-frame pieces: the
graph's ``chunking`` keys, 1 and 25 by default). A turn speaks one clause at a time, in order; the next
starts in the step its predecessor ends. The clause's text rides on its first piece (a clause with no
frames still sends its text, with empty ``pcm``), so the chunk texts in order are the reply and an
interrupted reply is cut back at clause granularity, as with Piper. ``tts_ms`` is the time from the
clause's admission to that piece.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from omniduplex.models.qwen3_tts.codec import STREAM_CHUNK, STREAM_FIRST_CHUNK
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE
from omniduplex.models.qwen3_tts.voice import Voice, VoicePrompter
from omniduplex.pipeline.speech.qwen3_tts import Qwen3TTSEngine
from omniduplex.pipeline.stages.engine_tts import EngineTTSStageWorker


class Qwen3TTSStageWorker(EngineTTSStageWorker):
    """Streaming Qwen3-TTS synthesis of every reply in flight.

    Args:
        tts: the engine (talker + code predictor) of a checkpoint loaded with its codec decoder.
        prompter: builds each clause's prompt; ``voice`` the checked voice every reply speaks in.
        output_rate: rate the graph declares for the stage's ``pcm`` (Hz); must be 24000.
        first_max_words, min_words: clause sizes (:class:`~omniduplex.pipeline.text.clauses.ClauseSplitter`).
        max_frames: codec frames per clause at most; ``sampling``: over the reference's defaults.
        chunks: frames of a clause's first waveform piece and of each later one.

    Raises ValueError: ``output_rate`` is not the codec's 24 kHz, the codec decoder is not loaded, or a
    chunk size < 1.
    """

    def __init__(
        self,
        tts: Qwen3TTSEngine,
        prompter: VoicePrompter,
        voice: Voice,
        output_rate: int = SAMPLE_RATE,
        first_max_words: int = 4,
        min_words: int = 3,
        max_frames: int = 1024,
        sampling: dict | None = None,
        chunks: tuple[int, int] = (STREAM_FIRST_CHUNK, STREAM_CHUNK),
    ) -> None:
        if output_rate != SAMPLE_RATE:
            raise ValueError(f"Qwen3-TTS speaks at {SAMPLE_RATE} Hz; the graph declares {output_rate} Hz")
        if tts.model.codec is None:
            raise ValueError("the Qwen3-TTS stage needs the codec decoder loaded")
        self.tts, self.engine = tts, tts.engine  # ``engine``: the KV gauges of stage_stats
        self.prompter, self.voice = prompter, voice
        self.output_rate, self.first_max_words, self.min_words = output_rate, first_max_words, min_words
        self.max_frames, self.sampling = max_frames, dict(sampling or {})
        StreamingDecoder(tts.model.codec, *chunks)  # checks the sizes now, not at the first clause
        self.chunks = chunks
        self._init_turns()
        self._empty = torch.zeros((1, tts.model.codec.cfg.num_quantizers, 0), dtype=torch.long)

    def voice_for(self, name: str | None) -> Voice:
        """The voice of a turn that asks for ``name`` (see the module docstring)."""
        speakers = self.prompter.model.config.speakers
        if (
            self.prompter.variant != "custom_voice"
            or not isinstance(name, str)
            or name.lower() not in speakers
        ):
            return self.voice
        return replace(self.voice, speaker=name.lower())

    def _admit(self, request_id: str, text: str, voice: Voice) -> StreamingDecoder:
        prompt = self.prompter.prompt(text, voice)  # VoiceError is a ValueError
        frames = min(self.max_frames, self.prompter.context - prompt.prefill.shape[0])
        self.tts.add(request_id, prompt, {**self.sampling, "max_tokens": frames})
        return StreamingDecoder(self.tts.model.codec, *self.chunks)

    def _pieces(self, stream: StreamingDecoder, ev) -> list[torch.Tensor]:
        pieces = stream.push(ev.codes.view(1, -1, 1)) if ev.codes is not None else []
        if ev.finished:
            pieces += stream.push(self._empty, final=True)
        return [p.reshape(-1).float() for p in pieces]
