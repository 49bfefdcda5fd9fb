"""Stage 0: user audio → log-mel → audio encoder → Thinker prompt ids and audio embeddings."""

from __future__ import annotations

import torch

from omniduplex.models.mel import LogMelFrontEnd
from omniduplex.models.qwen3_omni.audio_encoder import audio_token_count
from omniduplex.models.registry import LoadedModel
from omniduplex.models.tokenizer import DEFAULT_SYSTEM_PROMPT, load_tokenizer, voice_turn_prompt
from omniduplex.pipeline.messages import Encoded, StageMessage, TurnOptions
from omniduplex.pipeline.stages.turn_batch import TurnBatching


class EncoderWorker(TurnBatching):
    """Batches every pending turn of a step through one mel + encoder call.

    Input tensors: ``waveform`` float32 ``[samples]`` at 16 kHz; meta ``system_prompt`` (optional) and
    ``history`` (list of ``[role, text]``). Output tensors: ``prompt_ids`` int64 ``[P]``,
    ``audio_embeds`` ``[N, thinker_hidden]``. A typed turn (meta ``user_text``) needs no waveform: its
    prompt has the text as the user turn and no audio rows (``N`` = 0).
    """

    def __init__(self, model: LoadedModel, max_batch: int = 16) -> None:
        self.model, self.max_batch = model, max_batch
        self.tower = model.thinker.audio_tower
        self.device = next(self.tower.parameters()).device
        self.mel = LogMelFrontEnd(_preprocessor(model)).to(self.device)  # the log-mel runs beside the tower
        self.tok = load_tokenizer(model.path)
        self.pending: list[StageMessage] = []

    def submit(self, msg: StageMessage) -> None:
        if msg.meta.options.user_text is not None:
            self.pending.append(msg)
            return
        wav = msg.tensors.get("waveform")
        if wav is None or wav.ndim != 1 or wav.numel() < self.mel.min_samples:
            raise ValueError(
                f"turn {msg.request_id}: need a 1-D 16 kHz waveform of at least "
                f"{self.mel.min_samples} samples"
            )
        self.pending.append(msg)

    @torch.no_grad()
    def step(self) -> list[StageMessage]:
        typed = [m for m in self.pending if m.meta.options.user_text is not None]
        if typed:  # no audio to encode: alone in their step
            self.pending = [m for m in self.pending if m not in typed]
            return [self._text_turn(m) for m in typed]
        batch = self.take_batch()
        if not batch:
            return []
        feats, lens = self.mel([m.tensors["waveform"].to(self.device, torch.float32) for m in batch])
        embeds, out_lens = self.tower(feats.to(self.tower_dtype), lens)
        outs, at = [], 0
        for m, n in zip(batch, out_lens.tolist()):
            ids = voice_turn_prompt(
                self.model.config,
                self.tok,
                n,
                _system_prompt(m.meta.options),
                [tuple(h) for h in m.meta.options.history or []],
            )
            outs.append(
                StageMessage(
                    m.request_id,
                    {"prompt_ids": torch.tensor(ids, dtype=torch.int64), "audio_embeds": embeds[at : at + n]},
                    Encoded(turn=m.meta.turn),
                    last=True,
                )
            )
            at += n
        assert int(audio_token_count(lens).sum()) == at
        return outs

    def _text_turn(self, m: StageMessage) -> StageMessage:
        ids = voice_turn_prompt(
            self.model.config,
            self.tok,
            0,
            _system_prompt(m.meta.options),
            [tuple(h) for h in m.meta.options.history or []],
            user_text=m.meta.options.user_text,
        )
        hidden = self.model.config.thinker.text.hidden_size
        embeds = torch.zeros(0, hidden, dtype=self.tower_dtype, device=self.device)
        t = {"prompt_ids": torch.tensor(ids, dtype=torch.int64), "audio_embeds": embeds}
        return StageMessage(m.request_id, t, Encoded(turn=m.meta.turn), last=True)

    @property
    def tower_dtype(self) -> torch.dtype:
        return next(self.tower.parameters()).dtype


def _preprocessor(model: LoadedModel) -> dict:
    import json

    p = model.path / "preprocessor_config.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def _system_prompt(opts: TurnOptions) -> str:
    return opts.system_prompt if opts.system_prompt is not None else DEFAULT_SYSTEM_PROMPT
