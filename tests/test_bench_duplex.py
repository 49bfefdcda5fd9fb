"""``bench duplex``'s measures: the paced-clock underrun count, the Full-Duplex-Bench-style dialog measures on
hand-built activity sequences, the synthetic dialogs, and one short run of the command on the tiny preset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from omniduplex.benchmarks.duplex import cpu_lm_dtype, underruns
from omniduplex.benchmarks.duplex_dialogs import SPEAKING_RMS, make_dialog, measures
from omniduplex.cli.bench import bench


def test_underruns_on_a_paced_clock():
    assert underruns([20.0] * 10) == 0  # well inside the 80 ms budget
    assert underruns([150.0] * 6) == 4  # every tick late: the 80 ms jitter buffer absorbs the first
    # a 170 ms spike: that frame and the next are late (arrive at 330 and 350 ms, due at 260 and 340), then
    # the clock has caught up
    assert underruns([20, 20, 170, 20, 20]) == 2


def _frames(pattern: str) -> np.ndarray:
    return np.array([c == "#" for c in pattern])


def test_dialog_measures_on_hand_built_activity():
    user = _frames("..#####.........#####..........")
    model = _frames("..........###............####..")  # answers 3 and 4 frames after the turns end
    m = measures(user, np.where(model, 2 * SPEAKING_RMS, 0.0))
    assert m["user_turns"] == 2 and m["barge_ins"] == 0
    assert m["turn_over_rate"] == 1.0
    assert m["response_latency_ms"] == (3 * 80 + 4 * 80) / 2
    user = _frames("....######......")
    model = _frames("..####..........")  # speaking when the user barges in, then it stops
    m = measures(user, np.where(model, 1.0, 0.0))
    assert m["barge_ins"] == 1 and m["stop_when_interrupted_rate"] == 1.0
    user = _frames("..##############......")
    model = _frames("......##..............")  # a short burst inside the user's turn
    assert measures(user, np.where(model, 1.0, 0.0))["backchannels_per_min"] > 0


def test_dialog_measures_edge_timelines():
    # the model talks over the whole barge-in (one quiet frame is not a stop): not stopped
    user = _frames("......########.........")
    model = _frames("..##########.#########.")
    m = measures(user, np.where(model, 1.0, 0.0))
    assert m["barge_ins"] == 1 and m["stop_when_interrupted_rate"] == 0.0 and m["stop_latency_ms"] is None
    # stops 2 frames into a barge-in and stays quiet: stopped, 160 ms
    model = _frames("..######...............")
    m = measures(user, np.where(model, 1.0, 0.0))
    assert m["stop_when_interrupted_rate"] == 1.0 and m["stop_latency_ms"] == 160.0
    # never answers: no turn taken, no latency to average, no barge-in
    m = measures(_frames("..####......####......"), np.zeros(22))
    assert m["turn_over_rate"] == 0.0 and m["response_latency_ms"] is None
    assert m["barge_ins"] == 0 and m["stop_when_interrupted_rate"] is None
    # answers only after the 1.5 s take-turn window (20 frames later): not a turn-over
    user, model = _frames("####" + "." * 30), _frames("." * 24 + "#" * 10)
    assert measures(user, np.where(model, 1.0, 0.0))["turn_over_rate"] == 0.0
    # exactly one backchannel in 25 frames (2 s) of user speech: 30 per minute; a burst that began before
    # the user's turn is a barge-in context, not a backchannel
    user = _frames("..." + "#" * 25 + "....")
    model = _frames("........##......................")
    assert measures(user, np.where(model, 1.0, 0.0))["backchannels_per_min"] == pytest.approx(30.0)
    model = _frames(".######.........................")
    assert measures(user, np.where(model, 1.0, 0.0))["backchannels_per_min"] == 0.0
    with pytest.raises(ValueError, match="1-D frame arrays"):
        measures(_frames("###"), np.zeros(4))


def test_cpu_lm_dtype_follows_the_cpu_flags():
    assert cpu_lm_dtype("flags : fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16")[0] == torch.bfloat16
    assert cpu_lm_dtype("flags : fpu avx2 avx512f avx512_bf16")[0] == torch.float32
    assert cpu_lm_dtype("flags : fpu avx2")[0] == torch.float32


def test_synthetic_dialog_has_turns_and_pauses():
    d = make_dialog(1, 20.0)
    assert d.audio.shape == (250, 1920) and 0.2 < d.user_active.mean() < 0.8
    assert np.abs(d.audio[d.user_active]).max() > 0.1 and not d.audio[~d.user_active].any()


def test_bench_duplex_command_runs_on_tiny(tmp_path):
    out = tmp_path / "duplex.json"
    args = [
        "duplex",
        "--preset",
        "tiny",
        "--sessions",
        "1,2",
        "--ticks",
        "3",
        "--threads",
        "1",
        "--dialog-sessions",
        "2",
        "--dialog-seconds",
        "4",
        "--json",
        str(out),
    ]
    res = CliRunner().invoke(bench, args)
    assert res.exit_code == 0, res.output
    assert "30.2 ms" in res.output and "turn_over_rate" in res.output
    data = json.loads(out.read_text())
    assert [r["sessions"] for r in data["curve"]] == [1, 2] and all(r["ticks"] == 3 for r in data["curve"])
    assert len(data["dialogs"]) == 2
    assert data["lm_dtype"] == str(cpu_lm_dtype()[0]).removeprefix("torch.")  # --dtype auto by the CPU
