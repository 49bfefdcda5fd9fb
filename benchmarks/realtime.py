"""``omniduplex bench realtime``: N concurrent Realtime API clients, each streaming a speech WAV in real time.

Each client connects to ``/v1/realtime`` (an ``omniduplex serve`` started here on a loopback port, or
``--url``), streams the question in 20 ms ``input_audio_buffer.append`` pieces at real-time pace under
server VAD, and measures:

* **commit → first audio**: ``input_audio_buffer.committed`` → the first ``response.output_audio.delta``
  (ms, client clock);
* **barge-in → last audio**: after half a second of reply audio it speaks again; from its
  ``input_audio_buffer.speech_started`` to the last ``response.output_audio.delta`` before ``response.done``
  (ms; negative = the deltas had already stopped);
* errors: ``error`` events, responses that did not end ``completed`` / ``cancelled`` as expected, timeouts.

Levels run one after another (default c = 1, 4, 16); p50/p90/p99 over all clients of a level.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import numpy as np
import soxr
import websockets

from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.pipeline.audio_io import load_audio

CHUNK_S = 0.020


def _pcm24(path: Path, tail_s: float) -> list[str]:
    """The WAV as base64 PCM16 24 kHz pieces of 20 ms, with ``tail_s`` of trailing silence."""
    x = soxr.resample(load_audio(path), 16000, 24000).astype(np.float32)
    x = np.concatenate([x, np.zeros(int(24000 * tail_s), np.float32)])
    raw = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    step = int(24000 * CHUNK_S) * 2
    return [base64.b64encode(raw[i : i + step]).decode() for i in range(0, len(raw), step)]


async def _stream(ws, pieces: list[str]) -> None:
    t0 = time.monotonic()
    for i, p in enumerate(pieces):
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": p}))
        await asyncio.sleep(max(0.0, t0 + (i + 1) * CHUNK_S - time.monotonic()))


async def _client(url: str, question: list[str], interrupt: list[str], timeout: float) -> dict:
    out = {"first_audio_ms": None, "barge_in_stop_ms": None, "errors": 0}
    async with websockets.connect(url, max_size=None) as ws:
        sender = asyncio.create_task(_stream(ws, question))
        t_commit = t_speech = t_last_delta = None
        audio_s, responses, interrupted = 0.0, 0, False
        deadline = time.monotonic() + timeout
        while responses < 2 and time.monotonic() < deadline:
            try:
                e = json.loads(await asyncio.wait_for(ws.recv(), timeout=deadline - time.monotonic()))
            except TimeoutError:
                break
            now, kind = time.monotonic(), e["type"]
            if kind == "error":
                out["errors"] += 1
            elif kind == "input_audio_buffer.committed" and t_commit is None:
                t_commit = now
            elif kind == "input_audio_buffer.speech_started" and interrupted:
                t_speech = t_speech or now
            elif kind == "response.output_audio.delta":
                t_last_delta = now
                if out["first_audio_ms"] is None and t_commit is not None:
                    out["first_audio_ms"] = 1000 * (now - t_commit)
                audio_s += len(base64.b64decode(e["delta"])) / 48000
                if audio_s >= 0.5 and not interrupted:
                    interrupted = True
                    await sender
                    sender = asyncio.create_task(_stream(ws, interrupt))
            elif kind == "response.done":
                responses += 1
                status = e["response"]["status"]
                if responses == 1 and t_speech is not None and t_last_delta is not None:
                    out["barge_in_stop_ms"] = 1000 * (t_last_delta - t_speech)
                if status not in ("completed", "cancelled"):
                    out["errors"] += 1
        if responses < 2:
            out["errors"] += 1  # timed out
        sender.cancel()
    return out


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _serve(model: str | None) -> tuple[str, LocalServer]:
    """``omniduplex serve`` (stage processes) in a thread on a free loopback port; returns (url, server)."""
    from omniduplex.app.server import ServerConfig, create_app

    srv = LocalServer(create_app(ServerConfig(max_sessions=64, processes=True, model=model, max_tokens=32)))
    srv.start()
    return srv.url("/v1/realtime?model=omniduplex", "ws"), srv


def run(
    levels: list[int],
    question: Path,
    interrupt: Path,
    url: str | None = None,
    model: str | None = None,
    json_out: Path | None = None,
    timeout: float = 180.0,
) -> dict:
    """Run the sweep and print a markdown table; returns ``{c: metrics}``."""
    srv = None
    if url is None:
        url, srv = _serve(model)
    q, i = _pcm24(question, 1.2), _pcm24(interrupt, 1.2)
    results = {}
    try:
        asyncio.run(_client(url, q, i, timeout))  # warm-up
        for c in levels:
            rows = asyncio.run(_level(url, q, i, c, timeout))
            first = [r["first_audio_ms"] for r in rows if r["first_audio_ms"] is not None]
            stop = [r["barge_in_stop_ms"] for r in rows if r["barge_in_stop_ms"] is not None]
            results[c] = {
                "clients": c,
                "first_audio_p50_ms": _pct(first, 50),
                "first_audio_p90_ms": _pct(first, 90),
                "first_audio_p99_ms": _pct(first, 99),
                "barge_in_stop_p50_ms": _pct(stop, 50),
                "barge_in_stop_max_ms": max(stop) if stop else float("nan"),
                "errors": sum(r["errors"] for r in rows),
            }
    finally:
        if srv is not None:
            srv.stop()
    print(f"\nrealtime benchmark: {url}  question {question.name}, interrupt {interrupt.name}")
    print("| c | commit → first audio p50 ms | p90 | p99 | barge-in → last audio p50 ms | max | errors |")
    print("|---|---|---|---|---|---|---|")
    for c, m in results.items():
        print(
            f"| {c} | {m['first_audio_p50_ms']:.0f} | {m['first_audio_p90_ms']:.0f} | "
            f"{m['first_audio_p99_ms']:.0f} | "
            f"{m['barge_in_stop_p50_ms']:.0f} | {m['barge_in_stop_max_ms']:.0f} | {m['errors']} |"
        )
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    return results


async def _level(url: str, q: list[str], i: list[str], c: int, timeout: float) -> list[dict]:
    return await asyncio.gather(*(_client(url, q, i, timeout) for _ in range(c)))
