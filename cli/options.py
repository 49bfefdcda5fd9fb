"""Option parsing shared by the CLI's commands."""

from __future__ import annotations


def levels(concurrency: str) -> list[int]:
    """``"1,4,16"`` → ``[1, 4, 16]`` (a ``--concurrency`` option).

    Raises ValueError: a part that is not an integer."""
    return [int(c) for c in concurrency.split(",")]
