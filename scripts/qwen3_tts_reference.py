"""Golden files from the reference Qwen3-TTS (``qwen-tts`` 0.1.1), for tests/test_qwen3_tts_parity.py.

Runs in the reference's own virtual environment (transformers 4.57.3; see scripts/qwen3_tts_goldens.sh, which
also writes the preset checkpoints with our code first). For each checkpoint set (``tiny``, ``heldout``) it
writes ``tests/golden/qwen3_tts/<set>.npz`` with:

- ``cases``: JSON list of greedy generation requests (variant, ids, language, speaker, instruction,
  reference transcript / codes, streaming mode) and, per case ``i``, ``codes_<i>`` int16 ``[F, 16]``: the
  reference's greedy frames (``do_sample=False``, ``subtalker_dosample=False``, repetition penalty 1.05);
- ``xvector`` fp32: the Base speaker encoder's x-vector of :func:`clip` (the reference clip);
- ``encoder_codes`` int16 ``[17, 16]``: the speech tokenizer's codes of a 1.3 s clip;
- ``codec_codes`` int16 ``[16, F]``: random codes; ``full_*`` / ``stream_*``: the reference decoder's
  waveform of them, whole and with the streaming schedule (1-frame first chunk, 25-frame chunks, 72 frames
  of left context), as int16 (``round(x · 32767)``): ``*_sub`` every 16th sample from sample 7,
  ``*_frame_sum`` int64 per-frame sums of all 1920 samples.

Everything is seeded; running it again gives the same files (the reference runs in fp32 on CPU).
Usage: ``REF_PYTHON scripts/qwen3_tts_reference.py CKPT_ROOT OUT_DIR`` (CKPT_ROOT/<set>_<variant>/);
``REF_PYTHON scripts/qwen3_tts_reference.py --check`` exits 0 when ``qwen_tts`` imports (the venv is usable).
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch


def _stub_torchaudio() -> None:
    """qwen-tts imports torchaudio (its 25 Hz tokenizer uses kaldi fbank); the 12 Hz path never calls it,
    and the PyPI torchaudio does not load with torch 2.13, so a stub package stands in."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        m.__path__ = []
        sys.modules[name] = m
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


_stub_torchaudio()
import qwen_tts  # noqa: E402,F401 (the whole package: its 25 Hz tokenizer imports sox and onnxruntime)
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig  # noqa: E402
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration  # noqa: E402
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Config,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2Model,
)
from safetensors.torch import load_file  # noqa: E402

IM_START, IM_END, USER, ASSISTANT, NL = 257, 258, 269, 270, 10  # the preset byte tokenizer's ids
MAX_NEW = {"tiny": 24, "heldout": 16}
CODEC_FRAMES, SUB_STRIDE, SUB_OFFSET = 80, 16, 7
ENCODE_SECONDS = 1.3  # 31200 samples: 16.25 frames, so the last frame is partial


def clip(seconds: float = 0.5, sr: int = 24000) -> np.ndarray:
    """The reference clip: a chirp plus a tone, fp32 (computed in fp64)."""
    t = np.arange(int(seconds * sr), dtype=np.float64) / sr
    return (0.3 * np.sin(2 * np.pi * (200 * t + 400 * t * t)) + 0.1 * np.sin(2 * np.pi * 1234 * t)).astype(
        np.float32
    )


def chat(body: list[int]) -> list[int]:
    return [IM_START, ASSISTANT, NL, *body, IM_END, NL, IM_START, ASSISTANT, NL]


def cases(rng: np.random.Generator) -> list[dict]:
    def body(n: int) -> list[int]:
        return [int(x) for x in rng.integers(32, 127, n)]

    text, instruct = body(12), [IM_START, USER, NL, *body(7), IM_END, NL]
    ref = [IM_START, ASSISTANT, NL, *body(5), IM_END, NL]
    short_codes = rng.integers(0, 2048, (6, 16)).tolist()
    long_codes = rng.integers(0, 2048, (30, 16)).tolist()
    base = dict(ids=chat(text), language="auto", speaker=None, instruct=None, non_streaming=False)
    return [
        dict(base, variant="custom_voice", speaker="aiden", language="english"),
        dict(base, variant="custom_voice", speaker="eric"),
        dict(
            base,
            variant="custom_voice",
            speaker="ryan",
            language="chinese",
            instruct=instruct,
            non_streaming=True,
        ),
        dict(base, variant="voice_design", instruct=instruct),
        dict(base, variant="voice_design", instruct=instruct, language="english", non_streaming=True),
        dict(base, variant="base", language="english", xvector=True),
        dict(base, variant="base", xvector=True, ref_ids=ref, ref_codes=short_codes),
        dict(base, variant="base", xvector=True, ref_ids=ref, ref_codes=long_codes),
        dict(base, variant="base", xvector=True, ref_ids=ref, ref_codes=short_codes, non_streaming=True),
    ]


def load_tts(path: Path) -> Qwen3TTSForConditionalGeneration:
    cfg = Qwen3TTSConfig(**json.loads((path / "config.json").read_text()))
    model = Qwen3TTSForConditionalGeneration(cfg)
    state = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{path}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.float().eval()


def load_decoder(path: Path) -> Qwen3TTSTokenizerV2Decoder:
    raw = json.loads((path / "speech_tokenizer" / "config.json").read_text())
    dec = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(**raw["decoder_config"]))
    full = load_file(str(path / "speech_tokenizer" / "model.safetensors"))
    state = {k[len("decoder.") :]: v for k, v in full.items() if k.startswith("decoder.")}
    dec.load_state_dict(state, strict=True)
    return dec.float().eval()


@torch.no_grad()
def encode_clip(path: Path, seconds: float) -> np.ndarray:
    """The reference speech tokenizer's codes of :func:`clip` ``[frames, 16]`` (its ``encode``)."""
    raw = json.loads((path / "speech_tokenizer" / "config.json").read_text())
    model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**raw))
    model.load_state_dict(load_file(str(path / "speech_tokenizer" / "model.safetensors")), strict=True)
    wav = torch.from_numpy(clip(seconds))[None]
    out = model.float().eval().encode(wav, torch.ones_like(wav, dtype=torch.long), return_dict=True)
    return out.audio_codes[0].numpy().astype(np.int16)


def pcm16(w: torch.Tensor) -> np.ndarray:
    return np.round(w.double().numpy().reshape(-1) * 32767).astype(np.int16)


@torch.no_grad()
def generate(models: dict, case: dict, xvec: torch.Tensor, max_new: int) -> np.ndarray:
    m = models[case["variant"]]
    t = lambda ids: torch.tensor([ids], dtype=torch.long)  # noqa: E731
    kw = {}
    if case["variant"] == "base":
        icl = "ref_codes" in case
        kw["voice_clone_prompt"] = dict(
            ref_spk_embedding=[xvec],
            x_vector_only_mode=[not icl],
            icl_mode=[icl],
            ref_code=[torch.tensor(case["ref_codes"], dtype=torch.long)] if icl else None,
        )
        if icl:
            kw["ref_ids"] = [t(case["ref_ids"])]
    codes, _ = m.generate(
        input_ids=[t(case["ids"])],
        instruct_ids=[t(case["instruct"]) if case["instruct"] else None],
        languages=[case["language"]],
        speakers=[case["speaker"]],
        non_streaming_mode=case["non_streaming"],
        max_new_tokens=max_new,
        do_sample=False,
        subtalker_dosample=False,
        repetition_penalty=1.05,
        **kw,
    )
    return codes[0].numpy().astype(np.int16)


@torch.no_grad()
def stream_decode(dec, codes: torch.Tensor, first: int, chunk: int, left: int) -> torch.Tensor:
    """The reference decoder's forward on the streaming windows (its chunked_decode with a first chunk)."""
    hop, pieces, start, n = 1920, [], 0, codes.shape[-1]
    while start < n:
        end = min(start + (first if start == 0 else chunk), n)
        ctx = min(left, start)
        pieces.append(dec(codes[..., start - ctx : end])[..., ctx * hop :])
        start = end
    return torch.cat(pieces, dim=-1)


def main(root: Path, out: Path) -> None:
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tiny", "heldout"):
        models = {v: load_tts(root / f"{name}_{v}") for v in ("base", "custom_voice", "voice_design")}
        xvec = models["base"].extract_speaker_embedding(clip(), 24000).float()
        todo = cases(np.random.default_rng(25))
        arrays: dict[str, np.ndarray] = {
            "xvector": xvec.numpy().astype(np.float32),
            "max_new_tokens": np.array(MAX_NEW[name]),
        }
        for i, case in enumerate(todo):
            arrays[f"codes_{i}"] = generate(models, case, xvec, MAX_NEW[name])
            print(name, i, case["variant"], arrays[f"codes_{i}"].shape, flush=True)
        arrays["encoder_codes"] = encode_clip(root / f"{name}_base", ENCODE_SECONDS)
        dec = load_decoder(root / f"{name}_base")
        codes = torch.from_numpy(np.random.default_rng(7).integers(0, 2048, (1, 16, CODEC_FRAMES)))
        with torch.no_grad():
            full = dec(codes)
            if not torch.equal(dec.chunked_decode(codes), full):  # 300-frame windows: one window here
                raise SystemExit("reference chunked_decode differs from its forward on one window")
        streamed = stream_decode(dec, codes, 1, 25, 72)
        arrays["codec_codes"] = codes[0].numpy().astype(np.int16)
        for key, w in (("full", full), ("stream", streamed)):
            p = pcm16(w)
            arrays[f"{key}_sub"] = p[SUB_OFFSET::SUB_STRIDE]
            arrays[f"{key}_frame_sum"] = p.astype(np.int64).reshape(CODEC_FRAMES, 1920).sum(1)
        arrays["cases"] = np.array(json.dumps(todo))
        np.savez_compressed(out / f"{name}.npz", **arrays)
        print(
            name,
            "full vs stream max |diff| (LSB):",
            int(np.abs(pcm16(full).astype(int) - pcm16(streamed)).max()),
        )


if __name__ == "__main__":
    if sys.argv[1:] != ["--check"]:
        main(Path(sys.argv[1]), Path(sys.argv[2]))
