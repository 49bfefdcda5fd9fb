"""The wheel as a user installs it: ``pip wheel`` of the source tree, installed NON-editable into a fresh
virtual environment, serves the browser page, the kiosk page and the Realtime API (``omniduplex serve
--model tiny``, stage processes), every module and data file taken from the venv, none from the checkout."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import site
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import websockets

from omniduplex.benchmarks.local_server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TOP = ("app", "benchmarks", "cli", "kernels", "models", "pipeline", "relay", "web")
"""The repository root's folders that ship as ``omniduplex.<folder>`` (``setup.py``)."""
DATA = {".py", ".html", ".js", ".css", ".yaml", ".cpp", ".wav"}
"""Suffixes that ship: modules, and the package data ``pyproject.toml`` lists."""
BUILD_LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__", ".git", ".pytest_cache", ".ruff_cache",
                   ".hypothesis")
READY_TIMEOUT_S = 600.0
"""Stage processes of the tiny model on a busy 2-core machine took ~160 s to report ready."""


def _shipped(root: Path) -> set[str]:
    """Paths (relative to the package root, ``/``-separated) of every file of ``root`` the wheel must hold."""
    out = set()
    for top in TOP:
        for p in (root / top).rglob("*"):
            if p.is_file() and p.suffix in DATA and "__pycache__" not in p.parts:
                out.add(p.relative_to(root).as_posix())
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a clean copy of the tree (a ``build/`` left in the checkout could ship deleted modules),
    built offline with the installed setuptools."""
    d = tmp_path_factory.mktemp("wheel")
    src = d / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", d, src],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = d.glob("omniduplex-*.whl")
    return whl


def test_wheel_holds_every_module_and_page_and_no_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"omniduplex", wheel.name.split("-py")[0] + ".dist-info"}, tops
    inside = {n.removeprefix("omniduplex/") for n in names if n.startswith("omniduplex/")}
    missing = _shipped(ROOT) - inside
    assert not missing, sorted(missing)
    for must in (
        "app/surfaces/realtime/__init__.py",
        "web/index.html",
        "web/kiosk.html",
        "pipeline/default_graph.yaml",
        "kernels/csrc/cpu_ops.cpp",
    ):
        assert must in inside
    assert not [n for n in inside if n.split("/", 1)[0] in ("tests", "scripts", "examples", "build")]
    assert not [n for n in inside if "__pycache__" in n or n.endswith(".pyc")]
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "omniduplex = omniduplex.cli.main:main" in entry


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv that reuses this interpreter's packages (torch and the other dependencies) and holds the
    wheel, installed non-editable."""
    d = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(d)], check=True, timeout=300)
    if sys.prefix != sys.base_prefix:  # we run in a venv: --system-site-packages sees only its base's
        (pure,) = (d / "lib").glob("python*/site-packages")
        (pure / "_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    r = subprocess.run(
        [str(d / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d


def _env() -> dict[str, str]:
    """This environment without anything that would put the checkout on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_installed_wheel_imports_from_the_venv_not_the_checkout(venv, tmp_path):
    code = (
        "import json, omniduplex.app.server as s, omniduplex.kernels.cpu_ops as k;"
        "import omniduplex.pipeline.config as c;"
        "print(json.dumps([s.__file__, str(s.WEB_DIR), str(k.SOURCE), str(c.DEFAULT_GRAPH)]))"
    )
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=_env(), cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    server, web, cpp, graph = (Path(p) for p in json.loads(r.stdout.strip().splitlines()[-1]))
    for p in (server, web, cpp, graph):
        assert p.resolve().is_relative_to(venv.resolve()), p
        assert p.exists(), p
    assert (web / "index.html").read_bytes() == (ROOT / "web" / "index.html").read_bytes()


def _wait_ready(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready after {READY_TIMEOUT_S:.0f} s: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


async def _first_event(port: int) -> dict:
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
        return json.loads(await asyncio.wait_for(ws.recv(), 60))


def test_installed_wheel_serves_the_pages_and_the_realtime_api(venv, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "omniduplex"), "serve", "--model", "tiny", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=tmp_path,
        )
    try:
        _wait_ready(proc, port, log)
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        kiosk = httpx.get(f"http://127.0.0.1:{port}/kiosk", timeout=30)
        script = httpx.get(f"http://127.0.0.1:{port}/app.js", timeout=30)
        first = asyncio.run(_first_event(port))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert page.status_code == 200 and page.content == (ROOT / "web" / "index.html").read_bytes()
    assert kiosk.status_code == 200 and kiosk.content == (ROOT / "web" / "kiosk.html").read_bytes()
    assert script.status_code == 200 and script.content == (ROOT / "web" / "app.js").read_bytes()
    assert first["type"] == "session.created", first
    assert "no web client" not in log.read_text()
