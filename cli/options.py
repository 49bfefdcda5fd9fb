"""Option parsing shared by the CLI's commands."""

from __future__ import annotations


def levels(concurrency: str) -> list[int]:
    """``"1,4,16"`` → ``[1, 4, 16]`` (a ``--concurrency`` option).

    Raises ValueError: a part that is not an integer."""
    return [int(c) for c in concurrency.split(",")]


PLUGIN_HELP = (
    "Module or .py file that registers TTS families (repeatable; imported before anything else, and in "
    "every stage process)."
)


def load_plugins(names: list[str] | None) -> None:
    """Import the ``--plugin`` modules (:func:`omniduplex.pipeline.runtime.plugins.load`).

    Raises typer.BadParameter: a plugin that cannot be imported (the cause named)."""
    import typer

    from omniduplex.pipeline.runtime.plugins import PluginError, load

    try:
        load(names or [])
    except PluginError as e:
        raise typer.BadParameter(str(e), param_hint="--plugin") from e
