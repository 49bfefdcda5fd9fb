"""VoxCPM2 on our engine: continuous batching of both LMs over a paged KV cache (voice prefixes shared through
the prefix cache), the flow-matching decode of every due request in one solver call per step, latent patches
streamed to a stateful AudioVAE decoder.

:class:`VoxCPM2Engine` wraps :class:`~.engine.engine.Engine` with the
:class:`~.engine.voxcpm2_adapter.VoxCPM2Adapter`; each step yields one :class:`PatchEvent` per request that
made a patch (``[patch_size, feat_dim]`` latents, 160 ms of audio). :class:`~omniduplex.models.voxcpm2.
vae_stream.VAEStream` turns a request's patches into 48 kHz PCM as they come. :func:`synthesize` speaks one
text alone (tests, ``speak``-style use).

Decoding rules are ``VoxCPM2Model._inference`` of ``voxcpm`` 2.0.3: a patch per step; the stop head ends the
request after the patch it fires on once more than ``min_len`` patches are out; at most ``max_len`` patches
(the prompt's budget, ``int(6 · text ids + 10)``, by default). Not carried over: the reference's retry of
"bad cases" (a non-streaming re-run when the audio is over 6× the text length).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omniduplex.kernels import cpu_ops
from omniduplex.models.voxcpm2.model import VoxCPM2, is_voxcpm2
from omniduplex.models.voxcpm2.presets import PRESETS
from omniduplex.models.voxcpm2.prompt import PromptError, TextTokenizer, Voice, VoxPrompt, build_prompt
from omniduplex.models.voxcpm2.vae_stream import VAEStream
from omniduplex.pipeline.engine.request import Request, SamplingParams
from omniduplex.pipeline.engine.voxcpm2_adapter import STOP_ID, VoxCPM2Adapter
from omniduplex.pipeline.speech.family_runner import FamilyRunner, VoiceInfo, no_context, refuse
from omniduplex.pipeline.speech.registry import TTSFamily, init_checkpoint, register_family
from omniduplex.pipeline.stages.engine_build import EngineSettings

NAME = "voxcpm2"
"""The family's name (``init-model --arch voxcpm2-PRESET``, ``GET /v1/audio/voices``)."""

DEFAULT_SAMPLING = dict(
    cfg_value=2.0, inference_timesteps=10, min_len=2, max_len=None, seed=None, ignore_stop=False
)
"""``VoxCPM2Model.generate`` defaults (``max_len``: the prompt's budget; ``ignore_stop``: run to ``max_len``,
for benchmarks on random weights)."""


@dataclass
class PatchEvent:
    """One engine output of a request: ``latents`` ``[patch_size, feat_dim]`` (every step makes one)."""

    request_id: str
    latents: torch.Tensor | None
    finished: bool
    finish_reason: str | None = None


class VoxCPM2Engine:
    """Continuous-batching VoxCPM2 of one loaded checkpoint (the ``lm`` part).

    Args:
        model: the checkpoint.
        engine: the engine's settings (:class:`EngineSettings`).
        batch_solver: the lever: one flow-matching solver call for all requests due in a step (``False``:
            one per request, the unbatched tail).
    """

    def __init__(
        self,
        model: VoxCPM2,
        engine: EngineSettings = EngineSettings(),
        batch_solver: bool = True,
    ) -> None:
        if model.lm is None:
            raise ValueError("VoxCPM2Engine needs the 'lm' part loaded")
        self.model, self.lm = model, model.lm
        cpu_ops.attach(self.lm.base_lm)
        cpu_ops.attach(self.lm.residual_lm)
        self.adapter = VoxCPM2Adapter(self.lm, batch_solver)
        self.engine = engine.build(self.adapter, self.lm.stop_head.weight, "voxcpm2")

    @property
    def solver_calls(self) -> int:
        """Flow-matching solver calls so far (one per step with the lever, one per request without)."""
        return self.adapter.solver_calls

    @property
    def decode_steps(self) -> int:
        """Engine steps that made patches."""
        return self.adapter.decode_steps

    def add(self, request_id: str, prompt: VoxPrompt, sampling: dict | None = None) -> None:
        """Queue one utterance. ``sampling``: :data:`DEFAULT_SAMPLING` keys.

        Raises ValueError: an unknown key, ``inference_timesteps`` or ``max_len`` below 1, ``min_len`` below
        0, a duplicate id, or a prompt larger than the KV cache.
        """
        sp = {**DEFAULT_SAMPLING, **(sampling or {})}
        unknown = set(sp) - set(DEFAULT_SAMPLING)
        if unknown:
            raise ValueError(f"unknown VoxCPM2 sampling keys {sorted(unknown)}")
        max_len = prompt.max_patches if sp["max_len"] is None else min(int(sp["max_len"]), prompt.max_patches)
        if int(sp["inference_timesteps"]) < 1 or max_len < 1 or int(sp["min_len"]) < 0:
            raise ValueError(f"invalid VoxCPM2 sampling parameters: {sp}")
        params = SamplingParams(
            max_tokens=max_len, stop_token_ids=(STOP_ID,), seed=sp["seed"], ignore_eos=bool(sp["ignore_stop"])
        )
        dtype = self.lm.stop_head.weight.dtype
        req = Request(
            request_id, list(prompt.ids), params, prompt_embeds=prompt.embeds.to(dtype), embed_inputs=True
        )
        self.engine.add_request(req)  # draws a seed when none is given
        req.extra.update(
            audio=prompt.audio.clone(),
            cond=prompt.cond.to(device=self.lm.stop_head.weight.device, dtype=dtype),
            gen=torch.Generator().manual_seed(req.sampling.seed),
            cfg_value=float(sp["cfg_value"]),
            timesteps=int(sp["inference_timesteps"]),
            min_len=int(sp["min_len"]),
        )

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    @torch.no_grad()
    def step(self) -> list[PatchEvent]:
        """One engine iteration: a patch for every request whose prompt is done."""
        return [
            PatchEvent(o.request_id, o.extras.get("latents"), o.finished, o.finish_reason)
            for o in self.engine.step()
        ]


@torch.no_grad()
def synthesize(
    model: VoxCPM2,
    tok: TextTokenizer,
    text: str,
    voice: Voice | None = None,
    sampling: dict | None = None,
    engine: VoxCPM2Engine | None = None,
) -> tuple[torch.Tensor, int]:
    """Speak ``text`` alone: float32 PCM ``[n]`` at ``model.sample_rate`` (48 kHz) and that rate.

    Raises PromptError: no AudioVAE loaded, or a prompt :func:`build_prompt` refuses.
    """
    if model.vae is None:
        raise PromptError("speaking needs the AudioVAE (load the 'vae' part)")
    prompt = build_prompt(model.lm, tok, text, voice, model.config.context)
    rows = len(prompt.ids) + prompt.max_patches
    engine = engine or VoxCPM2Engine(model, EngineSettings(num_blocks=-(-rows // 16) + 1, max_num_seqs=1))
    stream = VAEStream(model.vae, prompt.context)
    rid = f"synth-{id(stream)}"
    engine.add(rid, prompt, sampling)
    pieces = []
    done = False
    while not done:
        for ev in engine.step():
            if ev.request_id != rid:
                continue
            if ev.latents is not None:
                pieces.append(stream.feed(ev.latents))
            done = done or ev.finished
    pieces.append(stream.flush())
    return torch.cat(pieces), model.sample_rate


class VoxCPM2Runner(FamilyRunner):
    """VoxCPM2: the lever is the batched flow-matching solver (:class:`VoxCPM2Engine`)."""

    family, cloning, greedy = NAME, True, {}

    def __init__(self, model_dir, max_num_seqs: int = 16, num_blocks: int = 512, lever: bool = True) -> None:
        from tokenizers import Tokenizer

        from omniduplex.models.voxcpm2.model import load_voxcpm2
        from omniduplex.models.voxcpm2.prompt import TextTokenizer, VoiceBank

        self.model = load_voxcpm2(model_dir)
        self.tok = TextTokenizer(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))
        self.bank = VoiceBank(self.model.lm, self.model.vae)
        sizes = EngineSettings(num_blocks=num_blocks, max_num_seqs=max_num_seqs)
        self.engine = VoxCPM2Engine(self.model, sizes, batch_solver=lever)
        self.sample_rate, self.ref_rate = self.model.sample_rate, self.model.vae.cfg.sample_rate
        self.context = min(self.model.config.context, num_blocks * 16)

    def voices(self) -> list[VoiceInfo]:
        from omniduplex.models.voxcpm2.prompt import DEFAULT_VOICE

        return [VoiceInfo(n, n != DEFAULT_VOICE) for n in self.bank.names]

    def prompt(self, text, voice=None, ref=None, ref_text=None, instructions=None, language="auto"):
        from omniduplex.models.voxcpm2.prompt import PromptError, build_prompt, make_voice

        try:
            v = self.bank.get(voice)
        except PromptError as e:
            raise refuse(e, "voice") from e
        if ref is not None:
            try:
                cont = ref if ref_text else None
                v = make_voice(self.model.lm, self.model.vae, "request", ref, cont, ref_text or "")
            except PromptError as e:
                raise refuse(e, "ref_audio") from e
        try:
            return build_prompt(self.model.lm, self.tok, text, v, self.context)
        except PromptError as e:
            raise refuse(e, "input") from e

    def register(self, name, ref, ref_text=None):
        from omniduplex.models.voxcpm2.prompt import PromptError

        try:
            self.bank.register(name, ref, ref if ref_text else None, ref_text or "")
        except PromptError as e:
            raise refuse(e, "ref_audio") from e
        return name

    def budget(self, prompt, max_frames):
        # one patch (160 ms) per step: frames are patches here; the prompt's own budget also caps it
        room = self.context - len(prompt.ids)
        if room < 1:
            raise no_context(self.family, len(prompt.ids), self.context)
        return {"max_len": max(1, min(max_frames, room))}

    def decoder(self, prompt):
        from omniduplex.models.voxcpm2.vae_stream import VAEStream

        return VAEStream(self.model.vae, prompt.context)

    def _decode(self, decoder, event):
        return decoder.feed(event.latents) if event.latents is not None else torch.zeros(0)


def _init(out: Path, preset: str, seed: int, variant: str | None) -> dict:
    from omniduplex.models.voxcpm2.model import load_voxcpm2
    from omniduplex.models.voxcpm2.presets import write_voxcpm2_checkpoint

    return init_checkpoint(
        out, preset, lambda: write_voxcpm2_checkpoint(out, preset, seed), load_voxcpm2, NAME
    )


register_family(
    TTSFamily(
        NAME,
        detect=is_voxcpm2,
        runner=VoxCPM2Runner,
        sample_rate=48_000,
        cloning=True,
        presets=PRESETS,
        init=_init,
        bench="omniduplex.benchmarks.tts_voxcpm2:bench",
    )
)
