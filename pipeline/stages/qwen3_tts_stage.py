"""The cascade's TTS stage on Qwen3-TTS (manifest ``tts:`` a Qwen3-TTS checkpoint): the LLM's streamed reply
text → 24 kHz speech in the manifest's voice, every turn's clauses on one continuous-batching engine.

Contract: the same as the Piper stage (:mod:`.tts`). Input: one message per LLM token, meta ``text`` = its
text delta, ``last`` when the reply's text is complete; ``skipped`` on the first message is passed through.
Output: ``pcm`` float32 ``[n]`` at 24 kHz, meta ``text``, ``chunk`` (0, 1, ... per turn) and ``tts_ms``,
``last=False``; then one ``last=True`` message (empty ``pcm``, meta ``text`` "").

Voice: the manifest's, except that ``voice`` on a turn's first message (the Realtime API's session
``voice``, passed on by the LLM stage) naming a CustomVoice speaker of the checkpoint speaks that turn in
that speaker; any other name (``alloy``, or any name on a Base / VoiceDesign checkpoint) keeps the
manifest's voice, so a client's default voice never fails a turn.

Each clause (:class:`~omniduplex.pipeline.clauses.ClauseSplitter`) is one utterance on
:class:`~omniduplex.pipeline.qwen3_tts.Qwen3TTSEngine`, its frames streamed through its own
:class:`~omniduplex.models.qwen3_tts.codec_stream.StreamingDecoder`, each frame decoded once (first piece
after ``tts_first_chunk_frames`` frames, 1 = 80 ms of audio, then ``tts_chunk_frames``-frame pieces: the
graph's ``chunking`` keys, 1 and 25 by default). A turn speaks one clause at a time, in order; the next
starts in the step its predecessor ends. The clause's text rides on its first piece (a clause with no
frames still sends its text, with empty ``pcm``), so the chunk texts in order are the reply and an
interrupted reply is cut back at clause granularity, as with Piper. ``tts_ms`` is the time from the
clause's admission to that piece.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

import torch

from omniduplex.models.qwen3_tts.codec import STREAM_CHUNK, STREAM_FIRST_CHUNK
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.model import SAMPLE_RATE
from omniduplex.models.qwen3_tts.voice import Voice, VoiceError, VoicePrompter
from omniduplex.pipeline.clauses import ClauseSplitter
from omniduplex.pipeline.messages import StageMessage
from omniduplex.pipeline.qwen3_tts import Qwen3TTSEngine
from omniduplex.pipeline.stages.contract import EngineGauges

log = logging.getLogger(__name__)

PASSED_OPTIONS = ("skipped",)
_ABORTED_MEMORY = 1024


@dataclass
class _Turn:
    splitter: ClauseSplitter
    options: dict
    voice: Voice
    clauses: deque[str] = field(default_factory=deque)
    finished: bool = False  # the reply's text is complete
    chunk: int = 0  # messages emitted
    active: str | None = None  # engine request id of the clause being spoken
    stream: StreamingDecoder | None = None
    text: str = ""  # the active clause's text, until its first piece carries it
    started_at: float = 0.0


class Qwen3TTSStageWorker(EngineGauges):
    """Streaming Qwen3-TTS synthesis of every reply in flight.

    Args:
        tts: the engine (talker + code predictor) of a checkpoint loaded with its codec decoder.
        prompter: builds each clause's prompt; ``voice`` the checked voice every reply speaks in.
        output_rate: rate the graph declares for the stage's ``pcm`` (Hz); must be 24000.
        first_max_words, min_words: clause sizes (:class:`~omniduplex.pipeline.clauses.ClauseSplitter`).
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
        self.turns: dict[str, _Turn] = {}
        self._by_request: dict[str, str] = {}  # engine request id → turn id
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._n = 0
        self._empty = torch.zeros((1, tts.model.codec.cfg.num_quantizers, 0), dtype=torch.long)

    def submit(self, msg: StageMessage) -> None:
        """Add a text delta (``meta["text"]``) to its turn; ``last`` closes the turn's text.

        Raises ValueError: ``meta["text"]`` is not a string (this turn only).
        """
        rid = msg.request_id
        if rid in self._aborted:
            return
        delta = msg.meta.get("text", "")
        if not isinstance(delta, str):
            raise ValueError(f"turn {rid}: meta['text'] must be a str, got {type(delta).__name__}")
        t = self.turns.get(rid)
        if t is None:
            opts = {k: msg.meta[k] for k in PASSED_OPTIONS if k in msg.meta}
            splitter = ClauseSplitter(self.first_max_words, self.min_words)
            t = self.turns[rid] = _Turn(splitter, opts, self.voice_for(msg.meta.get("voice")))
        t.clauses.extend(t.splitter.push(delta))
        if msg.last and not t.finished:
            t.clauses.extend(t.splitter.flush())
            t.finished = True

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

    def abort(self, request_id: str) -> None:
        """Drop the turn at once (its clause leaves the engine); later text for it is ignored."""
        t = self.turns.pop(request_id, None)
        if t is not None and t.active is not None:
            self.tts.abort(t.active)
            self._by_request.pop(t.active, None)
        self._aborted[request_id] = None
        while len(self._aborted) > _ABORTED_MEMORY:
            self._aborted.popitem(last=False)

    def has_work(self) -> bool:
        return self.tts.has_unfinished() or any(
            t.active is None and (t.clauses or t.finished) for t in self.turns.values()
        )

    def step(self) -> list[StageMessage]:
        """Admit the next clause of every idle turn (or close a turn whose text is all spoken), then one
        engine step: every piece the decoders complete goes out."""
        outs: list[StageMessage] = []
        for rid, t in list(self.turns.items()):
            while t.active is None and t.clauses:
                self._start(rid, t, outs)
            if t.active is None and t.finished and not t.clauses:
                outs.append(self._last(rid, t))
        if not self.tts.has_unfinished():
            return outs
        for ev in self.tts.step():
            rid = self._by_request.get(ev.request_id)
            t = self.turns.get(rid) if rid is not None else None
            if t is None:
                continue
            pieces = t.stream.push(ev.codes.view(1, -1, 1)) if ev.codes is not None else []
            if ev.finished:
                pieces += t.stream.push(self._empty, final=True)
            for p in pieces:
                outs.append(self._message(rid, t, p.reshape(-1).float()))
            if ev.finished:
                if t.text:  # no frames at all: the clause's text still goes out
                    outs.append(self._message(rid, t, torch.zeros(0)))
                del self._by_request[ev.request_id]
                t.active = t.stream = None
                while t.clauses and t.active is None:
                    self._start(rid, t, outs)
                if t.active is None and t.finished and not t.clauses:
                    outs.append(self._last(rid, t))
        return outs

    def _start(self, rid: str, t: _Turn, outs: list[StageMessage]) -> None:
        """Admit ``t``'s next clause; one the voice cannot speak goes out as text with no audio."""
        text = t.clauses.popleft()
        t.text, t.started_at = text, time.perf_counter()
        try:
            prompt = self.prompter.prompt(text, t.voice)
        except VoiceError as e:
            log.warning("turn %s: clause not spoken (%s)", rid, e)
            outs.append(self._message(rid, t, torch.zeros(0)))
            return
        self._n += 1
        req = f"{rid}.{self._n}"
        frames = min(self.max_frames, self.prompter.context - prompt.prefill.shape[0])
        self.tts.add(req, prompt, {**self.sampling, "max_tokens": frames})
        t.active, t.stream = req, StreamingDecoder(self.tts.model.codec, *self.chunks)
        self._by_request[req] = rid

    def _message(self, rid: str, t: _Turn, pcm: torch.Tensor) -> StageMessage:
        meta = {"text": t.text, "chunk": t.chunk, "tts_ms": 1000 * (time.perf_counter() - t.started_at)}
        t.text = ""
        t.chunk += 1
        return StageMessage(rid, {"pcm": pcm}, {**meta, **t.options}, last=False)

    def _last(self, rid: str, t: _Turn) -> StageMessage:
        del self.turns[rid]
        return StageMessage(rid, {"pcm": torch.zeros(0)}, {"text": "", **t.options}, last=True)
