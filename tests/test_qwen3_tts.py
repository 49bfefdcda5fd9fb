"""Qwen3-TTS checkpoints, prompts and codec: presets, loading errors, bad requests, streaming schedule.

Parity with the reference implementation is in test_qwen3_tts_parity.py.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from omniduplex.cli.main import cli
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.models.qwen3_tts.codec import chunk_bounds, chunked_decode
from omniduplex.models.qwen3_tts.codec_stream import CodecStream, StreamingDecoder
from omniduplex.models.qwen3_tts.model import load_qwen3_tts
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.models.qwen3_tts.prompt import PromptError, build_prompt
from omniduplex.models.qwen3_tts.speaker_encoder import MIN_SAMPLES, speaker_mel

IDS = [257, 270, 10, 72, 105, 33, 258, 10, 257, 270, 10]  # <|im_start|>assistant\nHi!<|im_end|>\n...


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("q3tts")
    return {v: write_tts_checkpoint(root / v, "tiny", 0, v) for v in ("base", "custom_voice")}


@pytest.fixture(scope="module")
def custom(ckpts):
    return load_qwen3_tts(ckpts["custom_voice"])


def test_preset_is_deterministic_and_variants_share_weights(ckpts, tmp_path):
    again = write_tts_checkpoint(tmp_path / "again", "tiny", 0, "custom_voice")
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors", "config.json"):
        assert (again / rel).read_bytes() == (ckpts["custom_voice"] / rel).read_bytes(), rel
    base, cv = load_qwen3_tts(ckpts["base"]), load_qwen3_tts(ckpts["custom_voice"])
    assert base.speaker_encoder is not None and cv.speaker_encoder is None
    assert torch.equal(base.talker.codec_head.weight, cv.talker.codec_head.weight)
    other_seed = write_tts_checkpoint(tmp_path / "seed1", "tiny", 1, "custom_voice")
    assert (other_seed / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_init_model_cli(tmp_path):
    res = CliRunner().invoke(
        cli,
        [
            "init-model",
            "--arch",
            "qwen3-tts",
            "--preset",
            "tiny",
            "--variant",
            "base",
            "--out",
            str(tmp_path / "m"),
        ],
    )
    assert res.exit_code == 0, res.output
    info = json.loads(res.output.strip().splitlines()[-1])
    assert info["architecture"] == "Qwen3TTSForConditionalGeneration" and info["variant"] == "base"
    assert set(info["parameters"]) == {"talker", "speaker_encoder", "codec", "codec_encoder"}
    bad = CliRunner().invoke(
        cli, ["init-model", "--arch", "qwen3-tts", "--variant", "x", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code != 0 and "unknown variant" in bad.output
    assert not (tmp_path / "x").exists()


def test_config_errors_name_the_problem(ckpts, tmp_path):
    import shutil

    d = tmp_path / "broken"
    shutil.copytree(ckpts["custom_voice"], d)
    raw = json.loads((d / "config.json").read_text())
    del raw["talker_config"]["spk_id"]
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="spk_id"):
        load_qwen3_tts(d)
    shutil.copy(ckpts["custom_voice"] / "config.json", d / "config.json")
    codec = json.loads((d / "speech_tokenizer" / "config.json").read_text())
    del codec["decoder_config"]["codebook_dim"]
    (d / "speech_tokenizer" / "config.json").write_text(json.dumps(codec))
    with pytest.raises(CheckpointError, match="codebook_dim"):
        load_qwen3_tts(d)
    assert load_qwen3_tts(d, parts=("talker",)).talker is not None  # the talker alone still loads
    raw["talker_config"]["spk_id"] = {"aiden": 2861}
    raw["talker_config"]["hidden_size"] = 96  # contradicts the weights
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="shape"):
        load_qwen3_tts(d, parts=("talker",))


def test_bad_requests_raise_clear_errors(custom):
    t = custom.talker
    with pytest.raises(PromptError, match="unknown speaker 'nobody'"):
        build_prompt(t, IDS, speaker="nobody")
    with pytest.raises(PromptError, match="unknown language 'klingon'"):
        build_prompt(t, IDS, speaker="aiden", language="klingon")
    with pytest.raises(PromptError, match="needs a Base checkpoint"):
        build_prompt(t, IDS, xvector=torch.zeros(t.cfg.talker.hidden_size))
    with pytest.raises(PromptError, match="role"):
        build_prompt(t, IDS[:8], speaker="aiden")
    with pytest.raises(PromptError, match="text token id"):
        build_prompt(t, IDS[:3] + [10_000] + IDS[-5:], speaker="aiden")
    ok = build_prompt(t, IDS, speaker="aiden")  # the model still serves good requests
    # role, 3 tags (language auto) + speaker + codec pad, first text token + codec bos
    assert ok.prefill.shape == (3 + 5 + 1, t.cfg.talker.hidden_size)
    assert ok.trailing.shape[0] == 3  # two more text tokens + tts_eos


def test_dialect_speaker_uses_dialect_language(custom):
    t = custom.talker
    auto = build_prompt(t, IDS, speaker="eric").prefill
    sichuan = t.codec_embed(torch.tensor([t.cfg.languages["sichuan_dialect"]]))[0]
    # the language tag is the 3rd codec control token, added to tts_pad, after the 3 role tokens
    tts_pad = t.text_embed(torch.tensor([t.cfg.text_ids["tts_pad"]]))[0]
    torch.testing.assert_close(auto[3 + 2], sichuan + tts_pad)
    english = build_prompt(t, IDS, speaker="eric", language="english").prefill
    eng = t.codec_embed(torch.tensor([t.cfg.languages["english"]]))[0]
    torch.testing.assert_close(english[3 + 2], eng + tts_pad)


def test_reference_clip_checks():
    with pytest.raises(ValueError, match="needs >= 1024"):
        speaker_mel(torch.zeros(MIN_SAMPLES - 1))
    with pytest.raises(ValueError, match="mono"):
        speaker_mel(torch.zeros(2, 24000))
    assert speaker_mel(torch.zeros(24000)).shape == ((24000 + 768 - 1024) // 256 + 1, 128)


def test_codec_rejects_bad_codes(custom):
    dec = custom.codec
    codes = torch.zeros(1, 16, 3, dtype=torch.long)
    codes[0, 5, 2] = 2048
    with pytest.raises(ValueError, match="codebook 5 has id 2048 at frame 2"):
        dec(codes)
    with pytest.raises(ValueError, match=r"\[B, 16, frames\]"):
        dec(torch.zeros(1, 8, 3, dtype=torch.long))
    assert dec(torch.zeros(1, 16, 2, dtype=torch.long)).shape == (1, 1, 2 * 1920)


def test_chunk_schedule():
    assert chunk_bounds(60, 1, 25, 72) == [(0, 0, 1), (0, 1, 26), (0, 26, 51), (0, 51, 60)]
    assert chunk_bounds(120, 1, 25, 72)[-1] == (101 - 72, 101, 120)
    assert chunk_bounds(600, 300, 300, 25) == [(0, 0, 300), (275, 300, 600)]  # the reference's default
    with pytest.raises(ValueError):
        chunk_bounds(10, 0, 25, 72)


def _random_split(total: int, seed: int) -> list[int]:
    rng, split = random.Random(seed), []
    while sum(split) < total:
        split.append(min(rng.choice([0, 1, 1, 2, 3, 7, 25, 40]), total - sum(split)))
    return split


@pytest.mark.parametrize("seed", range(4))
def test_codec_stream_equals_one_shot_for_random_pushes(custom, seed):
    dec = custom.codec
    codes = torch.randint(0, 2048, (2, 16, 130), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        one_shot = dec(codes)
    assert float(one_shot.abs().max()) > 0.05  # a real signal, so the tolerance below means something
    stream, outs, f = CodecStream(dec, batch=2), [], 0
    for n in _random_split(130, seed):
        outs.append(stream.push(codes[..., f : f + n]))
        f += n
        assert outs[-1].shape == (2, 1, n * dec.total_upsample)  # causal: every frame's samples at once
        assert stream.frames == f
    torch.testing.assert_close(torch.cat(outs, dim=-1), one_shot, rtol=0, atol=1e-5)
    # past the sliding window (72 frames) the KV cache stays at 71 frames per layer
    assert all(k.shape[2] == 71 for k, _ in stream.transformer.kv)
    assert stream.flush().shape[-1] == 0
    with pytest.raises(ValueError, match="ended"):
        stream.push(codes[..., :1])


def test_streaming_decoder_schedule_and_two_streams_isolated(custom):
    dec = custom.codec
    hop = dec.total_upsample
    g = torch.Generator().manual_seed(7)
    a, b = (torch.randint(0, 2048, (1, 16, n), generator=g) for n in (61, 33))
    sa, sb = StreamingDecoder(dec), StreamingDecoder(dec, 2, 5)
    got_a, got_b = [], []
    for f in range(61):  # interleaved one frame at a time, as the engine emits them
        got_a += sa.push(a[..., f : f + 1])
        if f < 33:
            got_b += sb.push(b[..., f : f + 1])
        if f == 0:
            assert [p.shape[-1] for p in got_a] == [hop] and not got_b  # first piece after one frame
    got_a += sa.push(a[..., :0], final=True)
    got_b += sb.push(b[..., :0], final=True)
    assert [p.shape[-1] // hop for p in got_a] == [1, 25, 25, 10]
    assert [p.shape[-1] // hop for p in got_b] == [2] + [5] * 6 + [1]
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(got_a, dim=-1), dec(a), rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.cat(got_b, dim=-1), dec(b), rtol=0, atol=1e-5)
    # one push of many frames gives the same pieces as frame by frame
    sc = StreamingDecoder(dec)
    pieces = sc.push(a[..., :55]) + sc.push(a[..., 55:], final=True)
    assert [p.shape[-1] // hop for p in pieces] == [1, 25, 25, 10]
    torch.testing.assert_close(torch.cat(pieces, dim=-1), torch.cat(got_a, dim=-1), rtol=0, atol=1e-5)


def test_streaming_decoder_refuses_bad_frames_and_keeps_going(custom):
    dec = custom.codec
    codes = torch.randint(0, 2048, (1, 16, 4), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="chunk sizes"):
        StreamingDecoder(dec, 0, 25)
    s = StreamingDecoder(dec, 2, 25)
    bad = codes[..., :2].clone()
    bad[0, 3, 1] = 2048
    with pytest.raises(ValueError, match="codebook 3"):
        s.push(bad)
    with pytest.raises(ValueError, match=r"\[B, 16, frames\]"):
        s.push(codes[:, :8, :2])
    with pytest.raises(ValueError, match=r"\[1, Q, n\]"):
        s.push(codes.expand(2, -1, -1))
    pieces = s.push(codes[..., :3]) + s.push(codes[..., 3:], final=True)  # refused frames left no trace
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(pieces, dim=-1), dec(codes), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="ended"):
        s.push(codes[..., :1])


def test_chunked_decode_in_one_window_is_the_whole_decode(custom):
    dec = custom.codec
    codes = torch.randint(0, 2048, (1, 16, 31), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(chunked_decode(dec, codes, 300, 300, 25), dec(codes), rtol=0, atol=0)
