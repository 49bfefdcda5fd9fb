"""The unified LM stage: one continuous-batching engine writes each turn's text, then speaks (CFG pairs).

Input (from the codec encoder): ``prompt_steps`` int64 ``[P, S]``; meta ``max_text_tokens``,
``max_audio_frames``, ``cfg_scale`` and ``sampling`` (``temperature``, ``seed``). Output per engine step
of a turn: ``token`` int64 ``[1]`` for a text step, ``codes`` int64 ``[S]`` for each de-interleaved codec
frame (local ids), nothing for bridge/drain steps; ``last`` on the turn's final step.
"""

from __future__ import annotations

import torch

from omniduplex.models.registry import LoadedModel
from omniduplex.pipeline.engine.unified_adapter import UnifiedAdapter
from omniduplex.pipeline.messages import DecoderOutput, StageMessage
from omniduplex.pipeline.stages.contract import EngineGauges
from omniduplex.pipeline.stages.engine_build import EngineSettings

DEFAULT_MAX_TEXT_TOKENS = 48
DEFAULT_MAX_AUDIO_FRAMES = 256


class UnifiedWorker(EngineGauges):
    """Continuous batching of every turn in flight over one :class:`UnifiedAdapter` engine (``engine``: its
    settings; with ``cuda_graphs``, decode steps replay as CUDA graphs on a CUDA device,
    :mod:`.engine.decode_graphs`)."""

    def __init__(
        self,
        model: LoadedModel,
        engine: EngineSettings = EngineSettings(max_num_batched_tokens=2048),
        max_len: int = 4096,
    ) -> None:
        lm = model.unified
        self.adapter = UnifiedAdapter(lm, max_len=max_len)
        self.engine = engine.build(self.adapter, lm.lm_head.weight, "unified")

    def submit(self, msg: StageMessage) -> None:
        """Queue a turn. Raises ValueError on a malformed prompt or budget (this turn only)."""
        steps = msg.tensors.get("prompt_steps")
        if steps is None or steps.dim() != 2 or steps.shape[0] == 0:
            raise ValueError(f"turn {msg.request_id}: need prompt_steps [P, S]")
        opts = msg.meta.options
        sp = dict(opts.sampling or {})
        max_text = opts.max_text_tokens if opts.max_text_tokens is not None else DEFAULT_MAX_TEXT_TOKENS
        max_frames = opts.max_audio_frames if opts.max_audio_frames is not None else DEFAULT_MAX_AUDIO_FRAMES
        if max_text < 0 or max_frames < 0:
            raise ValueError(f"turn {msg.request_id}: budgets must be >= 0")
        req = self.adapter.make_request(
            msg.request_id,
            steps,
            max_text,
            max_frames,
            opts.cfg_scale if opts.cfg_scale is not None else 1.0,
            float(sp.get("temperature", 0.0)),
            sp.get("seed"),
        )
        self.engine.add_request(req)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        outs = []
        for o in self.engine.step():
            t = {}
            if "text_token" in o.extras:
                t["token"] = torch.tensor([o.extras["text_token"]], dtype=torch.int64)
            if "codes" in o.extras:
                t["codes"] = torch.tensor(o.extras["codes"], dtype=torch.int64)
            if t or o.finished:
                meta = DecoderOutput(finish_reason=o.finish_reason if o.finished else None)
                outs.append(StageMessage(o.request_id, t, meta, last=o.finished))
        return outs
