"""Stage 2: the Talker engine, started by the Thinker's first token and fed its text as it streams.

Input: the Thinker's token stream (see :mod:`.thinker`). Output per codec frame: ``codes`` int64
``[num_code_groups]``; ``last`` closes the request (the EOS step carries no codes); the first frame's meta
``talker_ms``: admission (the Thinker's first token) → that frame, ms.
Meta ``talker_sampling`` (dict of :class:`SamplingParams` fields) and ``speaker`` come with the first message.
"""

from __future__ import annotations

import time

import torch

from omniduplex.models.qwen3_omni.talker_prompt import TalkerTextEmbeds, talker_prefill_embeds
from omniduplex.models.registry import LoadedModel
from omniduplex.pipeline.engine.adapters import TalkerAdapter
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.messages import DecoderOutput, StageMessage
from omniduplex.pipeline.stages.contract import EngineGauges
from omniduplex.pipeline.stages.engine_build import stage_engine

DEFAULT_TALKER_SAMPLING = dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, max_tokens=1024)
"""``transformers``' Qwen3-Omni ``generate`` defaults for the Talker (``talker_*`` kwargs)."""


class TalkerWorker(EngineGauges):
    """Continuous-batching Talker; ``specials`` are the projected ``tts_bos/eos/pad`` embeddings.
    ``cuda_graphs``: decode steps and the code predictor replay as CUDA graphs on a CUDA device
    (:mod:`.engine.decode_graphs`)."""

    def __init__(
        self,
        model: LoadedModel,
        specials: TalkerTextEmbeds,
        num_blocks: int = 1024,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
        enable_prefix_caching: bool = True,
        cuda_graphs: bool = True,
    ) -> None:
        self.model, self.cfg, self.talker, self.specials = model, model.config, model.talker, specials
        self.adapter = TalkerAdapter(model.talker, specials.tts_pad)
        self.engine = stage_engine(
            self.adapter, model.talker.codec_head.weight, "talker",
            num_blocks, max_num_seqs, max_num_batched_tokens, enable_prefix_caching, cuda_graphs,
        )
        self.live: dict[str, Request] = {}
        self.admitted: dict[str, float] = {}  # perf_counter at admission, until the request's first frame
        self.text_queue: list[tuple[str, torch.Tensor]] = []
        self.finished_early: list[StageMessage] = []

    @torch.no_grad()
    def submit(self, msg: StageMessage) -> None:
        rid, t = msg.request_id, msg.tensors
        if "prompt_hidden" in t:
            if msg.last:  # the Thinker stopped at its first token: nothing to speak
                none = DecoderOutput(finish_reason="no_text")
                self.finished_early.append(StageMessage(rid, {}, none, last=True))
                return
            self._start(msg)
            return
        req = self.live.get(rid)
        if req is None:
            return  # aborted
        if msg.last:
            self.text_queue.append((rid, self.specials.tts_eos))
            self.text_queue.append((rid, None))
        else:
            self.text_queue.append((rid, t["token_embed"]))

    def _start(self, msg: StageMessage) -> None:
        t, tcfg = msg.tensors, self.cfg.talker
        speaker = (msg.meta.options.speaker or "ethan").lower()
        if speaker not in tcfg.speaker_id:
            raise ValueError(f"unknown speaker {speaker!r}; this checkpoint has {sorted(tcfg.speaker_id)}")
        dev = self.engine.device  # the Thinker's tensors may land on the host (relay)
        prefill = talker_prefill_embeds(
            self.talker,
            self.cfg,
            t["prompt_ids"].cpu(),
            t["prompt_embeds"].to(dev),
            t["prompt_hidden"].to(dev),
            t["token_embed"].to(dev),
            self.specials,
            tcfg.speaker_id[speaker],
        )
        sp = {**DEFAULT_TALKER_SAMPLING, **(msg.meta.options.talker_sampling or {})}
        sp.update(stop_token_ids=(tcfg.codec_eos_token_id,), suppress_token_ids=self.adapter.suppress_ids)
        req = Request(
            msg.request_id,
            [self.cfg.tts_pad_token_id] * prefill.shape[0],
            SamplingParams(**sp),
            prompt_embeds=prefill.to(self.talker.codec_head.weight.dtype),
            embed_inputs=True,
        )
        self.engine.add_request(req)
        self.live[msg.request_id] = req
        self.admitted[msg.request_id] = time.perf_counter()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self.live.pop(request_id, None)
        self.admitted.pop(request_id, None)
        self.text_queue = [(r, e) for r, e in self.text_queue if r != request_id]

    def has_work(self) -> bool:
        return self.engine.has_unfinished() or bool(self.finished_early) or bool(self.text_queue)

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        self._flush_text()
        outs, self.finished_early = self.finished_early, []
        for o in self.engine.step():
            t = {"codes": torch.tensor(o.extras["codes"], dtype=torch.int64)} if "codes" in o.extras else {}
            if o.finished:
                self.live.pop(o.request_id, None)
            meta = DecoderOutput(finish_reason=o.finish_reason if o.finished else None)
            if t and (t0 := self.admitted.pop(o.request_id, None)) is not None:  # its first frame
                meta.talker_ms = 1000 * (time.perf_counter() - t0)
            if o.finished:
                self.admitted.pop(o.request_id, None)
            outs.append(StageMessage(o.request_id, t, meta, last=o.finished))
        return outs

    def _flush_text(self) -> None:
        """Project all queued Thinker token embeddings in one call, then feed them in order."""
        if not self.text_queue:
            return
        queue, self.text_queue = self.text_queue, []
        raw = [(i, e) for i, (_, e) in enumerate(queue) if e is not None and e is not self.specials.tts_eos]
        projected = {}
        if raw:
            w = self.talker.codec_head.weight
            rows = self.talker.text_projection(torch.stack([e for _, e in raw]).to(w.device, w.dtype))
            projected = {i: rows[k] for k, (i, _) in enumerate(raw)}
        for i, (rid, e) in enumerate(queue):
            req = self.live.get(rid)
            if req is None:
                continue
            if e is None:
                self.adapter.end_text(req)
            else:
                self.adapter.feed_text(req, projected.get(i, e)[None])
