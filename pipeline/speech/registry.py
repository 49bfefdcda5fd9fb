"""The TTS families by registration: one :class:`TTSFamily` per family, declared once with
:func:`register_family` in the family's own module, read by every command that takes a TTS checkpoint
(``serve --tts``, ``speak``, ``init-model``, ``init-cascade``, ``bench tts``) and by the cascade's TTS stage.

The built-in families are the modules of this package that call :func:`register_family` (Qwen3-TTS,
VoxCPM2, Higgs Audio v3, Fish Speech S2 Pro: :mod:`.qwen3_tts`, :mod:`.voxcpm2`, :mod:`.higgs`,
:mod:`.fish_speech`); every module here is imported on the first lookup. A plugin module
(``--plugin``, :mod:`omniduplex.pipeline.runtime.plugins`) registers more the same way.

What a declaration names by dotted path (``"package.module:function"``, imported only by the command that
uses it) lives above the pipeline: the speech service of a family with its own (``service``), and the
family's benchmark (``bench``).
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omniduplex.pipeline.speech.family_runner import FamilyRunner


@dataclass(frozen=True)
class TTSFamily:
    """One TTS family's declaration.

    Attributes:
        name: the family's name (``init-model --arch NAME`` or ``NAME-PRESET``; ``GET /v1/audio/voices``'s
            ``family``).
        detect: whether a checkpoint folder is this family's, read from its ``config.json`` (no weights
            loaded; never raises).
        runner: loads a checkpoint folder as a :class:`FamilyRunner` (``model_dir``, keyword
            ``max_num_seqs``, ``num_blocks``, ``lever``); raises ``CheckpointError`` naming a missing tensor.
        sample_rate: the family's native output rate (Hz; ``speak`` writes it unless ``--rate`` says
            otherwise; a loaded runner's :attr:`FamilyRunner.sample_rate` is the checkpoint's own).
        cloning: whether a request may clone a voice from a reference clip.
        presets: the random-weight presets ``init-model`` writes (``()``: none).
        init: ``(out, preset, seed, variant) -> dict``: writes one preset's deterministic random checkpoint
            into ``out`` and returns the fields of ``init-model``'s JSON line (``architecture``,
            ``parameters``, ...); raises ValueError for a variant it does not have.
        variants: what ``init-model --variant`` may name (``()``: the family has no variants).
        voice_names: the named voices of a checkpoint folder read from its files without loading weights
            (``init-cascade --tts-voice`` checks against them; ``None``: not known before loading).
        service: ``"module:function"`` of ``(model_dir, cfg) -> SpeechService`` for a family with its own
            speech service (``None``: the shared engine-thread service over :attr:`runner`).
        bench: ``"module:function"`` of the family's ``bench tts`` (``(model_dir, levels, *, threads,
            json_out, frames, processes) -> None``; ``None``: the runner's own benchmark).
    """

    name: str
    detect: Callable[[Path], bool]
    runner: Callable[..., FamilyRunner]
    sample_rate: int
    cloning: bool = False
    presets: tuple[str, ...] = ()
    init: Callable[[Path, str, int, str | None], dict] | None = None
    variants: tuple[str, ...] = ()
    voice_names: Callable[[Path], list[str]] | None = None
    service: str | None = None
    bench: str | None = None


_FAMILIES: dict[str, TTSFamily] = {}
_builtins_loaded = False


def register_family(family: TTSFamily) -> TTSFamily:
    """Make ``family`` known to every command (a family registered again under its name replaces the
    earlier one, so re-importing a module is harmless); returns it."""
    _FAMILIES[family.name] = family
    return family


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    pkg = importlib.import_module("omniduplex.pipeline.speech")
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_") and info.name != "registry":
            importlib.import_module(f"{pkg.__name__}.{info.name}")


def families() -> list[TTSFamily]:
    """Every registered family (the built-in ones first, then plugins' in registration order)."""
    _load_builtins()
    return list(_FAMILIES.values())


def family_named(name: str) -> TTSFamily:
    """The family registered as ``name``. Raises KeyError naming the known ones."""
    _load_builtins()
    if name not in _FAMILIES:
        raise KeyError(f"no TTS family {name!r}; registered: {sorted(_FAMILIES)}")
    return _FAMILIES[name]


def family_of(model_dir: str | Path) -> TTSFamily | None:
    """The family whose ``detect`` accepts the folder ``model_dir`` (``None``: not a folder, or no
    registered family's checkpoint)."""
    d = Path(model_dir)
    if not d.is_dir():
        return None
    return next((f for f in families() if f.detect(d)), None)


def known() -> str:
    """The registered families' names, for messages (``"qwen3-tts, voxcpm2, ..."``)."""
    return ", ".join(f.name for f in families())


def load_runner(model_dir: str | Path, **kw: Any) -> FamilyRunner:
    """The runner of the checkpoint in ``model_dir`` (its family from ``config.json``); ``kw``: the runner's
    arguments (``max_num_seqs``, ``num_blocks``, ``lever``).

    Raises:
        CheckpointError: a checkpoint of the family that does not load (a missing tensor: named).
        ValueError: no registered family's checkpoint.
    """
    family = family_of(model_dir)
    if family is None:
        raise ValueError(f"{model_dir}: not a checkpoint of a registered TTS family ({known()}; config.json)")
    return family.runner(model_dir, **kw)


def resolve(ref: str) -> Any:
    """The object a declaration's ``"module:attr"`` names (imported now).

    Raises ImportError / AttributeError: no such module or attribute."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def init_checkpoint(
    out: Path, preset: str, write: Callable[[], Any], load: Callable[[Path], Any], architecture: str, **extra
) -> dict:
    """The usual :attr:`TTSFamily.init`: ``write()`` the checkpoint, load it back with ``load(out)`` and
    describe it (``architecture``, ``extra``, ``parameters`` per part, their total, named ``voices`` when it
    has some, write and load seconds)."""
    t0 = time.perf_counter()
    write()
    written = time.perf_counter() - t0
    loaded = load(out)
    counts = loaded.num_parameters()
    info = dict(out=str(out), preset=preset, architecture=architecture, **extra, parameters=counts)
    if getattr(loaded, "voices", None):
        info["voices"] = sorted(loaded.voices)
    info.update(total_parameters=sum(counts.values()), write_seconds=round(written, 3))
    if hasattr(loaded, "load_seconds"):
        info["load_seconds"] = round(loaded.load_seconds, 3)
    return info
