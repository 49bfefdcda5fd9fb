"""Qwen3-TTS parity against golden outputs of the reference (qwen-tts 0.1.1, transformers 4.57.3).

The goldens (tests/golden/qwen3_tts/{tiny,heldout}.npz) come from scripts/qwen3_tts_goldens.sh, which writes
the same preset checkpoints with our code and runs the reference on them in its own venv; see
scripts/qwen3_tts_reference.py for what each array holds. Here our modules run on freshly written
checkpoints (byte-identical to the ones the goldens were made from) and must give:

- greedy frames identical to the reference for every variant and prompt mode (fp32);
- the Base x-vector of the reference clip to fp32 rounding, and the speech tokenizer's codes of a clip;
- the codec waveform within 1 LSB (int16) of the reference decoder's, whole and windowed (``chunked_decode``
  with vLLM-Omni's schedule: 1-frame first chunk, 25-frame chunks, 72 frames of left context);
- our stateful stream, pushed one frame at a time, within 1 LSB of the reference's whole decode.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omniduplex.models.qwen3_tts.codec import chunked_decode
from omniduplex.models.qwen3_tts.codec_stream import StreamingDecoder
from omniduplex.models.qwen3_tts.generate import generate_codes
from omniduplex.models.qwen3_tts.model import load_qwen3_tts
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
from omniduplex.models.qwen3_tts.prompt import build_prompt

GOLDEN = Path(__file__).parent / "golden" / "qwen3_tts"
SETS = ("tiny", "heldout")
VARIANTS = ("base", "custom_voice", "voice_design")
N_CASES = 9
SUB_STRIDE, SUB_OFFSET, HOP = 16, 7, 1920


def clip(seconds: float = 0.5, sr: int = 24000) -> torch.Tensor:
    """The reference clip of scripts/qwen3_tts_reference.py (chirp + tone, computed in fp64)."""
    t = np.arange(int(seconds * sr), dtype=np.float64) / sr
    wav = 0.3 * np.sin(2 * np.pi * (200 * t + 400 * t * t)) + 0.1 * np.sin(2 * np.pi * 1234 * t)
    return torch.from_numpy(wav.astype(np.float32))


def pcm16(w: torch.Tensor) -> np.ndarray:
    return np.round(w.double().numpy().reshape(-1) * 32767).astype(np.int16)


@pytest.fixture(scope="module", params=SETS)
def loaded(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(f"q3tts_{name}")
    models = {}
    for v in VARIANTS:
        write_tts_checkpoint(root / v, name, 0, v)
        models[v] = load_qwen3_tts(
            root / v,
            parts=("talker", "speaker_encoder", "codec") if v == "base" else ("talker",),
        )
    golden = dict(np.load(GOLDEN / f"{name}.npz"))
    return name, models, golden


def test_xvector_matches_reference(loaded):
    _, models, golden = loaded
    ours = models["base"].speaker_encoder.embed(clip())
    ref = torch.from_numpy(golden["xvector"])
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case_idx", range(N_CASES))
def test_greedy_codes_match_reference(loaded, case_idx):
    _, models, golden = loaded
    case = json.loads(str(golden["cases"]))[case_idx]
    m = models[case["variant"]]
    xvec = m.speaker_encoder.embed(clip()) if case.get("xvector") else None
    prompt = build_prompt(
        m.talker,
        case["ids"],
        language=case["language"],
        speaker=case["speaker"],
        instruct_ids=case["instruct"],
        xvector=xvec,
        ref_ids=case.get("ref_ids"),
        ref_codes=torch.tensor(case["ref_codes"]) if "ref_codes" in case else None,
        non_streaming=case["non_streaming"],
    )
    codes = generate_codes(m.talker, prompt, max_new_tokens=int(golden["max_new_tokens"]))
    ref = torch.from_numpy(golden[f"codes_{case_idx}"].astype(np.int64))
    assert codes.shape == ref.shape, (codes.shape, ref.shape)
    mismatch = (codes != ref).nonzero()
    assert mismatch.numel() == 0, f"first mismatch at frame/codebook {mismatch[0].tolist()}"


def test_codec_encoder_matches_reference(tmp_path):
    """Tiny preset only: the heldout golden predates the encoder (re-create it with the goldens script)."""
    golden = dict(np.load(GOLDEN / "tiny.npz"))
    path = write_tts_checkpoint(tmp_path / "base", "tiny", 0, "base")
    enc = load_qwen3_tts(path, parts=("codec_encoder",)).codec_encoder
    codes = enc.encode(clip(1.3))  # 31200 samples: 16.25 frames
    ref = torch.from_numpy(golden["encoder_codes"].astype(np.int64))
    assert codes.shape == ref.shape == (17, 16)
    assert torch.equal(codes, ref)


def _check_pcm(ours: torch.Tensor, golden: dict, key: str) -> None:
    p = pcm16(ours)
    frames = golden["codec_codes"].shape[1]
    assert p.shape[0] == frames * HOP
    sub = p[SUB_OFFSET::SUB_STRIDE].astype(np.int64)
    diff = np.abs(sub - golden[f"{key}_sub"].astype(np.int64))
    assert diff.max() <= 1, (
        f"{key}: max |diff| {diff.max()} LSB at sample {SUB_OFFSET + SUB_STRIDE * diff.argmax()}"
    )
    sums = p.astype(np.int64).reshape(frames, HOP).sum(1)
    assert np.abs(sums - golden[f"{key}_frame_sum"]).max() <= HOP


def test_codec_decode_matches_reference(loaded):
    _, models, golden = loaded
    codes = torch.from_numpy(golden["codec_codes"].astype(np.int64))[None]
    with torch.no_grad():
        _check_pcm(models["base"].codec(codes), golden, "full")


def test_windowed_decode_matches_reference_chunking(loaded):
    _, models, golden = loaded
    codes = torch.from_numpy(golden["codec_codes"].astype(np.int64))[None]
    with torch.no_grad():
        _check_pcm(chunked_decode(models["base"].codec, codes), golden, "stream")
    # the windows matter: the reference's windowed and whole decodes differ by more than 1 LSB
    assert np.abs(golden["stream_sub"].astype(int) - golden["full_sub"].astype(int)).max() > 1


def test_stateful_stream_matches_reference_whole_decode(loaded):
    _, models, golden = loaded
    dec = models["base"].codec
    codes = torch.from_numpy(golden["codec_codes"].astype(np.int64))[None]
    stream = StreamingDecoder(dec)
    pieces = []
    for f in range(codes.shape[-1]):
        pieces += stream.push(codes[..., f : f + 1])
    pieces += stream.push(codes[..., :0], final=True)
    streamed = torch.cat(pieces, dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(streamed, dec(codes), rtol=0, atol=1e-5)
    _check_pcm(streamed, golden, "full")
