"""Model adapters: how the engine embeds input rows and what a sampled id produces, per model.

* :class:`DecoderLMAdapter` — the Thinker or any text LM (the cascade's): inputs are token ids (prompt rows
  may be given as embeddings, e.g. with audio merged); optionally records the prompt's hidden states at
  one layer (the Talker's ``accept_hidden_layer``) and streams each sampled token's embedding.
* :class:`TalkerAdapter` — the Talker: inputs are embeddings; after codebook 0 is sampled, the code
  predictor fills the residual codebooks of all the step's frames in one batched call, and the next
  input row (frame embedding + the next Thinker text row) is appended when that text is available.
  Qwen3-TTS's talker and Fish Speech's slow AR (whose fast AR is the same code predictor) run on it too.

Both offer the engine a pure decode forward (``decode_forward``) so decode steps can replay as CUDA graphs
(:mod:`.decode_graphs`); the Thinker's decode inputs are token ids embedded inside the graph
(``decode_ids`` / ``embed_ids``), the Talker's are its input embeddings, and the Talker's code predictor has
graphs of its own (:mod:`.predictor_graphs`).
"""

from __future__ import annotations

import torch

from omniduplex.models.decoder_lm import DecoderLM
from omniduplex.models.forward_batch import ForwardBatch
from omniduplex.models.qwen3_omni.talker import Talker
from omniduplex.pipeline.engine.predictor_graphs import NOISE_BASE, PredictorGraphs
from omniduplex.pipeline.engine.request import Request
from omniduplex.pipeline.engine.sampler import SamplingBatch
from omniduplex.pipeline.engine.sampler import sample as sample_batch

PREDICTOR_TOP_K, PREDICTOR_TOP_P = 50, 0.8
"""Code-predictor sampling filters of ``transformers``' Qwen3-Omni Talker when sampling is on."""


class DecoderLMAdapter:
    """Adapter for a :class:`~omniduplex.models.decoder_lm.DecoderLM`: Qwen3-Omni's Thinker, or any text LM
    checkpoint (Qwen3 / Qwen3-MoE, Qwen2, Llama: the cascade's LLM).

    Args:
        thinker: the model.
        capture_layer: record ``hidden_states[capture_layer]`` of prompt rows into
            ``req.extra["prompt_hidden"]`` (list of ``[n, hidden]`` chunks); ``None`` records nothing.
        emit_embeds: put the sampled token's input embedding in the step extras (``"token_embed"``).

    Prefix caching: with ``capture_layer`` set, only the prompt rows before ``req.extra["capture_from"]``
    (default 0: none) may come from the cache, since a cached row's hidden state is not recomputed; those
    rows of ``prompt_hidden`` are zeros. The Thinker stage sets it to the first row the Talker reads.
    """

    def __init__(
        self, thinker: DecoderLM, capture_layer: int | None = None, emit_embeds: bool = False
    ) -> None:
        self.model, self.capture_layer, self.emit_embeds = thinker, capture_layer, emit_embeds
        cfg = thinker.cfg
        self.num_layers, self.num_kv_heads, self.head_dim = (
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.vocab_size, self.hidden_size = cfg.vocab_size, cfg.hidden_size
        self.max_position_embeddings = cfg.max_position_embeddings
        self._items: list[tuple[Request, int]] = []
        self.supports_speculation = capture_layer is None and not emit_embeds  # sampled ids make no extras

    def input_embeds(self, items: list[tuple[Request, int]]) -> torch.Tensor:
        self._items = items
        ids, from_prompt = [], []
        for req, n in items:
            s, p = req.num_computed, req.num_prompt
            if s + n <= p:
                ids.extend(req.prompt_ids[s : s + n])
            else:  # without building prompt + outputs (O(1) per decode row)
                ids.extend(req.prompt_ids[s:p] + req.output_ids[max(s, p) - p : s + n - p])
                if s + n > req.num_inputs:  # speculative rows: the step's drafts (.speculative)
                    ids.extend(req.draft_ids[: s + n - req.num_inputs])
            if req.prompt_embeds is not None and s < req.num_prompt:
                from_prompt.append((len(ids) - n, req.prompt_embeds[s : min(s + n, req.num_prompt)]))
        emb = self.model.model.embed_tokens(torch.tensor(ids, device=self.model.lm_head.weight.device))
        for at, rows in from_prompt:
            emb[at : at + rows.shape[0]] = rows.to(emb.dtype)
        return emb

    def decode_ids(self, items: list[tuple[Request, int]]) -> list[int]:
        """The input id of each decode row (a request's last sampled id)."""
        return [req.output_ids[req.num_computed - req.num_prompt] for req, _ in items]

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 ``[n]`` → ``[n, hidden]``."""
        return self.model.model.embed_tokens(ids)

    def decode_forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        """Final hidden states of decode rows (nothing recorded: decode rows have no prompt hidden states)."""
        return self.model(x, batch, kv)[0]

    def cacheable_rows(self, req: Request) -> int:
        """Most leading input rows the prefix cache may skip (see the class docstring)."""
        return req.num_inputs if self.capture_layer is None else int(req.extra.get("capture_from", 0))

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        hidden, captured = self.model(x, batch, kv, capture_layer=self.capture_layer)
        if captured is not None:
            at = 0
            for req, n in self._items:
                s = req.num_computed
                end = min(s + n, req.num_prompt)
                if s < end:  # prompt rows (decode rows have nothing to record)
                    store = req.extra.setdefault("prompt_hidden", [])
                    have = sum(c.shape[0] for c in store)  # rows kept from earlier chunks or a preemption
                    if s > have:  # rows taken from the prefix cache (before capture_from): never read
                        store.append(captured.new_zeros((s - have, captured.shape[1])))
                        have = s
                    if end > have:
                        store.append(captured[at + have - s : at + end - s].clone())
                at += n
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def on_sampled(self, reqs, tokens, hidden, finishing) -> list[dict]:
        out: list[dict] = [{} for _ in reqs]
        if self.capture_layer is not None:
            for o, req in zip(out, reqs):
                if not req.output_ids:  # first token: the prompt's hidden states are complete
                    o["prompt_hidden"] = torch.cat(req.extra.pop("prompt_hidden"))
        if self.emit_embeds:
            emb = self.model.model.embed_tokens(tokens)
            for i, o in enumerate(out):
                o["token_embed"] = emb[i]
        return out


class TalkerAdapter:
    """Adapter for :class:`Talker`. A request's prompt rows are ``prompt_embeds``; decode rows are built here.

    Text for decode row ``j`` is fed with :meth:`feed_text` (projected rows, ``[n, talker_hidden]``) and
    closed with :meth:`end_text` (after which ``tts_pad`` is used). ``req.extra["text"]`` holds the
    queue; ``req.extra["frame_embeds"]`` the frames waiting for their text row.

    Args:
        talker: the model: ``cfg.text`` (its decoder config), ``cfg.num_code_groups``, ``forward``,
            ``compute_logits``, ``frame_embedding``, ``suppressed_token_mask`` and ``code_predictor``.
        tts_pad: the text row added once the text has ended (zeros: no text stream, as in Fish Speech).
        code0_embed: ``code0 [B] → [B, hidden]``, the embedding the code predictor reads at position 1
            (default: the talker's ``model.codec_embedding``; Fish Speech: the fast AR's own table).
        predictor_filters: ``(top_k, top_p)`` of the code predictor when sampling (default: Qwen3-Omni's);
            ``None``: each request's own ``top_k`` / ``top_p`` (Fish Speech samples its fast codebooks so).
    """

    def __init__(
        self,
        talker: Talker,
        tts_pad: torch.Tensor,
        code0_embed=None,
        predictor_filters: tuple[int, float] | None = (PREDICTOR_TOP_K, PREDICTOR_TOP_P),
    ) -> None:
        self.model, self.tts_pad = talker, tts_pad
        self.code0_embed = code0_embed or talker.model.codec_embedding
        self.predictor_filters = predictor_filters
        cfg = talker.cfg.text
        self.num_layers, self.num_kv_heads, self.head_dim = (
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        mask = talker.suppressed_token_mask()  # one entry per logit (Fish Speech: its samplable ids only)
        self.vocab_size, self.hidden_size = mask.numel(), cfg.hidden_size
        self.max_position_embeddings = cfg.max_position_embeddings
        self.suppress_ids = tuple(torch.nonzero(mask).flatten().tolist())
        self.predictor_graphs: PredictorGraphs | None = None

    def capture_graphs(self, backend, max_num_seqs: int) -> list:
        """Capture the code predictor per bucket of frames (the engine calls this with its graph backend);
        none where the predictor samples with each request's own filters or reads its own code-0 table
        (Fish Speech: its fast AR runs eagerly)."""
        if self.predictor_filters is None or self.code0_embed is not self.model.model.codec_embedding:
            return []
        self.predictor_graphs = PredictorGraphs(self.model, backend, max_num_seqs, *self.predictor_filters)
        return [self.predictor_graphs.runner]

    def graph_runners(self) -> list:
        return [] if self.predictor_graphs is None else [self.predictor_graphs.runner]

    # -- text stream from the Thinker --------------------------------------------------------------
    def feed_text(self, req: Request, rows: torch.Tensor) -> None:
        req.extra.setdefault("text", []).extend(rows.unbind(0))
        self._complete_inputs(req)

    def end_text(self, req: Request) -> None:
        req.extra["text_done"] = True
        self._complete_inputs(req)

    def _complete_inputs(self, req: Request) -> None:
        frames, text = req.extra.setdefault("frame_embeds", []), req.extra.setdefault("text", [])
        while frames:
            j = len(req.decode_embeds)
            if j < len(text):
                row = text[j]
            elif req.extra.get("text_done"):
                row = self.tts_pad
            else:
                return
            req.decode_embeds.append(frames.pop(0) + row)

    # -- engine hooks --------------------------------------------------------------------------------
    def input_embeds(self, items: list[tuple[Request, int]]) -> torch.Tensor:
        rows = []
        for req, n in items:
            s, p = req.num_computed, req.num_prompt
            if s < p:
                rows.append(req.prompt_embeds[s : min(s + n, p)])
            tail = [req.decode_embeds[i - p] for i in range(max(s, p), s + n)]
            if tail:
                rows.append(torch.stack(tail))
        return torch.cat(rows)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        return self.model(x, batch, kv)

    def decode_forward(self, x: torch.Tensor, batch: ForwardBatch, kv) -> torch.Tensor:
        return self.model(x, batch, kv)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def on_sampled(self, reqs, tokens, hidden, finishing) -> list[dict]:
        out: list[dict] = [{} for _ in reqs]
        keep = [i for i, f in enumerate(finishing) if not f]
        if not keep:
            return out
        if len(keep) == len(reqs):
            code0, h = tokens, hidden
        else:
            idx = torch.tensor(keep, device=tokens.device)
            code0, h = tokens[idx], hidden[idx]
        live = [reqs[i] for i in keep]
        frames = None
        if self.predictor_graphs is not None:
            temps, seeds = [r.sampling.temperature for r in live], [r.sampling.seed for r in live]
            frames = self.predictor_graphs.predict(h, code0, temps, seeds, [len(r.output_ids) for r in live])
        if frames is None:
            frames = self.model.code_predictor.predict(
                h, code0, self.code0_embed(code0), sample=self._predictor_sampler(live)
            )
        embeds = self.model.frame_embedding(frames)
        codes = frames.tolist()  # one device-to-host copy for every frame of the step
        for k, i in enumerate(keep):
            req = reqs[i]
            out[i]["codes"] = codes[k]
            req.extra.setdefault("frame_embeds", []).append(embeds[k])
            self._complete_inputs(req)
        return out

    def _predictor_sampler(self, reqs: list[Request]):
        dev = self.tts_pad.device
        temps = torch.tensor([r.sampling.temperature for r in reqs], dtype=torch.float32, device=dev)
        seeds = torch.tensor([r.sampling.seed for r in reqs], dtype=torch.int64, device=dev)
        frame_idx = torch.tensor([len(r.output_ids) for r in reqs], dtype=torch.int64, device=dev)
        groups = self.model.cfg.num_code_groups
        b = len(reqs)
        if self.predictor_filters is None:
            top_k = torch.tensor([r.sampling.top_k for r in reqs], dtype=torch.int64, device=dev)
            top_p = torch.tensor([r.sampling.top_p for r in reqs], dtype=torch.float32, device=dev)
        else:  # built once per frame, not per codebook
            top_k = torch.full((b,), self.predictor_filters[0], device=dev)
            top_p = torch.full((b,), self.predictor_filters[1], device=dev)
        penalty = torch.ones(b, device=dev)
        base = NOISE_BASE + frame_idx * groups

        def pick(logits: torch.Tensor, g: int) -> torch.Tensor:
            sb = SamplingBatch(temps, top_k, top_p, penalty, seeds, counters=base + g)
            return sample_batch(logits, sb)

        return pick
