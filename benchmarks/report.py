"""How the benchmarks report: a Markdown table on stdout and, when asked, the raw results as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def print_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print a Markdown table: ``header`` then one line per row (cells already formatted, or ``str()``-ed)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def write_json(res: Any, json_out: Path | None) -> None:
    """Write ``res`` to ``json_out`` as indented JSON (nothing when ``json_out`` is ``None``)."""
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))
