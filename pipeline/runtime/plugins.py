"""Plugins: modules that register what the project does not ship (a TTS family with
:func:`~omniduplex.pipeline.speech.registry.register_family`; later stage kinds and surfaces), named by
``--plugin MODULE_OR_FILE`` on ``serve``, ``speak``, ``init-model`` and ``bench tts``.

A plugin is imported once per process: :func:`load` here, and again in every stage process
(:mod:`.process_backend` hands :func:`loaded` to each), so a registered family serves in the cascade's
stage processes too. A name ending in ``.py`` (or naming a file) is imported from that file; any other is a
module on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

_LOADED: list[str] = []


class PluginError(ImportError):
    """A plugin that cannot be imported: ``str(e)`` names it and the cause."""


def _import_file(path: Path) -> None:
    name = f"omniduplex_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def load(names: Iterable[str]) -> list[str]:
    """Import each plugin of ``names`` not imported yet (module names, or ``.py`` files: made absolute), in
    order; returns :func:`loaded`.

    Raises PluginError: a plugin that is not found or fails while importing (the cause chained)."""
    for name in names:
        is_file = name.endswith(".py") or Path(name).is_file()
        key = str(Path(name).resolve()) if is_file else name
        if key in _LOADED:
            continue
        try:
            if is_file:
                if not Path(key).is_file():
                    raise FileNotFoundError(f"no file {key}")
                _import_file(Path(key))
            else:
                importlib.import_module(name)
        except Exception as e:
            raise PluginError(f"plugin {name!r} cannot be loaded: {type(e).__name__}: {e}") from e
        _LOADED.append(key)
    return loaded()


def loaded() -> list[str]:
    """The plugins this process has imported, in order (files as absolute paths): what a child process
    passes to :func:`load` to register the same."""
    return list(_LOADED)
