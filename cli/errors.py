"""Errors a person can act on: the command line prints them as one line, without a traceback.

Known: a checkpoint or config that does not load (``CheckpointError``, ``ConfigError``,
``GraphConfigError``, ``ChatTemplateError``), missing or corrupt weight packages (``WeightsError``),
unreadable audio (``AudioInputError``), a refused authentication setup (``AuthConfigError``), and a stage
that did not start (``StageStartError``, which names the stage's own cause). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import contextlib


def known_error_types() -> tuple[type[BaseException], ...]:
    """The exception classes of the module docstring (imported lazily: the CLI starts fast)."""
    from omniduplex.models.cascade.chat_template import ChatTemplateError
    from omniduplex.models.checkpoint import CheckpointError
    from omniduplex.models.config import ConfigError
    from omniduplex.models.weights import WeightsError
    from omniduplex.pipeline.audio_io import AudioInputError
    from omniduplex.pipeline.config import GraphConfigError

    types: list[type[BaseException]] = [
        CheckpointError,
        ConfigError,
        GraphConfigError,
        ChatTemplateError,
        WeightsError,
        AudioInputError,
    ]
    with contextlib.suppress(ImportError):  # needs pyzmq
        from omniduplex.pipeline.runtime.process_backend import StageStartError

        types.append(StageStartError)
    with contextlib.suppress(ImportError):
        from omniduplex.app.host.auth import AuthConfigError

        types.append(AuthConfigError)
    return tuple(types)


def one_line(e: BaseException) -> str | None:
    """``"<ExceptionType>: <message>"`` on one line for a known error (or one it was raised from), else
    ``None``."""
    known = known_error_types()
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, known):
            return " ".join(f"{type(e).__name__}: {e}".split())
        e = e.__cause__ or e.__context__
    return None
