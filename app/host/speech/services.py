"""Which speech and transcription services a server runs (:mod:`.contract`), loaded on first use.

Speech models are checkpoint folders (``serve --tts DIR``, repeatable), each named by its folder's name; a
``POST /v1/audio/speech`` request's ``model`` picks one (the name, or the folder as given), and the API's
generic names (:data:`DEFAULT_NAMES`) pick the first. The family of each comes from its ``config.json``
(:func:`~omniduplex.pipeline.speech.registry.family_of`): the family's own service when it declares one
(Qwen3-TTS: :mod:`.qwen3`, or :mod:`.qwen3_graph` with ``tts_graph``), else its runner on the shared engine
thread (:mod:`.runner_speech`). Without ``--tts`` the cascade manifest's TTS serves when it is a checkpoint
folder, else the packaged Piper voice.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path

from omniduplex.app.host.speech.contract import SpeechError, SpeechService, Transcriber

DEFAULT_NAMES = ("omniduplex", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
"""``model`` values that mean "the server's first speech model" (ours and OpenAI's)."""
PIPER = "piper"


def tts_dirs(cfg) -> list[str]:
    """The speech checkpoints of a host config ``cfg``: ``cfg.tts`` (a folder or a list of them), else the TTS
    of a cascade manifest ``cfg.model`` when it is a checkpoint folder of a TTS family (the assistant's
    voice), else none (Piper)."""
    if cfg.tts:
        return [cfg.tts] if isinstance(cfg.tts, str | Path) else [str(d) for d in cfg.tts]
    from omniduplex.models.cascade.manifest import is_cascade, load_manifest

    if cfg.model and is_cascade(cfg.model):
        m = load_manifest(cfg.model)
        return [str(m.tts)] if m.tts_is_checkpoint else []
    return []


def load_speech(cfg, model_dir: str | None = None) -> SpeechService:
    """The speech service of checkpoint ``model_dir`` (default: the first of :func:`tts_dirs`; none: the
    packaged Piper voice), by its family (blocking: loads weights).

    Raises:
        WeightsError / CheckpointError / ConfigError: the weights do not load (a missing tensor is named).
        ValueError: the folder is no TTS family's checkpoint.
    """
    from omniduplex.pipeline.speech.registry import family_of, known, resolve

    tts_dir = model_dir or next(iter(tts_dirs(cfg)), None)
    if tts_dir is None:
        from omniduplex.app.host.speech.piper import packaged_piper

        return packaged_piper()
    family = family_of(tts_dir)
    if family is None:
        raise ValueError(f"{tts_dir}: not a checkpoint of a registered TTS family ({known()}; config.json)")
    if family.service is not None:  # a family with a speech service of its own
        return resolve(family.service)(tts_dir, cfg)
    from omniduplex.app.host.speech.runner_speech import RunnerSpeech

    return RunnerSpeech(family.runner(tts_dir))


class SpeechModels:
    """A server's speech services by model name, each loaded on first use (module docstring).

    Args:
        cfg: the host config (:func:`tts_dirs`).
        given: a service for the first model, already loaded (tests), closed by its owner.
    """

    def __init__(self, cfg, given: SpeechService | None = None) -> None:
        self.cfg = cfg
        self.dirs = {Path(d).name: str(d) for d in tts_dirs(cfg)} or {PIPER: None}
        self.services: dict[str, SpeechService] = {}
        self.failed: dict[str, SpeechError] = {}  # models whose checkpoint did not load, and why
        self._given = set()
        if given is not None:
            self.add(self.names[0], given)
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        """The model names a request may give (the first is the default)."""
        return list(self.dirs)

    def add(self, name: str, service: SpeechService) -> None:
        """Serve ``service`` as model ``name`` (tests: a service loaded with test settings)."""
        self.dirs.setdefault(name, None)
        self.services[name] = service
        self._given.add(name)

    def resolve(self, model: str | None) -> str:
        """The model name ``model`` selects. Raises SpeechError (``model_not_found``): no such model."""
        if model is None or model in DEFAULT_NAMES:
            return self.names[0]
        if model in self.dirs:
            return model
        for name, d in self.dirs.items():
            if d is not None and Path(model) == Path(d):
                return name
        raise SpeechError(
            f"unknown model {model!r}; this server speaks with {self.names}", "model", "model_not_found"
        )

    def get(self, model: str | None = None) -> SpeechService:
        """The service of ``model`` (:meth:`resolve`), loaded on first use (blocking); a checkpoint that does
        not load is remembered and refused from then on, the other models unaffected.

        Raises SpeechError: an unknown model (``model_not_found``), or one whose checkpoint does not load
        (``model_not_loadable``: the loader's message, e.g. the missing tensor's name)."""
        from omniduplex.models.checkpoint import CheckpointError
        from omniduplex.models.config import ConfigError

        name = self.resolve(model)
        with self._lock:
            if name in self.failed:
                raise self.failed[name]
            if name not in self.services:
                try:
                    self.services[name] = load_speech(self.cfg, self.dirs[name])
                except (CheckpointError, ConfigError, ValueError) as e:
                    self.failed[name] = SpeechError(
                        f"model {name!r} cannot be loaded: {e}", "model", "model_not_loadable"
                    )
                    raise self.failed[name] from e
            return self.services[name]

    def describe(self) -> list[dict]:
        """``GET /v1/audio/voices``: every model's :meth:`~.contract.SpeechService.describe` under its
        ``model`` name (loading each; one that does not load is listed with its ``error``)."""
        out = []
        for name in self.names:
            try:
                out.append({"model": name, **self.get(name).describe()})
            except SpeechError as e:
                out.append({"model": name, "error": str(e)})
        return out

    def close(self) -> None:
        """Close the services loaded here (given ones are their owner's)."""
        for name, svc in self.services.items():
            if name not in self._given:
                svc.close()


@lru_cache(maxsize=1)
def packaged_whisper() -> Transcriber:
    """The packaged Whisper tiny.en (``models/weights.py``), loaded once per process.

    Raises:
        WeightsError: its package is missing or corrupted.
    """
    from omniduplex.models.cascade.whisper import WhisperASR
    from omniduplex.models.weights import WHISPER_TINY_EN, locate

    return WhisperASR(locate(WHISPER_TINY_EN).parent)
