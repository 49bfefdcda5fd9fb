"""Stage 1: the Thinker engine. Streams each sampled token (id + input embedding) to the Talker.

Input (from the encoder): ``prompt_ids``, ``audio_embeds``; meta ``sampling`` (dict of
:class:`SamplingParams` fields). Output per token: ``token`` int64 ``[1]``, ``token_embed``
``[hidden]``; the first message also carries ``prompt_ids``, ``prompt_embeds`` and ``prompt_hidden``
(the Talker's user-turn inputs) and the turn's meta (``talker_sampling``, ``speaker``, ...).
``last`` marks the final token (EOS or max tokens).
"""

from __future__ import annotations

import torch

from omniduplex.models.qwen3_omni.talker_prompt import user_token_mask
from omniduplex.models.registry import LoadedModel
from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.messages import DecoderOutput, StageMessage, TurnOptions
from omniduplex.pipeline.stages.contract import EngineGauges
from omniduplex.pipeline.stages.engine_build import EngineSettings


class ThinkerWorker(EngineGauges):
    """Continuous-batching Thinker over all turns in flight.

    Prefix caching: a turn reuses the KV of the prompt rows it shares with earlier turns (system prompt,
    text history) up to the first audio row of a user turn, the first row whose hidden state the Talker
    reads (:func:`omniduplex.models.qwen3_omni.talker_prompt.talker_prefill_embeds`); prompt rows are keyed
    by their input embeddings, so audio rows match only on equal audio features.

    ``engine``: the engine's settings; with ``cuda_graphs``, decode steps replay as CUDA graphs on a CUDA
    device (:mod:`.engine.decode_graphs`).
    """

    def __init__(
        self,
        model: LoadedModel,
        engine: EngineSettings = EngineSettings(),
    ) -> None:
        cfg = model.config
        self.config = cfg
        self.thinker = model.thinker
        accept = cfg.talker.accept_hidden_layer if cfg.talker else None
        self.eos = cfg.im_end_token_id
        self.engine = engine.build(
            DecoderLMAdapter(model.thinker, capture_layer=accept, emit_embeds=True),
            model.thinker.lm_head.weight,
            "thinker",
        )
        self.prompts: dict[str, tuple[torch.Tensor, torch.Tensor, TurnOptions | None]] = {}

    @torch.no_grad()
    def submit(self, msg: StageMessage) -> None:
        ids = msg.tensors["prompt_ids"].cpu()  # read on the host (token lists, the capture row)
        audio = msg.tensors.get("audio_embeds")
        dev = self.engine.device
        embeds = self.thinker.embed(ids.to(dev), None if audio is None else audio.to(dev))
        sp = dict(msg.meta.options.sampling or {})
        sp.setdefault("stop_token_ids", (self.eos,))
        sp["stop_token_ids"] = tuple(sp["stop_token_ids"])
        req = Request(msg.request_id, ids.tolist(), SamplingParams(**sp), prompt_embeds=embeds)
        req.extra["capture_from"] = self._capture_from(ids)
        self.engine.add_request(req)
        turn = msg.meta.turn.model_copy(update={"sampling": None}) if msg.meta.turn is not None else None
        self.prompts[msg.request_id] = (ids, embeds, turn)

    def _capture_from(self, ids: torch.Tensor) -> int:
        """First prompt row whose hidden state the Talker reads (a user turn's audio row), else ``P``."""
        cfg = self.config
        if cfg.talker is None:
            return int(ids.shape[0])
        need = user_token_mask(ids, cfg) & (ids == cfg.thinker.audio_token_id)
        hit = torch.nonzero(need).flatten()
        return int(hit[0]) if hit.numel() else int(ids.shape[0])

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self.prompts.pop(request_id, None)

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        outs = []
        for o in self.engine.step():
            t = {
                "token": torch.tensor(o.new_token_ids, dtype=torch.int64),
                "token_embed": o.extras["token_embed"],
            }
            meta = DecoderOutput(finish_reason=o.finish_reason if o.finished else None)
            if "prompt_hidden" in o.extras:  # first token: hand the Talker its prompt and the turn's options
                ids, embeds, meta.turn = self.prompts[o.request_id]
                t.update(prompt_ids=ids, prompt_embeds=embeds, prompt_hidden=o.extras["prompt_hidden"])
            if o.finished:
                self.prompts.pop(o.request_id, None)
            outs.append(StageMessage(o.request_id, t, meta, last=o.finished))
        return outs
