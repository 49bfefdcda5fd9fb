"""Checkpoints re-saved by the installed ``transformers`` load with our loader: each config class's
``attribute_map`` aliases are honoured (``transformers`` 5.x writes the talker's and Qwen3-MoE's
``num_local_experts``, not ``num_experts``)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    DacConfig,
    LlamaConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3OmniMoeConfig,
)
from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as hf_omni  # noqa: E402

from omniduplex.models.codecs.dac import DacDecoderConfig  # noqa: E402
from omniduplex.models.config import DECODER_ALIASES, DecoderConfig, OmniConfig  # noqa: E402
from omniduplex.models.qwen3_omni.audio_encoder import AUDIO_ALIASES, AudioEncoderConfig  # noqa: E402
from omniduplex.models.qwen3_omni.code2wav_config import Code2WavConfig  # noqa: E402
from omniduplex.models.qwen3_omni.presets import omni_config, text_config, write_checkpoint  # noqa: E402
from omniduplex.models.registry import load_model  # noqa: E402
from omniduplex.models.unified.model import UnifiedConfig  # noqa: E402
from omniduplex.models.unified.presets import PRESETS as UNIFIED_PRESETS  # noqa: E402
from omniduplex.models.unified.presets import unified_config  # noqa: E402

OMNI_PRESETS = ("tiny", "small")


def resave(cls, d: dict, tmp_path) -> dict:
    """``d`` as ``transformers`` writes it: built into ``cls``, ``save_pretrained``, read back."""
    cls(**copy.deepcopy(d)).save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def typed(omni: dict) -> dict:
    """Every typed config our loader builds from a Qwen3-Omni ``config.json`` dict."""
    cfg = OmniConfig.from_dict(omni)
    return {
        "thinker": cfg.thinker.text,
        "audio": AudioEncoderConfig.from_dict(cfg.thinker.audio),
        "talker": cfg.talker.text,
        "predictor": cfg.talker.code_predictor,
        "talker_ids": {k: v for k, v in dataclasses.asdict(cfg.talker).items() if not isinstance(v, dict)},
        "code2wav": Code2WavConfig.from_dict(cfg.code2wav),
        "ids": {k: getattr(cfg, k) for k in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id")},
    }


@pytest.mark.parametrize(
    ("hf", "ours", "aliases"),
    [
        (Qwen3MoeConfig, DecoderConfig, DECODER_ALIASES),
        (Qwen3Config, DecoderConfig, DECODER_ALIASES),
        (LlamaConfig, DecoderConfig, DECODER_ALIASES),
        (hf_omni.Qwen3OmniMoeTextConfig, DecoderConfig, DECODER_ALIASES),
        (hf_omni.Qwen3OmniMoeTalkerTextConfig, DecoderConfig, DECODER_ALIASES),
        (hf_omni.Qwen3OmniMoeTalkerCodePredictorConfig, DecoderConfig, DECODER_ALIASES),
        (hf_omni.Qwen3OmniMoeAudioEncoderConfig, AudioEncoderConfig, AUDIO_ALIASES),
        (hf_omni.Qwen3OmniMoeCode2WavConfig, Code2WavConfig, {}),
        (DacConfig, DacDecoderConfig, {}),
    ],
)
def test_alias_tables_cover_the_attribute_maps(hf, ours, aliases):
    fields = {f.name for f in dataclasses.fields(ours)}
    for alias, attribute in hf.attribute_map.items():
        if alias in fields:
            assert aliases.get(attribute) == alias, f"{hf.__name__}: {attribute} → {alias}"
        elif attribute in fields:
            assert aliases.get(alias) == attribute, f"{hf.__name__}: {alias} → {attribute}"


@pytest.mark.parametrize("preset", OMNI_PRESETS)
def test_qwen3_omni_presets_resaved_by_transformers_parse_the_same(preset, tmp_path):
    original = omni_config(preset)
    saved = resave(Qwen3OmniMoeConfig, original, tmp_path)
    assert "num_local_experts" in saved["talker_config"]["text_config"]  # what made the talker dense
    assert typed(saved) == typed(original)
    assert OmniConfig.from_dict(saved).talker.text.num_experts == 4


@pytest.mark.parametrize("preset", OMNI_PRESETS)
def test_text_presets_resaved_by_transformers_parse_the_same(preset, tmp_path):
    original = text_config(preset)
    saved = resave(Qwen3MoeConfig, original, tmp_path)
    assert DecoderConfig.from_dict(saved) == DecoderConfig.from_dict(original)
    assert DecoderConfig.from_dict(saved).num_experts > 0


@pytest.mark.parametrize("preset", UNIFIED_PRESETS)
def test_unified_presets_with_parts_resaved_by_transformers_parse_the_same(preset, tmp_path):
    """``transformers`` has no class for the unified LM: its decoder re-saves as ``Qwen3Config`` (same keys)
    and its codec as ``DacConfig``; the unified keys ride along unchanged."""
    original = unified_config(preset)
    decoder = {k: v for k, v in original.items() if k != "codec_config"}
    saved = resave(Qwen3Config, decoder, tmp_path / "decoder")
    saved["codec_config"] = resave(DacConfig, original["codec_config"], tmp_path / "codec")
    for k in ("architectures", "model_type"):
        saved[k] = original[k]
    a, b = UnifiedConfig.from_dict(saved), UnifiedConfig.from_dict(original)
    assert a.decoder == b.decoder
    assert DacDecoderConfig.from_dict(a.codec_config) == DacDecoderConfig.from_dict(b.codec_config)
    assert dataclasses.replace(a, codec_config={}) == dataclasses.replace(b, codec_config={})


def test_tiny_checkpoint_resaved_by_transformers_loads_with_moe_talker(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", "tiny")
    saved = resave(Qwen3OmniMoeConfig, json.loads((ckpt / "config.json").read_text()), tmp_path / "hf")
    (ckpt / "config.json").write_text(json.dumps(saved))
    loaded = load_model(ckpt)  # strict: a dense talker would not find its expert tensors
    assert loaded.config.talker.text.num_experts == 4
    assert loaded.talker is not None


def test_hand_made_config_with_num_local_experts():
    d = omni_config("tiny")
    talker = d["talker_config"]["text_config"]
    talker["num_local_experts"] = talker.pop("num_experts")
    cfg = OmniConfig.from_dict(d)
    assert cfg.talker.text.num_experts == 4 and cfg.talker.text.is_moe_layer(0)
    text = text_config("tiny")
    text["num_local_experts"] = text.pop("num_experts")
    assert DecoderConfig.from_dict(text).num_experts == 4
    audio = dict(d["thinker_config"]["audio_config"])
    audio["num_hidden_layers"] = audio.pop("encoder_layers")
    assert AudioEncoderConfig.from_dict(audio).encoder_layers == 2
