"""The surfaces' adapter to a duplex session (:mod:`omniduplex.app.host.duplex_port`) over a real duplex
service on a moshi-tiny folder (its clock ticking every 80 ms on its thread): wire audio at 8 kHz becomes
80 ms 24 kHz engine frames, the model's frames come back as 20 ms 8 kHz frames after a prebuffer, running dry
restarts the prebuffer (counted), a wire far ahead of real time has frames dropped (counted, nothing raised),
and closing frees the engine row. Also which calls run the duplex model: ``serve --duplex-surfaces`` (bad
names refused at the command line) and an offer's own choice."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omniduplex.app.host.duplex import DuplexService
from omniduplex.app.host.duplex_port import PREBUFFER_MS, DuplexPort
from omniduplex.models.moshi.checkpoint import write_moshi_checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_moshi_checkpoint(tmp_path_factory.mktemp("moshi") / "tiny", "tiny")


async def _until(cond, what: str, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


def test_port_resamples_both_ways_prebuffers_counts_and_frees_its_row(folder):
    service = DuplexService(folder, capacity=2)
    service.load()
    texts: list[str] = []

    async def main():
        service.start(asyncio.get_running_loop())
        port = DuplexPort(service, "p", 8000, 8000, on_text=texts.append)
        try:
            await port.open()
            pcm, filled = port.pull()
            assert pcm.dtype == np.int16 and pcm.shape == (160,) and filled == 0  # nothing yet
            t = np.arange(8000) / 8000  # 1 s at 8 kHz → 12 whole 80 ms frames (soxr holds a few samples)
            tone = (0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)
            pushed = sum(port.push(tone[i : i + 160]) for i in range(0, 8000, 160))
            assert 11 <= pushed <= 12 and port.frames_in == pushed and port.input_dropped == 0
            await _until(lambda: port.queued >= 8 * PREBUFFER_MS, "a prebuffer of model audio")
            got = [port.pull() for _ in range(port.queued // 160)]
            assert all(f == 160 for _, f in got) and any(np.abs(p).max() > 0 for p, _ in got)
            pcm, filled = port.pull()  # ran dry: the prebuffer starts over
            assert filled < 160 and port.output_underruns == 1
            assert port.pull()[1] == 0
            await _until(lambda: bool(texts), "the model's text")
            assert all(x.endswith(" ") and x[:-1].isdigit() for x in texts)
            port.push(np.zeros(8000 * 3, np.int16))  # 3 s at once: more than the engine's 2 s queue
            assert port.input_dropped > 0
            assert service.stats()["sessions"] == 1
        finally:
            await port.close("test over")
            service.stop()
        assert service.stats()["sessions"] == 0
        assert port.push(np.zeros(160, np.int16)) == 0  # closed: input is ignored

    asyncio.run(main())


def test_duplex_surfaces_are_parsed_and_bad_ones_refused_by_serve(tmp_path):
    import subprocess
    import sys

    from omniduplex.app.host.config import parse_duplex_surfaces

    assert parse_duplex_surfaces("browser, phone,browser", "m") == ("browser", "phone")
    assert parse_duplex_surfaces(None, None) == ()
    with pytest.raises(ValueError, match="unknown duplex surface.*fax"):
        parse_duplex_surfaces("browser,fax", "m")
    with pytest.raises(ValueError, match="need a duplex model"):
        parse_duplex_surfaces("kiosk", None)
    r = subprocess.run(
        [sys.executable, "-m", "omniduplex.cli.main", "serve", "--duplex-surfaces", "kiosk"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "need a duplex model" in r.stderr


def test_an_offer_chooses_the_duplex_model_by_field_then_query_then_serve_default():
    from types import SimpleNamespace

    from omniduplex.app.surfaces.browser.routes import wants_duplex
    from omniduplex.app.surfaces.browser.webrtc import OfferError

    host = SimpleNamespace(cfg=SimpleNamespace(duplex_surfaces=("browser",)))
    cascade = SimpleNamespace(cfg=SimpleNamespace(duplex_surfaces=()))
    assert wants_duplex(False, "1", host) is False  # the body's field wins
    assert wants_duplex(None, "0", host) is False and wants_duplex(None, "true", cascade) is True
    assert wants_duplex(None, None, host) is True and wants_duplex(None, None, cascade) is False
    with pytest.raises(OfferError, match="true or false"):
        wants_duplex("yes", None, host)
    with pytest.raises(OfferError, match=r"\?duplex="):
        wants_duplex(None, "maybe", host)
