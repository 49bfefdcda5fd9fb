"""``omniduplex bench duplex``: the duplex frame engine (pipeline/duplex/) — sessions vs tick time, audio
underruns per session, and Full-Duplex-Bench-style measures on synthetic dialogs (:mod:`.duplex_dialogs`).

Tick curve: for each session count ``n`` an engine holds ``n`` sessions fed 80 ms frames; every tick is one
batched step. By default the attention reads the whole context window (``--full-context``: Moshi's 3000
frames, i.e. a conversation 4 minutes in, the steady-state cost) instead of the few frames a fresh session
has. Tick p50 / p99 are over ``ticks`` ticks after 3 warm-up ticks; real time means p99 <= 80 ms.

Underruns: the ticks are replayed on a paced clock (a tick starts every 80 ms or when the previous one ends,
whichever is later); each session's player starts one frame (80 ms jitter buffer) after its first frame
arrives and plays one frame per 80 ms; a frame that arrives after its play time is an underrun. All sessions
of a batch share the ticks, so the count is the same for each; reported per session. ``cpu p50 ms`` is the
process CPU time of a tick (with 1 thread, the wall time the tick would take on an idle core: on a shared
machine the wall times include waiting for a core); ``runq p50 ms`` is that wait, measured: the time this
process's threads were runnable but queued for a core (Linux schedstat), so wall ≈ cpu + runq. With more
than one thread on a busy machine, OpenMP's spin-waiting workers add CPU time that does no work (run
``OMP_WAIT_POLICY=PASSIVE`` there or one thread: the small preset's matmuls are too small to split).

Reference (printed beside, not measured here): vLLM-Omni runs PersonaPlex (Moshi architecture, 7B) at 30.2 ms
per 80 ms frame for one session on an H100 with CUDA graphs, 77.5 ms without (vllm-omni PR #6604).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from omniduplex.benchmarks.duplex_dialogs import FRAME_S, make_dialog, measures
from omniduplex.models.moshi.checkpoint import MoshiModels, load_moshi, random_models
from omniduplex.models.moshi.transformer import Attention
from omniduplex.pipeline.duplex.engine import FRAME_MS, DuplexEngine

VLLM_OMNI_1_SESSION_MS = 30.2
"""vLLM-Omni, PersonaPlex 7B, 1 session, H100, CUDA graphs (vllm-omni PR #6604)."""


def cpu_lm_dtype(cpuinfo: str | None = None) -> tuple[torch.dtype, str]:
    """The LM dtype for ``--dtype auto`` on a CPU, from the ``/proc/cpuinfo`` flags, and why: bf16 with AMX
    (``amx_bf16``: bf16 tile matmuls), else fp32. AVX512-BF16 alone is not enough: on such a CPU (no AMX) the
    small preset's tick measured no faster in bf16 (its matmuls have at most a few rows per session and its
    attention is memory-bound over the ring, where bf16 kernels are slower per byte), see MODELS.md."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    if "amx_bf16" in flags:
        return torch.bfloat16, "bf16 (the CPU has AMX-BF16)"
    if "avx512_bf16" in flags:
        return torch.float32, "fp32 (AVX512-BF16 without AMX: bf16 measured no faster)"
    return torch.float32, "fp32 (no bf16 matrix instructions)"


def _models(model: Path | None, preset: str, dtype: torch.dtype, device: str) -> MoshiModels:
    if model is not None:
        m = load_moshi(model, dtype)
    else:
        lm, mimi = random_models(preset, 0, device, dtype)
        m = MoshiModels(lm, mimi, {})
    m.lm.to(device)
    m.mimi.to(device)
    return m


def _engine(models: MoshiModels, n: int, full_context: bool, graph_mode: str) -> DuplexEngine:
    eng = DuplexEngine(models, capacity=n, graph_mode=graph_mode, budget_ms=FRAME_MS)
    if full_context:
        for m in (*models.lm.modules(), *models.mimi.modules()):
            if isinstance(m, Attention):
                m.fixed_window = True
    return eng


def underruns(tick_ms: list[float], jitter_frames: int = 1) -> int:
    """Frames played late on a paced 80 ms clock (see the module docstring); ``tick_ms``: each tick's time."""
    start = done = 0.0
    late, play0 = 0, None
    for i, ms in enumerate(tick_ms):
        start = max(i * FRAME_MS, done)
        done = start + ms
        if play0 is None:
            play0 = done + jitter_frames * FRAME_MS
        late += done > play0 + i * FRAME_MS
    return late


def sched_ns() -> tuple[int, int]:
    """``(on-CPU ns, run-queue wait ns)`` summed over this process's threads, from Linux
    ``/proc/self/task/*/schedstat`` (fields 1 and 2, Documentation/scheduler/sched-stats.rst); ``(0, 0)``
    where that file does not exist. The wait is the time a runnable thread waited for a core."""
    run = wait = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            fields = stat.read_text().split()
        except OSError:  # a thread ended between the listing and the read
            continue
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run, wait


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tick_curve(
    models: MoshiModels, sessions: list[int], ticks: int, full_context: bool, graph_mode: str, device: str
) -> list[dict]:
    """One row per session count: tick p50 / p99 / max (ms), real-time flag, underruns per session."""
    rows = []
    rng = np.random.default_rng(0)
    for n in sessions:
        eng = _engine(models, n, full_context, graph_mode)
        for i in range(n):
            eng.join(f"s{i}")
        times, cpu, waits = [], [], []
        for t in range(ticks + 3):
            for i in range(n):
                eng.push(f"s{i}", (0.1 * rng.standard_normal(1920)).astype(np.float32))
            _sync(device)
            t0, c0, w0 = time.perf_counter(), time.process_time(), sched_ns()[1]
            eng.tick()
            _sync(device)
            if t >= 3:
                times.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
                waits.append((sched_ns()[1] - w0) / 1e6)
        q = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else times * 99
        rows.append(
            {
                "sessions": n,
                "tick_p50_ms": statistics.median(times),
                "tick_p99_ms": q[98],
                "tick_max_ms": max(times),
                "real_time": q[98] <= FRAME_MS,
                "underruns_per_session": underruns(times),
                "tick_cpu_p50_ms": statistics.median(cpu),
                "runq_wait_p50_ms": statistics.median(waits),
                "ticks": len(times),
            }
        )
        print(
            f"{n:>8} {rows[-1]['tick_p50_ms']:>9.1f} {q[98]:>9.1f} {max(times):>9.1f} "
            f"{'yes' if q[98] <= FRAME_MS else 'no':>9} {rows[-1]['underruns_per_session']:>10} "
            f"{rows[-1]['tick_cpu_p50_ms']:>12.1f} {rows[-1]['runq_wait_p50_ms']:>12.1f}"
            + (f"   vLLM-Omni 1 session H100+graphs: {VLLM_OMNI_1_SESSION_MS} ms" if n == 1 else ""),
            flush=True,
        )
        del eng  # free its states and graphs before the next size allocates
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def dialogs(models: MoshiModels, n: int, seconds: float, graph_mode: str) -> list[dict]:
    """``n`` sessions each talking through its own synthetic dialog at once; per-session measures."""
    script = [make_dialog(100 + i, seconds) for i in range(n)]
    eng = _engine(models, n, False, graph_mode)
    for i in range(n):
        eng.join(f"d{i}")
    frames = len(script[0].user_active)
    rms = np.zeros((n, frames))
    for t in range(frames):
        for i in range(n):
            eng.push(f"d{i}", script[i].audio[t])
        for f in eng.tick():
            rms[int(f.session_id[1:]), t] = float(np.sqrt(np.mean(f.pcm**2)))
    return [measures(script[i].user_active, rms[i]) for i in range(n)]


def run(
    model: Path | None,
    preset: str,
    sessions: list[int],
    ticks: int,
    threads: int,
    full_context: bool,
    graph_mode: str,
    dialog_sessions: int,
    dialog_seconds: float,
    device: str,
    dtype: str,
    json_out: Path | None,
) -> dict:
    """Print the tick curve and the dialog measures; returns (and optionally writes) them as JSON."""
    torch.set_num_threads(threads)
    if dtype == "auto":
        torch_dtype, why = (torch.bfloat16, "bf16 (GPU)") if device.startswith("cuda") else cpu_lm_dtype()
    else:
        torch_dtype, why = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype], dtype
    models = _models(model, preset, torch_dtype, device)
    label = str(model) if model else f"random {preset} preset"
    print(
        f"duplex engine: {label}, {device}, {threads} threads, graphs {graph_mode}, "
        f"context {'full window' if full_context else 'as filled'}, LM {why}; "
        f"budget {FRAME_MS:.0f} ms per tick"
    )
    print(
        f"{'sessions':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'real time':>9} {'underruns':>10} "
        f"{'cpu p50 ms':>12} {'runq p50 ms':>12}"
    )
    with torch.no_grad():
        curve = tick_curve(models, sessions, ticks, full_context, graph_mode, device)
        per = dialogs(models, dialog_sessions, dialog_seconds, graph_mode) if dialog_sessions else []
    out = {
        "model": label,
        "device": device,
        "threads": threads,
        "graph_mode": graph_mode,
        "lm_dtype": str(torch_dtype).removeprefix("torch."),
        "curve": curve,
        "vllm_omni_1_session_ms": VLLM_OMNI_1_SESSION_MS,
        "dialogs": per,
    }
    if per:
        print(
            f"synthetic dialogs: {dialog_sessions} sessions x {dialog_seconds:.0f} s at once. "
            + (
                "RANDOM WEIGHTS: these values are meaningless (the model never learnt to listen or to "
                "take turns); the measures are for a trained checkpoint (--model), and what this run "
                "checks is the code path"
                if model is None
                else f"checkpoint {model}"
            )
        )
        for key in (
            "turn_over_rate",
            "response_latency_ms",
            "stop_when_interrupted_rate",
            "stop_latency_ms",
            "backchannels_per_min",
        ):
            vals = [d[key] for d in per if d[key] is not None]
            shown = f"{statistics.mean(vals):.2f}" if vals else "n/a"
            print(f"  {key:<28} {shown}")
        print(
            f"  user turns {sum(d['user_turns'] for d in per)}, "
            f"barge-ins {sum(d['barge_ins'] for d in per)}, "
            f"frame {FRAME_S * 1000:.0f} ms"
        )
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1))
    return out
