"""``omniduplex bench tts-stream``: how soon ``WS /v1/audio/speech/stream`` speaks a clause once its text is
in.

The app (``create_app``, the real routes and edge gate) runs on uvicorn on a loopback port with the speech
service under test: the packaged Piper voice, or a Qwen3-TTS checkpoint (greedy, at most ``frames`` codec
frames a clause: random-weight presets never stop on their own). A ``websockets`` client streams
:data:`CLAUSES` word by word, as an LLM would write them (``word_ms`` apart), each clause ending with its mark
and a space, so its last word's message completes it. After a clause's last message it waits for that
clause's first audio frame and then for ``clause.done`` before writing the next clause, so each figure is one
clause's latency with nothing queued before it.

Printed per round and clause: first audio = the clause's last text message sent → its first audio frame
received (ms; the figure the endpoint exists for), the clause's audio seconds and synthesis time; then
p50/mean/max of first audio over every clause after the first round (round 1 warms the service up).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import websockets

from omniduplex.app.server import ServerConfig, create_app
from omniduplex.benchmarks.local_server import LocalServer

CLAUSES = (
    "Boil some water in a kettle, ",
    "then pour it slowly over the tea leaves. ",
    "Wait for three or four minutes, ",
    "and take the leaves out before you drink it. ",
)
"""A reply as the client's LLM writes it: four clauses the cascade's splitter cuts where the commas and stops
are (the first has at most six words, the others at least three)."""


class NoConversation:
    """The app's responder while only the speech routes are measured: no conversation turn ever starts."""

    output_rate = 24000

    def start(self, turn_id, waveform, history, options=None):
        raise RuntimeError("bench tts-stream serves speech only")

    async def events(self, turn_id):
        return
        yield

    def cancel(self, turn_id):
        pass


def speech_service(model: Path | None, frames: int):
    """The packaged Piper voice (``model`` None) or a Qwen3-TTS checkpoint, and its first voice (or None)."""
    if model is None:
        from omniduplex.app.host.speech.piper import packaged_piper

        return packaged_piper(), None
    from omniduplex.app.host.speech.qwen3 import Qwen3Speech

    svc = Qwen3Speech(model, max_num_seqs=4, max_frames=frames, sampling={"temperature": 0.0})
    return svc, (svc.voices[0] if svc.voices else None)


async def _round(url: str, voice: str | None, word_ms: float) -> list[dict]:
    rows = []
    async with websockets.connect(url, open_timeout=300, max_size=None) as ws:
        created = json.loads(await ws.recv())
        rate = created["sample_rate"]
        await ws.send(json.dumps({"type": "session.update", "voice": voice}))
        for clause in CLAUSES:
            words = clause.split(" ")[:-1]
            for i, w in enumerate(words):
                await ws.send(json.dumps({"type": "text", "text": w + " "}))
                if i < len(words) - 1:
                    await asyncio.sleep(word_ms / 1000)
            t0, first = time.perf_counter(), None
            while True:
                msg = await asyncio.wait_for(ws.recv(), 600)
                if isinstance(msg, bytes):
                    first = first or time.perf_counter()
                    continue
                ev = json.loads(msg)
                if ev["type"] == "error":
                    raise RuntimeError(f"the server refused the clause: {ev['error']['message']}")
                if ev["type"] == "clause.done":
                    done = time.perf_counter()
                    break
            rows.append(
                {
                    "clause": clause.strip(),
                    "first_audio_ms": 1000 * (first - t0) if first else None,
                    "audio_s": ev["samples"] / rate,
                    "synth_s": done - t0,
                }
            )
        await ws.send(json.dumps({"type": "end"}))
        while json.loads(await ws.recv())["type"] != "done":
            pass
    return rows


def run(model: Path | None, rounds: int, word_ms: float, frames: int, json_out: Path | None) -> dict:
    """Run ``rounds`` rounds of :data:`CLAUSES`, print the table (module docstring), return the results."""
    svc, voice = speech_service(model, frames)
    app = create_app(ServerConfig(), responder=NoConversation())
    app.state.server.speech = svc
    name = "piper (packaged en_US joe)" if model is None else f"qwen3-tts {model}"
    print(f"WS /v1/audio/speech/stream, {name}; words {word_ms:g} ms apart")
    print(f"{'round':>5} {'first audio ms':>14} {'audio s':>8} {'synth s':>8}  clause")
    results = []
    try:
        with LocalServer(app) as srv:
            for r in range(rounds):
                for row in asyncio.run(_round(srv.url("/v1/audio/speech/stream", "ws"), voice, word_ms)):
                    results.append({"round": r + 1, **row})
                    ms = row["first_audio_ms"]
                    print(
                        f"{r + 1:>5} {ms if ms is None else round(ms, 1)!s:>14} {row['audio_s']:>8.2f} "
                        f"{row['synth_s']:>8.2f}  {row['clause']}"
                    )
    finally:
        if model is not None:
            svc.close()
    warm = [x["first_audio_ms"] for x in results if x["round"] > 1 or rounds == 1]
    warm = [x for x in warm if x is not None]
    summary = {"service": name, "word_ms": word_ms, "clauses": results}
    if warm:
        summary.update(p50_ms=statistics.median(warm), mean_ms=statistics.fmean(warm), max_ms=max(warm))
        print(
            f"last text message -> first audio (warm, n={len(warm)}): p50 {summary['p50_ms']:.1f} ms, "
            f"mean {summary['mean_ms']:.1f} ms, max {summary['max_ms']:.1f} ms"
        )
    if json_out:
        json_out.write_text(json.dumps(summary, indent=2))
    return summary
