"""The duplex frame engine: one batched step per 80 ms tick for every live session of a Moshi-architecture
model (Moshi paper arXiv 2410.00037 §3: Mimi at 12.5 Hz, the LM one frame per step).

A tick (:meth:`DuplexEngine.tick`):

1. applies queued leaves and joins (:class:`~.slots.Slots`; rows stay contiguous, a joining row is reset);
2. copies each session's next input frame (or silence: an input underrun, counted) into the static input
   buffer ``[capacity, 1, 1920]``;
3. runs ONE step over rows ``[:n]`` (padded to a batch bucket when graphed): Mimi encode of every session's
   frame, the temporal transformer's decode step for all sessions (per-row ring KV over the model's context),
   the depth transformer's 8 codebooks batched across sessions, Mimi decode of the generated codes;
4. hands back one :class:`DuplexFrame` per session: 1920 samples of model audio and the inner-monologue text
   token. A session's first tick yields silence (the acoustic delay: its first frame is not ready yet).

Per-session sampling settings live in batched tensors (rows like the states), so sampling is one call per
codebook for all sessions. So do the voice / role prompts (:mod:`.prompts`): every row's prompt schedule
sits in ``prompt_tokens`` ``[capacity, steps, 1 + dep_q]`` with a step counter per row, and the step forces
each row's tokens of the tick (a gather, inside the captured step): a joining session's prefill advances one
prompt frame per tick within the same batched step, stalling nobody; meanwhile it hears silence and is sent
silence.

A tick longer than the budget (80 ms) is counted in every session it served and
each gets a ``tick_overrun`` event; nobody is dropped. With ``graph_mode`` ``cuda`` (or ``twin``, its CPU
stand-in, :mod:`omniduplex.pipeline.engine.graph_runner`) the step is captured once per batch bucket at start.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from omniduplex.models.moshi.checkpoint import MoshiModels
from omniduplex.models.moshi.config import FRAME_SAMPLES
from omniduplex.models.moshi.lm import Sampling
from omniduplex.models.moshi.streaming import move_row, reset_rows, start_streaming
from omniduplex.models.moshi.transformer import Attention
from omniduplex.pipeline.duplex.prompts import MAX_PROMPT_FRAMES, DuplexPrompt, check_prompt, prompt_schedule
from omniduplex.pipeline.duplex.slots import DuplexSettings, Slots
from omniduplex.pipeline.engine.graph_runner import GraphRunner, bucket_sizes, make_backend

FRAME_MS = 80.0
"""One Mimi frame (1920 samples at 24 kHz), the tick period."""


@dataclass
class DuplexFrame:
    """What one tick gave one session: ``pcm`` float32 ``[1920]`` (24 kHz), the text token (``None`` while
    the first frame is not ready), the tick number and whether that tick overran its budget."""

    session_id: str
    pcm: np.ndarray
    text_token: int | None
    tick: int
    overrun: bool


class DuplexEngine:
    """Batched full-duplex sessions over one loaded Moshi folder.

    Args:
        models: :func:`omniduplex.models.moshi.checkpoint.load_moshi` output (the engine owns its streaming
            state from now on).
        capacity: most sessions at once.
        budget_ms: a tick's time budget (80 ms, one frame).
        graph_mode: ``off`` (eager), ``twin`` (CPU twin of CUDA graphs), ``cuda`` or ``auto``
            (:func:`~omniduplex.pipeline.engine.graph_runner.resolve_mode`).
        seed: the sampling generator's seed.
    """

    def __init__(
        self,
        models: MoshiModels,
        capacity: int = 8,
        budget_ms: float = FRAME_MS,
        graph_mode: str = "off",
        seed: int = 0,
    ) -> None:
        self.mimi, self.lm = models.mimi, models.lm
        dev = next(self.lm.parameters()).device
        self.capacity, self.budget_ms, self.device = capacity, budget_ms, dev
        self.slots = Slots(capacity)
        self.lock = threading.Lock()
        """Guards the slots: joins, leaves and pushes may come from other threads than the ticking one."""
        self.pcm_in = torch.zeros(capacity, 1, FRAME_SAMPLES, device=dev)
        self.settings = Sampling(
            torch.zeros(capacity, device=dev),
            torch.ones(capacity, dtype=torch.long, device=dev),
            torch.zeros(capacity, device=dev),
            torch.ones(capacity, dtype=torch.long, device=dev),
        )
        self.delays = list(self.lm.delays)
        self.lag = max(self.delays[: self.lm.dep_q + 1])
        self.pad_id = int(models.config.get("existing_text_padding_id", 3))
        steps = MAX_PROMPT_FRAMES + self.lag + 1  # the last step is always free (-1): where rows rest
        shape = (capacity, steps, 1 + self.lm.dep_q)
        self.prompt_tokens = torch.full(shape, -1, dtype=torch.long, device=dev)
        self.prompt_step = torch.full((capacity,), steps - 1, dtype=torch.long, device=dev)
        self.generator: torch.Generator | None = torch.Generator(device=dev).manual_seed(seed)
        self.ticks = self.overrun_ticks = 0
        self.tick_ms: list[float] = []
        for m in (self.mimi, self.lm):
            start_streaming(m, capacity)
        backend = make_backend(graph_mode, dev)
        if backend is not None and backend.name == "cuda":
            self.generator = None  # a CUDA graph replays the default generator's draws (graph-safe RNG)
        self.runner: GraphRunner | None = None
        if backend is not None:
            self.runner = GraphRunner("duplex step", backend, bucket_sizes(capacity))
            for m in (*self.mimi.modules(), *self.lm.modules()):
                if isinstance(m, Attention):
                    m.fixed_window = True
            with torch.no_grad():
                self.runner.capture(lambda b: lambda: self._step(b, any_sampling=True))
            self._reset(list(range(capacity)))  # the captures stepped every row

    # sessions -----------------------------------------------------------------------------------------
    def join(
        self, session_id: str, settings: DuplexSettings | None = None, prompt: DuplexPrompt | None = None
    ) -> None:
        """Add a session from the next tick on, prefilled with ``prompt`` (voice / role, :mod:`.prompts`)
        first when given. Raises ValueError when full, already joined, or for a prompt the model cannot take
        (:func:`~.prompts.check_prompt`)."""
        schedule = None
        if prompt is not None and prompt.frames:
            check_prompt(prompt, self.lm.dep_q, self.lm.card, self.lm.text_card)
            schedule = prompt_schedule(prompt, self.delays, self.lm.dep_q, self.pad_id)
        with self.lock:
            self.slots.join(session_id, settings, schedule)

    def leave(self, session_id: str) -> None:
        """Remove a session before the next tick. Raises ValueError for an unknown id."""
        with self.lock:
            self.slots.leave(session_id)

    def push(self, session_id: str, pcm: np.ndarray) -> None:
        """Queue the session's next 80 ms input frame (see :meth:`Slots.push` for the errors)."""
        with self.lock:
            self.slots.push(session_id, pcm)

    def stats(self, session_id: str) -> dict[str, int]:
        """``{"frames", "input_underruns", "overruns"}`` of a live session. Raises KeyError if unknown."""
        s = self.slots.sessions[session_id]
        return {"frames": s.frames, "input_underruns": s.input_underruns, "overruns": s.overruns}

    def events(self, session_id: str) -> list[dict]:
        """Drain the session's events (``{"type": "tick_overrun", "tick", "tick_ms", "budget_ms"}``)."""
        with self.lock:
            s = self.slots.sessions[session_id]
            out, s.events = s.events, []
        return out

    @property
    def live(self) -> int:
        """Sessions in the batch now."""
        return len(self.slots.order)

    # rows ---------------------------------------------------------------------------------------------
    def _move(self, src: int, dst: int) -> None:
        for m in (self.mimi, self.lm):
            move_row(m, src, dst)
        for t in (
            self.settings.temp_text,
            self.settings.top_k_text,
            self.settings.temp_audio,
            self.settings.top_k_audio,
        ):
            t[dst] = t[src]
        self.prompt_tokens[dst] = self.prompt_tokens[src]
        self.prompt_step[dst] = self.prompt_step[src]

    def _reset(self, rows: list[int]) -> None:
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        for m in (self.mimi, self.lm):
            reset_rows(m, idx)
        for r in rows:
            sid = self.slots.order[r] if r < len(self.slots.order) else None
            s = self.slots.sessions[sid].settings if sid is not None else DuplexSettings()
            self.settings.temp_text[r], self.settings.top_k_text[r] = s.temp_text, s.top_k_text
            self.settings.temp_audio[r], self.settings.top_k_audio[r] = s.temp_audio, s.top_k_audio
            self.prompt_tokens[r].fill_(-1)
            self.prompt_step[r] = self.prompt_tokens.shape[1] - 1  # rests on the free step
            schedule = self.slots.sessions[sid].schedule if sid is not None else None
            if schedule is not None:
                self.prompt_tokens[r, : schedule.shape[0]] = schedule.to(self.device)
                self.prompt_step[r] = 0

    def _reset_decoder(self, rows: list[int]) -> None:
        """Forget a not-ready frame's decode in the Mimi decoder state (as if it had not been decoded)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        for m in (self.mimi.upsample, self.mimi.decoder_transformer, self.mimi.decoder):
            reset_rows(m, idx)

    # the step -----------------------------------------------------------------------------------------
    def _step(
        self, b: int, any_sampling: bool, top_k_bound: int | None = None, prompts: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batched step over rows ``[:b]``: returns model audio ``[b, 1, 1920]``, tokens ``[b, 9]``
        (text, 8 codebooks; -2 while not ready) and ``ready`` bool ``[b]``. ``top_k_bound``: the largest
        top-k of the rows (``None`` in a captured graph, which must serve any settings). ``prompts``: force
        the rows' prompt tokens of this step (False only when no row is prefilling: the eager path skips
        the work)."""
        s = self.settings
        rows = Sampling(
            s.temp_text[:b], s.top_k_text[:b], s.temp_audio[:b], s.top_k_audio[:b], any_sampling, top_k_bound
        )
        user = self.mimi.encode(self.pcm_in[:b])[:, :, 0]
        force = None
        if prompts:  # some row may be prefilling a prompt (always, in a captured graph)
            step = self.prompt_step[:b]
            force = self.prompt_tokens[:b].gather(1, step[:, None, None].expand(-1, 1, 1 + self.lm.dep_q))
            force = force[:, 0]
            step.add_(1).clamp_(max=self.prompt_tokens.shape[1] - 1)
        tokens, ready = self.lm.step(user, rows, self.generator, force)
        pcm = self.mimi.decode(tokens[:, 1:, None].clamp(min=0))
        return pcm, tokens, ready

    @torch.no_grad()
    def tick(self) -> list[DuplexFrame]:
        """Advance every live session one frame (see the module docstring). Returns one frame per session."""
        t0 = time.perf_counter()
        with self.lock:
            self.slots.apply(self._move, self._reset)
            n = len(self.slots.order)
            if n == 0:
                return []
            sessions = [self.slots.sessions[sid] for sid in self.slots.order]
            frames = np.zeros((n, FRAME_SAMPLES), dtype=np.float32)
            for i, s in enumerate(sessions):
                if s.prompt_left > self.lag:  # reading its prompt: it hears silence, the client's audio is
                    if s.inbox:  # dropped (no latency builds up behind the prompt)
                        s.inbox.popleft()
                    continue
                if s.inbox:
                    frames[i] = s.inbox.popleft()
                else:
                    s.input_underruns += 1
        self.pcm_in[:n, 0].copy_(torch.from_numpy(frames))
        bucket = self.runner.bucket_for(n) if self.runner is not None else None
        if bucket is not None:
            pcm, tokens, ready = (t[:n] for t in self.runner.replay(bucket))
        else:
            if self.runner is not None:
                self.runner.miss()
            any_sampling = any(s.settings.temp_text > 0 or s.settings.temp_audio > 0 for s in sessions)
            bound = max(max(s.settings.top_k_text, s.settings.top_k_audio) for s in sessions)
            prefill = any(s.prompt_left > 0 for s in sessions)  # eager: no prompt work without a prompt
            pcm, tokens, ready = self._step(n, any_sampling, bound, prefill)
        ready_l = ready.tolist()
        pcm_np = pcm[:, 0].float().cpu().numpy().copy()  # a replayed graph's output buffer is reused
        text = tokens[:, 0].tolist()
        not_ready = [i for i, r in enumerate(ready_l) if not r]
        if not_ready:
            self._reset_decoder(not_ready)
        ms = (time.perf_counter() - t0) * 1000
        over = ms > self.budget_ms
        self.ticks += 1
        self.overrun_ticks += over
        self.tick_ms.append(ms)
        out = []
        with self.lock:
            for i, s in enumerate(sessions):
                s.frames += 1
                if over:
                    s.overruns += 1
                    s.events.append(
                        {
                            "type": "tick_overrun",
                            "tick": self.ticks,
                            "tick_ms": round(ms, 2),
                            "budget_ms": self.budget_ms,
                        }
                    )
                live = ready_l[i] and s.prompt_left == 0  # the prompt's own frames are not sent
                s.prompt_left = max(0, s.prompt_left - 1)
                audio = pcm_np[i] if live else np.zeros(FRAME_SAMPLES, dtype=np.float32)
                out.append(DuplexFrame(s.session_id, audio, text[i] if live else None, self.ticks, over))
        return out
