"""A Qwen3-TTS speech tokenizer whose ``decoder_config`` sets ``head_dim`` != ``hidden_size / heads`` loads
with the attention shapes the reference builds (qwen-tts 0.1.1 ``Qwen3TTSTokenizerV2DecoderAttention``: q/o
``num_attention_heads * head_dim``, k/v ``num_key_value_heads * head_dim``), and its frame transformer
computes what transformers' ``Qwen3OmniMoeCode2Wav`` transformer computes from the same weights (the same
layers, honouring ``head_dim`` the same way: ``getattr(config, "head_dim", hidden // heads)``, RoPE included).
qwen-tts itself does not import beside this project's transformers (it pins 4.57.3), so transformers is the
oracle here."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from omniduplex.models.qwen3_omni.code2wav import PreTransformer
from omniduplex.models.qwen3_tts.model import CODEC_DIR, load_qwen3_tts
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint

ATTN = "decoder.pre_transformer.layers.{}.self_attn.{}_proj.weight"


def with_head_dim(path, head_dim: int) -> dict:
    """Rewrite the checkpoint's codec decoder for ``head_dim``: the config key and seeded attention weights of
    the implied shapes. Returns the decoder config."""
    cfg_path = path / CODEC_DIR / "config.json"
    cfg = json.loads(cfg_path.read_text())
    dc = cfg["decoder_config"]
    dc["head_dim"] = head_dim
    cfg_path.write_text(json.dumps(cfg))
    tensors = load_file(str(path / CODEC_DIR / "model.safetensors"))
    h, q, kv = dc["hidden_size"], dc["num_attention_heads"] * head_dim, dc["num_key_value_heads"] * head_dim
    g = torch.Generator().manual_seed(7)
    for layer in range(dc["num_hidden_layers"]):
        for name, shape in (("q", (q, h)), ("k", (kv, h)), ("v", (kv, h)), ("o", (h, q))):
            tensors[ATTN.format(layer, name)] = 0.1 * torch.randn(shape, generator=g)
    save_file(tensors, str(path / CODEC_DIR / "model.safetensors"), metadata={"format": "pt"})
    return dc


def test_codec_decoder_honours_head_dim(tmp_path):
    path = write_tts_checkpoint(tmp_path / "cv", "tiny", 0, "custom_voice")
    plain = json.loads((path / CODEC_DIR / "config.json").read_text())["decoder_config"]
    head_dim = 2 * plain["hidden_size"] // plain["num_attention_heads"]
    dc = with_head_dim(path, head_dim)
    codec = load_qwen3_tts(path).codec
    heads, kv, h = dc["num_attention_heads"], dc["num_key_value_heads"], dc["hidden_size"]
    attn = codec.pre_transformer.layers[0].self_attn
    assert attn.head_dim == head_dim != h // heads
    assert tuple(attn.q_proj.weight.shape) == (heads * head_dim, h)
    assert tuple(attn.k_proj.weight.shape) == tuple(attn.v_proj.weight.shape) == (kv * head_dim, h)
    assert tuple(attn.o_proj.weight.shape) == (h, heads * head_dim)

    hf_cfg = Qwen3OmniMoeCode2WavConfig(
        hidden_size=h,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        sliding_window=dc["sliding_window"],
        intermediate_size=dc["intermediate_size"],
        num_hidden_layers=dc["num_hidden_layers"],
        rms_norm_eps=dc["rms_norm_eps"],
        layer_scale_initial_scale=dc["layer_scale_initial_scale"],
        rope_parameters={"rope_type": "default", "rope_theta": dc["rope_theta"]},
    )
    ref = Qwen3OmniMoeCode2Wav(hf_cfg).pre_transformer.eval()
    ours = {
        k: v for k, v in codec.pre_transformer.state_dict().items() if not k.startswith(("input_", "output_"))
    }
    missing, unexpected = ref.load_state_dict(ours, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    x = torch.randn(2, 30, h, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(inputs_embeds=x).last_hidden_state
        got = PreTransformer.forward(codec.pre_transformer, x)
        assert float((got - want).abs().max()) < 1e-4 * max(1.0, float(want.abs().max()))
        codes = torch.randint(
            0, dc["codebook_size"], (1, dc["num_quantizers"], 5), generator=torch.Generator()
        )
        wav = codec(codes)
    assert wav.shape[-1] == 5 * codec.total_upsample and bool(torch.isfinite(wav).all())
