"""``bench serve-sweep``: both speech graphs through their stage processes, rows saved as they finish."""

from __future__ import annotations

import json
import math

import pytest

from omniduplex.benchmarks.serve_sweep import (
    ANCHORS,
    _codec_counts,
    _codec_ratios,
    audio_frames,
    sweep,
    targets_met,
)
from omniduplex.models.preset_cache import cached_checkpoint


def test_targets_are_read_at_their_concurrency():
    assert targets_met("qwen3-tts", {"c": 1, "ttfp_p50_ms": 59.0}) == {"ttfp_p50_ms": True}
    assert targets_met("qwen3-tts", {"c": 1, "ttfp_p50_ms": 61.0}) == {"ttfp_p50_ms": False}
    assert targets_met("qwen3-tts", {"c": 64, "audio_s_per_s": 100.0}) == {"audio_s_per_s": True}
    assert targets_met("qwen3-tts", {"c": 4, "ttfp_p50_ms": 1.0}) == {}
    both = targets_met("qwen3-omni", {"c": 32, "ttfp_p50_ms": 390.0, "rtf_p50": 0.35})
    assert both == {"ttfp_p50_ms": True, "rtf_p50": False}
    assert audio_frames(2.0) == 25
    assert {a["c"] for a in ANCHORS["qwen3-tts"]} == {1, 8, 16, 32, 64}


def test_code2wav_ratios_are_read_over_the_level():
    before = {"codec_steps": 10.0, "codec_forwards": 12.0, "codec_rows": 20.0}
    after = {"codec_steps": 14.0, "codec_forwards": 16.0, "codec_rows": 52.0}
    r = _codec_ratios(before, after)
    assert r == {"code2wav_rows_per_forward": 8.0, "code2wav_forwards_per_step": 1.0}
    assert all(math.isnan(v) for v in _codec_ratios(before, before).values())  # no forward in the level
    replicas = {"stages": {"code2wav@0": before, "code2wav@1": after, "talker": {"codec_rows": 5}}}
    assert _codec_counts(replicas) == {"codec_steps": 24.0, "codec_forwards": 28.0, "codec_rows": 72.0}


@pytest.mark.slow
def test_sweep_both_graphs_writes_every_row(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    results: dict = {}
    tts = sweep(
        "qwen3-tts",
        cached_checkpoint("qwen3-tts", "tiny"),
        [1, 2],
        talker_frames=3,
        json_out=out,
        results=results,
    )
    first = json.loads(out.read_text())
    assert [r["c"] for r in first["qwen3-tts"]["rows"]] == [1, 2]  # saved before the next graph ran
    omni = sweep(
        "qwen3-omni",
        cached_checkpoint("qwen3-omni", "tiny"),
        [2],
        max_tokens=3,
        talker_frames=3,
        json_out=out,
        results=results,
        replicas={"code2wav": 2, "tts_codec": 3},  # the Qwen3-TTS stage: not in this graph, ignored
    )
    saved = json.loads(out.read_text())
    assert (
        set(saved) == {"qwen3-tts", "qwen3-omni"} and saved["qwen3-omni"]["anchors"] == ANCHORS["qwen3-omni"]
    )
    for r in tts:
        assert r["requests"] == r["c"] and 0 < r["ttfp_p50_ms"] <= r["ttfp_p90_ms"]
        # every utterance is 3 frames: 0.24 s of audio; output tokens are those frames
        assert r["audio_s_per_s"] * r["wall_s"] == pytest.approx(r["c"] * 0.24, rel=1e-6)
        assert r["tok_s"] * r["wall_s"] == pytest.approx(r["c"] * 3, rel=1e-6)
        assert r["stage_busy_s"]["tts_talker.busy_s"] > 0 and r["stage_busy_s"]["tts_codec.busy_s"] > 0
        assert set(r["ttfp_split_p50_ms"]) >= {"talker_first_frame_ms", "codec_first_chunk_ms"}
    assert "ttfp_p50_ms" in tts[0]["targets_met"]  # c = 1 has a target
    (o,) = omni
    assert o["requests"] == 2 and math.isfinite(o["rtf_p50"]) and o["tok_s"] * o["wall_s"] == pytest.approx(6)
    assert {"thinker.busy_s", "talker.busy_s", "code2wav@0.busy_s"} <= set(o["stage_busy_s"])
    assert o["replicas"] == {"code2wav": 2} and tts[0]["replicas"] == {}
    assert o["code2wav_batch"] == 8 and o["code2wav_rows_per_forward"] >= 1  # the CPU YAML: 8 a forward
    assert {"talker_first_frame_ms", "codec_first_chunk_ms", "codec_wait_ms"} <= set(o["ttfp_split_p50_ms"])
    table = capsys.readouterr().out
    assert "| qwen3-tts | 2 |" in table and "| qwen3-omni code2wav=2 | 2 |" in table
    assert "| vLLM-Omni, H20 | 32 | 3772 |" in table


def test_sweep_refuses_a_checkpoint_of_another_graph():
    with pytest.raises(ValueError, match="serves the 'qwen3-tts' graph"):
        sweep("qwen3-omni", cached_checkpoint("qwen3-tts", "tiny"), [1])
    with pytest.raises(ValueError, match="unknown graph"):
        sweep("cascade", cached_checkpoint("qwen3-tts", "tiny"), [1])
