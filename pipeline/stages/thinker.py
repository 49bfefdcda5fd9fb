"""Stage 1: the Thinker engine. Streams each sampled token (id + input embedding) to the Talker.

Input (from the encoder): ``prompt_ids``, ``audio_embeds``; meta ``sampling`` (dict of
:class:`SamplingParams` fields). Output per token: ``token`` int64 ``[1]``, ``token_embed``
``[hidden]``; the first message also carries ``prompt_ids``, ``prompt_embeds`` and ``prompt_hidden``
(the Talker's user-turn inputs) and the turn's meta (``talker_sampling``, ``speaker``, ...).
``last`` marks the final token (EOS or max tokens).
"""

from __future__ import annotations

import torch

from omniduplex.models.registry import LoadedModel

from ..engine.adapters import ThinkerAdapter
from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams
from ..messages import StageMessage


class ThinkerWorker:
    """Continuous-batching Thinker over all turns in flight."""

    def __init__(
        self,
        model: LoadedModel,
        num_blocks: int = 1024,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
    ) -> None:
        cfg = model.config
        self.thinker = model.thinker
        accept = cfg.talker.accept_hidden_layer if cfg.talker else None
        self.eos = cfg.im_end_token_id
        self.engine = Engine(
            ThinkerAdapter(model.thinker, capture_layer=accept, emit_embeds=True),
            num_blocks,
            max_num_seqs,
            max_num_batched_tokens,
            dtype=model.thinker.lm_head.weight.dtype,
        )
        self.prompts: dict[str, tuple[torch.Tensor, torch.Tensor, dict]] = {}

    @torch.no_grad()
    def submit(self, msg: StageMessage) -> None:
        ids = msg.tensors["prompt_ids"]
        embeds = self.thinker.embed(ids, msg.tensors.get("audio_embeds"))
        sp = dict(msg.meta.get("sampling", {}))
        sp.setdefault("stop_token_ids", (self.eos,))
        sp["stop_token_ids"] = tuple(sp["stop_token_ids"])
        req = Request(msg.request_id, ids.tolist(), SamplingParams(**sp), prompt_embeds=embeds)
        self.engine.add_request(req)
        self.prompts[msg.request_id] = (ids, embeds, {k: v for k, v in msg.meta.items() if k != "sampling"})

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self.prompts.pop(request_id, None)

    def has_work(self) -> bool:
        return self.engine.has_unfinished()

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        outs = []
        for o in self.engine.step():
            t = {
                "token": torch.tensor(o.new_token_ids, dtype=torch.int64),
                "token_embed": o.extras["token_embed"],
            }
            meta = {"finish_reason": o.finish_reason} if o.finished else {}
            if "prompt_hidden" in o.extras:  # first token: hand the Talker its prompt and the turn's options
                ids, embeds, turn_meta = self.prompts[o.request_id]
                t.update(prompt_ids=ids, prompt_embeds=embeds, prompt_hidden=o.extras["prompt_hidden"])
                meta.update(turn_meta)
            if o.finished:
                self.prompts.pop(o.request_id, None)
            outs.append(StageMessage(o.request_id, t, meta, last=o.finished))
        return outs
