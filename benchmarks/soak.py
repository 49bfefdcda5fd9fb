"""``omniduplex bench soak``: many turns over WebRTC and the Realtime API while faults are injected; reports
leaks, memory growth and failures.

A server (stage processes) runs in this process on a loopback port. ``sessions`` clients, half WebRTC
(aiortc, :mod:`.webrtc_client`) and half Realtime API (WebSocket), each run turns back to back: the client
speaks a question (real time), then, at random, lets the reply play out, barges in over it, or vanishes
mid-reply (drops off without a goodbye; a fresh client takes its place). Every ``kill_every`` turns one
stage process is SIGKILLed (round robin); the backend fails the turns in flight on it and restarts it.

Report: turns completed / failed (and how many failures fall inside a kill window: the turns in flight
when a stage died; each failure with its reason); leaks once the clients are gone, the pipeline is idle
and every stage is up again (a stage killed near the end has restarted and made its relay segments): KV
blocks in use, relay slots in use, ``/dev/shm`` segments of this server's processes (and of the stages it
killed) beyond the baseline, asyncio tasks beyond the baseline, file descriptors beyond the baseline
(server process and stage processes); RSS growth of every process after the warm-up; TTFP p99
(commit → first reply audio, from the session events).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import soxr

from omniduplex.benchmarks.local_server import LocalServer
from omniduplex.benchmarks.realtime import _pcm24, _stream
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.relay.shm_pool import list_segments

KILL_WINDOW_S = 15.0
"""Failures within this long after a SIGKILL count as the kill's (turns in flight on the dead stage)."""


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _pids(state) -> dict[str, int]:
    """``name → pid`` of the server process and each stage process, now."""
    return {"server": os.getpid(), **{s: p.pid for s, p in state.orchestrator.backend.procs.items()}}


def _rss_by_process(state) -> dict[str, tuple[int, int]]:
    """``name → (pid, RSS kB)`` of the server process and each stage process, now."""
    return {k: (pid, _rss_kb(pid)) for k, pid in _pids(state).items()}


def _rss_growth(samples: list[dict[str, tuple[int, int]]]) -> dict[str, float | None]:
    """RSS growth (%) of each process over the second half of the run: from the sample at the middle to the
    last one. ``None`` for a stage restarted in between (a fresh process is no comparison)."""
    if len(samples) < 2:
        return {}
    mid, last = samples[len(samples) // 2], samples[-1]
    out: dict[str, float | None] = {}
    for name, (pid, rss) in last.items():
        pid0, rss0 = mid.get(name, (None, 0))
        out[name] = 100.0 * (rss - rss0) / rss0 if pid0 == pid and rss0 else None
    return out


def _snapshot(state, loop, killed: frozenset[int] = frozenset()) -> dict:
    """Resources of the server process and its stage processes, now. ``shm`` counts the relay segments owned
    by this server, its stage processes and the stage processes killed so far (other runs on the machine
    have theirs too)."""
    backend = state.orchestrator.backend
    pids = _pids(state)
    ours = set(pids.values()) | killed
    tasks = asyncio.run_coroutine_threadsafe(_count_tasks(), loop).result(timeout=5)
    st = backend.stats()
    kv_used = sum(int(v.get("kv_blocks_used", 0)) for v in st["stages"].values())
    relay_used = {k: e.get("slots_in_use", 0) + e.get("inline_in_use", 0) for k, e in st["edges"].items()}
    return {
        "rss_kb": {k: _rss_kb(p) for k, p in pids.items()},
        "fds": {k: _fds(p) for k, p in pids.items()},
        "shm": sum(len(list_segments(pid)) for pid in ours),
        "tasks": tasks,
        "kv_blocks_used": kv_used,
        "relay_slots_in_use": relay_used,
        "inflight": len(getattr(backend, "inflight", ())),
    }


async def _count_tasks() -> int:
    return len(asyncio.all_tasks()) - 1


class _Soak:
    def __init__(self, url: str, state, turns: int, sessions: int, kill_every: int, seed: int) -> None:
        self.url, self.state, self.target, self.sessions = url, state, turns, sessions
        self.kill_every, self.rng = kill_every, random.Random(seed)
        self.done = self.failed = self.failed_in_kill = self.started = 0
        self.kills: list[float] = []
        self.killed_pids: set[int] = set()
        self.failures: list[dict] = []  # {"in_kill_window", "reason"} of each failed turn
        self.rss_samples: list[dict[str, tuple[int, int]]] = []  # each tenth of the run: name → (pid, kB)
        self.ttfp: list[float] = []
        root = Path(__file__).resolve().parents[1]
        q = load_audio(root / "examples" / "green_tea.wav")
        self.q48 = np.concatenate([soxr.resample(q, 16000, 48000), np.zeros(48000, np.float32)]).astype(
            np.float32
        )
        self.q24 = _pcm24(root / "examples" / "green_tea.wav", 1.2)
        self.barge24 = _pcm24(root / "benchmarks" / "speech" / "turn1.wav", 1.2)
        self.stages = sorted(state.orchestrator.backend.procs)

    def _record(self, ok: bool, ttfp_ms: float | None = None, reason: str = "") -> None:
        if ok:
            self.done += 1
            if ttfp_ms is not None:
                self.ttfp.append(ttfp_ms)
        else:
            self.failed += 1
            in_kill = bool(self.kills) and time.monotonic() - self.kills[-1] < KILL_WINDOW_S
            self.failed_in_kill += in_kill
            self.failures.append({"in_kill_window": in_kill, "reason": reason[:200] or "unknown"})
        n = self.done + self.failed
        if n % max(1, self.target // 10) == 0:
            self.rss_samples.append(_rss_by_process(self.state))
        if self.kill_every and n and n % self.kill_every == 0 and len(self.kills) < n // self.kill_every:
            stage = self.stages[len(self.kills) % len(self.stages)]
            self.kills.append(time.monotonic())
            pid = self.state.orchestrator.backend.procs[stage].pid
            self.killed_pids.add(pid)
            os.kill(pid, signal.SIGKILL)

    def _more(self) -> bool:
        if self.started >= self.target:
            return False
        self.started += 1
        return True

    async def realtime_client(self) -> None:
        import websockets

        while self._more():
            action = self.rng.choice(["play", "play", "barge", "vanish"])
            try:
                async with websockets.connect(self.url, max_size=None) as ws:
                    ok, ttfp, reason = await asyncio.wait_for(self._realtime_turn(ws, action), 120)
            except Exception as e:
                ok, ttfp, reason = False, None, f"realtime {action}: {type(e).__name__}: {e}"
            self._record(ok, ttfp, reason)

    async def _realtime_turn(self, ws, action: str) -> tuple[bool, float | None, str]:
        sender = asyncio.create_task(_stream(ws, self.q24))
        t_commit = ttfp = None
        audio_s = 0.0
        try:
            while True:
                e = json.loads(await ws.recv())
                kind = e["type"]
                if kind == "input_audio_buffer.committed":
                    t_commit = time.monotonic()
                elif kind == "response.output_audio.delta":
                    if ttfp is None and t_commit is not None:
                        ttfp = 1000 * (time.monotonic() - t_commit)
                    audio_s += len(e["delta"]) * 3 / 4 / 48000
                    if audio_s > 0.6 and action == "vanish":
                        return True, ttfp, ""  # the client drops off mid-reply (the socket closes)
                    if audio_s > 0.6 and action == "barge" and sender.done():
                        action = "barged"
                        sender = asyncio.create_task(_stream(ws, self.barge24))
                elif kind == "response.done":
                    status = e["response"]["status"]
                    detail = e["response"].get("status_details")
                    return status in ("completed", "cancelled"), ttfp, f"realtime {action}: {status} {detail}"
                elif kind == "error":
                    return False, ttfp, f"realtime {action}: error {e['error'].get('message')}"
        finally:
            sender.cancel()

    async def webrtc_client(self) -> None:
        import httpx

        from omniduplex.benchmarks.webrtc_client import VoiceClient

        base = self.url.replace("ws://", "http://").split("/v1/")[0]
        while self._more():
            action = self.rng.choice(["play", "play", "vanish"])
            c = VoiceClient(self.q48)
            ok, ttfp, reason = False, None, ""
            try:
                async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                    answer = (await http.post("/offer", json=await c.offer())).json()
                    await c.accept(answer)
                    started = await c.wait_for("reply_audio_started", 120, "reply_ended")
                    if started["type"] == "reply_ended":  # a reply with no audio at all
                        heard = [e.get("text") for e in c.events if e["type"] == "user_transcript"]
                        raise RuntimeError(
                            f"reply ended {started.get('reason')!r} before any audio; heard {heard}, "
                            f"reply text {started.get('text')!r}, error {started.get('error')!r}"
                        )
                    ttfp = started.get("commit_to_audio_ms")
                    if action == "vanish":
                        c.mic.vanish()
                        ok = True
                    else:
                        ended = await c.wait_for("reply_ended", 120)
                        ok = ended.get("reason") in ("completed", "interrupted")
                        reason = f"webrtc {action}: reply ended {ended.get('reason')!r}"
                        await http.delete(f"/sessions/{c.session_id}")
            except Exception as e:
                ok, reason = False, f"webrtc {action}: {type(e).__name__}: {e}"
            finally:
                await c.close()
            self._record(ok, ttfp, reason)


def _serve(model: str | None) -> LocalServer:
    from omniduplex.app.server import ServerConfig, create_app

    app = create_app(
        ServerConfig(max_sessions=64, processes=True, model=model, max_tokens=24, media_timeout_s=2.0)
    )
    return LocalServer(app).start()


def _wait_idle(state, killed: frozenset[int] = frozenset(), timeout: float = 300.0) -> bool:
    """Wait until no session is open, no turn is in flight, no stage process is one of the ``killed`` pids and
    every stage is up. The last kill comes with the last turn: until the backend notices the death (it checks
    about once a second) it still counts the dead stage as up, and the restarted stage's relay segments, KV
    blocks and descriptors exist only once it has loaded its weights and reported ready. Returns whether
    that happened within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replaced = not set(_pids(state).values()) & killed
        idle = not state.sessions and not state.orchestrator.turns
        if replaced and idle and state.orchestrator.backend.ready:
            return True
        time.sleep(0.2)
    return False


def run(
    turns: int, sessions: int, kill_every: int, model: str | None, seed: int, json_out: Path | None
) -> dict:
    """Run the soak and print its report; returns it."""
    srv = _serve(model)
    url, state, loop = srv.url("/v1/realtime", "ws"), srv.state, srv.loop
    try:
        warm = min(turns, max(2 * sessions, turns // 10))
        soak = _Soak(url, state, warm, sessions, 0, seed)  # warm-up, no kills
        asyncio.run(_run_clients(soak, sessions))
        _wait_idle(state)
        base = _snapshot(state, loop)
        soak = _Soak(url, state, turns, sessions, kill_every, seed)
        t0 = time.monotonic()
        asyncio.run(_run_clients(soak, sessions))
        wall = time.monotonic() - t0
        settled = _wait_idle(state, frozenset(soak.killed_pids))
        time.sleep(2.0)  # the closed sessions' tasks and sockets wind down
        end = _snapshot(state, loop, frozenset(soak.killed_pids))
    finally:
        srv.stop()
    samples = soak.rss_samples
    server_growth = 100.0 * (end["rss_kb"]["server"] - base["rss_kb"]["server"]) / base["rss_kb"]["server"]
    report = {
        "turns": soak.done + soak.failed,
        "completed": soak.done,
        "failed": soak.failed,
        "failed_outside_kill_windows": soak.failed - soak.failed_in_kill,
        "failures": soak.failures,
        "stage_kills": len(soak.kills),
        "idle_and_ready_at_end": settled,
        "wall_s": wall,
        "ttfp_p99_ms": float(np.percentile(soak.ttfp, 99)) if soak.ttfp else float("nan"),
        "leaks": {
            "kv_blocks": end["kv_blocks_used"],
            "relay_slots": sum(end["relay_slots_in_use"].values()),
            "relay_slots_by_edge": {k: v for k, v in end["relay_slots_in_use"].items() if v},
            "shm_segments": end["shm"] - base["shm"],
            "asyncio_tasks": end["tasks"] - base["tasks"],
            "fds": {k: end["fds"].get(k, 0) - v for k, v in base["fds"].items()},
            "turns_in_flight": end["inflight"],
        },
        "warm_up_turns": warm,
        "rss_growth_pct": {"server_after_warm_up": server_growth, "second_half": _rss_growth(samples)},
        "rss_mb": {k: rss // 1024 for k, (_, rss) in samples[-1].items()} if samples else {},
        "server_rss_mb_each_tenth": [s["server"][1] // 1024 for s in samples],
    }
    print(json.dumps(report, indent=2))
    if json_out:
        json_out.write_text(json.dumps(report, indent=2))
    return report


async def _run_clients(soak: _Soak, sessions: int) -> None:
    n_rt = (sessions + 1) // 2
    await asyncio.gather(
        *(soak.realtime_client() for _ in range(n_rt)),
        *(soak.webrtc_client() for _ in range(sessions - n_rt)),
    )
