"""The host's duplex service (:mod:`omniduplex.app.host.duplex`) on a moshi-tiny folder, CPU: frames reach
each session's queue from the clock thread, a tick over budget reaches the session as a ``tick_overrun``
event, a full engine refuses a join, and a leave frees the row for the next join."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omniduplex.app.host.duplex import DuplexFull, DuplexService
from omniduplex.models.moshi.checkpoint import write_moshi_checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_moshi_checkpoint(tmp_path_factory.mktemp("moshi") / "tiny", "tiny")


def test_frames_overruns_full_and_leave(folder):
    service = DuplexService(folder, capacity=2, budget_ms=0.0)  # every tick is over a 0 ms budget
    service.load()

    async def main():
        service.start(asyncio.get_running_loop())
        try:
            a, b = await service.join("a"), await service.join("b")
            with pytest.raises(DuplexFull):
                await service.join("c")
            service.push("a", np.zeros(1920, np.float32))
            for q in (a, b):
                frame, events = await asyncio.wait_for(q.get(), 30)
                assert frame.pcm.shape == (1920,) and frame.overrun
                assert events and events[0]["type"] == "tick_overrun" and events[0]["budget_ms"] == 0.0
            service.leave("b")
            c = await service.join("c")  # waits for the leave to be applied at the next tick
            frame, _ = await asyncio.wait_for(c.get(), 30)
            assert frame.session_id == "c"
            assert service.stats()["sessions"] == 2
            with pytest.raises(ValueError):
                service.push("b", np.zeros(1920, np.float32))
        finally:
            service.stop()

    asyncio.run(main())


def test_drain_does_not_wait_for_a_duplex_stream():
    """A duplex stream never ends by itself: the drain's busy list leaves it out (it is closed at once)."""
    from types import SimpleNamespace

    from omniduplex.app.host.drain import busy_sessions
    from omniduplex.app.surfaces.realtime.duplex import DuplexSession

    call = SimpleNamespace(id="dx1", session=DuplexSession("dx1", None))
    assert busy_sessions(SimpleNamespace(sessions={"dx1": call})) == []


def test_serve_refuses_two_duplex_models_and_a_bad_one(folder, tmp_path):
    from typer.testing import CliRunner

    from omniduplex.cli.main import cli

    def run(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(cli, ["serve", *args], terminal_width=400)
        return r.exit_code, " ".join(r.output.replace("│", " ").split())  # the error box, unwrapped

    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "moshi"}')
    code, out = run("--model", str(folder), "--duplex-model", str(other))
    assert code == 2 and "cannot serve beside --duplex-model" in out
    code, out = run("--duplex-model", str(tmp_path))
    assert code == 2 and "not a Moshi checkpoint folder" in out


def test_duplex_only_config_serves_the_moshi_folder_on_every_surface_without_a_cascade():
    from omniduplex.app.host.config import DUPLEX_SURFACES, HostConfig, duplex_only_config

    cfg = duplex_only_config(HostConfig(model="/m/moshi"), "/m/moshi")
    assert (cfg.duplex_model, cfg.model, cfg.duplex_only) == ("/m/moshi", None, True)
    assert cfg.duplex_surfaces == DUPLEX_SURFACES
    with pytest.raises(ValueError, match="cannot serve beside"):
        duplex_only_config(HostConfig(duplex_model="/m/other"), "/m/moshi")
