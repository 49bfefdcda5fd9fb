"""The import rules between the top-level folders (ARCHITECTURE.md, "Layout"), read from the source with
``ast``: no cycle between folders; the serving code (app, pipeline, models, kernels, relay) never imports
benchmarks or the CLI; kernels import nothing of models, pipeline or app."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("app", "benchmarks", "cli", "kernels", "models", "pipeline", "relay")
SERVING = ("app", "pipeline", "models", "kernels", "relay")
FORBIDDEN = {
    **{top: {"benchmarks", "cli"} for top in SERVING},
    "kernels": {"benchmarks", "cli", "models", "pipeline", "app"},
}


def _modules() -> dict[str, Path]:
    """``"omniduplex.app.server"`` → its file, for every module under the top-level folders."""
    out = {}
    for top in TOP:
        for p in (ROOT / top).rglob("*.py"):
            if "__pycache__" in p.parts:
                continue
            parts = p.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("omniduplex", *parts))] = p
    return out


def _imported(module: str, path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (anywhere in it: top level, functions, TYPE_CHECKING),
    relative imports resolved against ``module``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            names.add(stem)
            names.update(f"{stem}.{a.name}" for a in node.names)  # `from pkg import module`
    return names


def _folder(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "omniduplex" and parts[1] in TOP else None


def folder_edges() -> dict[tuple[str, str], list[str]]:
    """``(importing folder, imported folder)`` → the modules that make that edge (``"a.b -> c.d"``)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in _modules().items():
        src = _folder(module)
        for name in sorted(_imported(module, path)):
            dst = _folder(name)
            if dst is not None and dst != src:
                edges.setdefault((src, dst), []).append(f"{module} -> {name}")
    return edges


def _cycle(edges) -> list[str] | None:
    """One cycle of the folder graph as a path ``[a, b, ..., a]``, or ``None``."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*stack, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_every_folder_is_seen():
    modules = _modules()
    assert {_folder(m) for m in modules} == set(TOP)
    assert "omniduplex.app.server" in modules and "omniduplex.kernels.cpu_ops" in modules


def test_no_import_cycle_between_top_level_folders():
    edges = folder_edges()
    cycle = _cycle(edges)
    assert cycle is None, "cycle " + " -> ".join(cycle) + ": " + "; ".join(
        m for a, b in zip(cycle, cycle[1:]) for m in edges[(a, b)][:3]
    )


@pytest.mark.parametrize("src", sorted(FORBIDDEN))
def test_forbidden_imports(src):
    edges = folder_edges()
    bad = [m for (a, b), ms in edges.items() if a == src and b in FORBIDDEN[src] for m in ms]
    assert not bad, bad


def test_the_checker_sees_a_cycle_and_a_relative_import(tmp_path):
    """The checker itself: a cycle and a forbidden edge drawn by hand are found, relative imports resolve."""
    assert _cycle({("app", "models"): [], ("models", "pipeline"): [], ("pipeline", "app"): []}) == [
        "app", "models", "pipeline", "app",
    ]
    assert _cycle({("app", "models"): [], ("models", "kernels"): []}) is None
    f = tmp_path / "x.py"
    f.write_text("from ..pipeline import workers\nfrom . import session\nimport omniduplex.relay.edge\n")
    assert _imported("omniduplex.app.x", f) >= {
        "omniduplex.pipeline.workers",
        "omniduplex.app.session",
        "omniduplex.relay.edge",
    }
