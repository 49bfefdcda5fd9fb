"""The import rules (ARCHITECTURE.md, "Layout"), read from the source with ``ast``: no cycle between
top-level folders, and none between modules anywhere in the tree; the serving code (app, pipeline, models,
kernels, relay) never imports benchmarks or the CLI; kernels import nothing of models, pipeline or app.
Inside ``app/``: the core imports no host and no surface, the host no surface, a surface no other surface
(``surfaces/wire`` holds the wire formats they share), and the top level holds at most six modules.

Every import counts, wherever it stands: at the top of a module, inside a function, and under
``if TYPE_CHECKING:`` (an import cycle there is still a knot a reader must untie)."""

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


def module_graph() -> dict[str, set[str]]:
    """Module → the modules of the tree it imports (anywhere in it). ``from pkg import name`` is an edge to
    ``pkg.name`` when that is a module, else to ``pkg``; ``import a.b`` to ``a.b``."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                stem = ".".join([*base, node.module] if node.module else base) if node.level else node.module
                out.update(f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names)
        graph[module] = {m for m in out if m in modules and m != module}
    return graph


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
    """One cycle of a graph given by its edges ``(a, b)`` as a path ``[a, b, ..., a]``, or ``None``."""
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


def test_no_import_cycle_between_modules():
    """No module of the tree imports itself through others (the folder rule above is coarser)."""
    graph = module_graph()
    cycle = _cycle([(a, b) for a, bs in graph.items() for b in bs])
    assert cycle is None, "cycle " + " -> ".join(cycle)


APP_PARTS = ("core", "host", "surfaces")
WIRE = "omniduplex.app.surfaces.wire"
"""Wire formats shared by surfaces (not a surface): any surface may import them."""


def app_part(module: str) -> str | None:
    """``core``, ``host``, ``surfaces.<name>`` (``surfaces.wire`` for the shared wire formats) or ``top`` (a
    module at the top of ``app/``) for a module of ``app``; ``None`` outside it."""
    parts = module.split(".")
    if parts[:2] != ["omniduplex", "app"]:
        return None
    if len(parts) == 2 or parts[2] not in APP_PARTS:
        return "top"
    if parts[2] == "surfaces":
        return "surfaces" if len(parts) == 3 else f"surfaces.{parts[3]}"
    return parts[2]


def app_violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports that break the rules of ``app/``: the core imports no host, surface or top-level module;
    the host no surface or top-level module; a surface no other surface (the wire formats excepted) and no
    top-level module; the wire formats only the core."""
    bad = []
    for module, imported in sorted(graph.items()):
        src = app_part(module)
        if src is None or src == "top":
            continue
        for name in sorted(imported):
            dst = app_part(name)
            if dst is None or dst == src:
                continue
            if src == "core" and dst != "core":
                bad.append(f"core imports {dst}: {module} -> {name}")
            elif src == "host" and dst not in ("core", "host"):
                bad.append(f"host imports {dst}: {module} -> {name}")
            elif src == "surfaces.wire" and dst != "core":
                bad.append(f"the wire formats import {dst}: {module} -> {name}")
            elif src.startswith("surfaces") and dst not in ("core", "host", "surfaces.wire"):
                bad.append(f"{src} imports {dst}: {module} -> {name}")
    return bad


def test_app_core_host_and_surfaces_keep_their_rules():
    assert app_violations(module_graph()) == []


def test_app_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in (ROOT / "app").glob("*.py"))
    assert len(top) <= 6, top


def test_pipeline_top_level_holds_at_most_ten_modules_and_its_rooms_keep_to_their_jobs():
    top = sorted(p.name for p in (ROOT / "pipeline").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 10, top
    # the rooms keep to their jobs: the text policy runs no model (no engine, no TTS family), the TTS
    # families' engine wrappers and the runtime know no surface
    graph = module_graph()
    for room, banned in (
        ("omniduplex.pipeline.text.", ("omniduplex.pipeline.engine", "omniduplex.pipeline.speech")),
        ("omniduplex.pipeline.speech.", ("omniduplex.pipeline.runtime", "omniduplex.app")),
        ("omniduplex.pipeline.runtime.", ("omniduplex.app",)),
    ):
        for src, dsts in graph.items():
            if src.startswith(room):
                bad = [d for d in dsts if d.startswith(banned)]
                assert not bad, f"{src} imports {bad}"


def test_the_module_checkers_see_a_hand_drawn_cycle_and_each_broken_rule():
    drawn = {
        "omniduplex.app.core.session": {"omniduplex.app.core.conversation"},
        "omniduplex.app.core.conversation": {"omniduplex.app.core.history"},
        "omniduplex.app.core.history": {"omniduplex.app.core.session"},
    }
    cycle = _cycle([(a, b) for a, bs in drawn.items() for b in bs])
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == set(drawn)
    assert _cycle([("a", "b"), ("b", "c"), ("a", "c")]) is None
    bad = app_violations(
        {
            "omniduplex.app.core.session": {"omniduplex.app.host.state"},
            "omniduplex.app.host.state": {"omniduplex.app.surfaces.realtime.routes", "omniduplex.app.core.x"},
            "omniduplex.app.surfaces.browser.webrtc": {
                "omniduplex.app.surfaces.kiosk.config",
                "omniduplex.app.surfaces.wire.g711",
                "omniduplex.app.host.state",
            },
            "omniduplex.app.surfaces.wire.g711": {"omniduplex.app.surfaces.phone.routes"},
        }
    )
    assert [b.split(":")[0] for b in bad] == [
        "core imports host",
        "host imports surfaces.realtime",
        "surfaces.browser imports surfaces.kiosk",
        "the wire formats import surfaces.phone",
    ]
    graph = module_graph()  # and the real graph resolves `from pkg import module` to the module
    assert "omniduplex.app.surfaces.phone.sip.message" in graph["omniduplex.app.surfaces.phone.sip.uas"]
    assert "omniduplex.app.surfaces.phone.sip" not in graph["omniduplex.app.surfaces.phone.sip.uas"]
