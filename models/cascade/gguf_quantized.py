"""Serve a GGUF LLM on its quantized blocks: the linear layers and the token embedding of a loaded
Thinker replaced by modules that keep the GGUF tensors' GGML blocks and run our C++ kernels
(:mod:`omniduplex.kernels.quant`: Q4_1, Q5_0, Q8_0, Q4_K, Q6_K).

The model is built on the meta device (:func:`load_quantized`); every ``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``, ``lm_head`` and ``embed_tokens`` becomes its quantized counterpart read from
the GGUF, and only the tensors that stay float (norms, q/k/v biases) are read from the dequantised import
(:func:`.gguf_import.cached_import`, which also supplies the config and the tokenizer): the float copy of the
projections is never held. Rows keep their order except the q/k rows of a ``llama`` GGUF, which are
un-permuted (whole rows of blocks) as the import does.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from omniduplex.kernels import quant
from omniduplex.models.cascade.gguf_import import _PERMUTED_ROPE, _open, unpermute_rope_rows
from omniduplex.models.checkpoint import (
    CheckpointError,
    iter_tensors,
    merged_sources,
    read_config,
    weight_files,
)
from omniduplex.models.layers import RotaryEmbedding, rope_inv_freq
from omniduplex.models.random_init import building_on
from omniduplex.models.registry import LoadedModel, architecture_of, model_family_of

log = logging.getLogger(__name__)

_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})


class QuantLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` kept in GGML blocks, as one or more row groups (a merged projection
    whose parts differ in type, e.g. Qwen2's Q5_0 q/k and Q8_0 v, is one group per type run).

    Args:
        groups: ``[(blocks uint8 [rows, row_bytes], GGML type id)]`` in output-row order.
        in_features: ``K``.
        bias: fp32 ``[sum(rows)]`` or ``None``.
        dtype: the dtype of the output (the model's activation dtype); ``weight`` is an empty tensor of it
            (callers read ``lm_head.weight.dtype``/``.device``).
    """

    def __init__(
        self, groups: list[tuple[torch.Tensor, int]], in_features: int, bias: torch.Tensor | None, dtype
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = sum(int(w.shape[0]) for w, _ in groups)
        self.types = tuple(t for _, t in groups)
        for i, (w, t) in enumerate(groups):
            if w.dtype != torch.uint8 or w.shape[1] != quant.row_bytes(t, in_features):
                raise ValueError(
                    f"group {i}: {tuple(w.shape)} {w.dtype} is not GGML type {t} rows of {in_features}"
                )
            self.register_buffer(f"qweight{i}", w.contiguous(), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self.register_buffer("weight", torch.empty(0, dtype=dtype), persistent=False)
        quant.load()  # builds the kernels once per machine (raises QuantBuildError)
        self._qmatmul = torch.ops.omniduplex_quant.qmatmul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., K]`` → ``[..., out_features]`` in ``x.dtype``."""
        # a decode step calls this ~4 times a layer: no call that is not needed (each costs microseconds)
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if len(self.types) == 1:
            y = self._qmatmul(x2, self.qweight0, self.types[0], self.in_features)
        else:
            ys = [
                self._qmatmul(x2, getattr(self, f"qweight{i}"), t, self.in_features)
                for i, t in enumerate(self.types)
            ]
            y = torch.cat(ys, dim=-1)
        if self.bias is not None:
            y.add_(self.bias)
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)



class QuantEmbedding(nn.Module):
    """Token embedding whose table stays in GGML blocks; looked-up rows are dequantised exactly."""

    def __init__(self, blocks: torch.Tensor, qtype: int, dim: int, dtype) -> None:
        super().__init__()
        self.qtype, self.embedding_dim = qtype, dim
        self.num_embeddings = int(blocks.shape[0])
        self.register_buffer("qweight", blocks.contiguous(), persistent=False)
        self.register_buffer("weight", torch.empty(0, dtype=dtype), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` int64 ``[...]`` → ``[..., dim]`` in the model dtype."""
        rows = quant.dequantize_rows(self.qweight, self.qtype, self.embedding_dim, ids.reshape(-1))
        return rows.to(self.weight.dtype).reshape(*ids.shape, self.embedding_dim)


def _blocks(t, src: Path) -> tuple[torch.Tensor, int] | None:
    """A GGUF tensor's rows as ``(uint8 [rows, row_bytes], type id)``; ``None`` for a float tensor.

    Raises:
        CheckpointError: a quant type our kernels do not take.
    """
    name = t.tensor_type.name
    if name in _FLOAT_TYPES:
        return None
    if name not in quant.TYPES:
        raise CheckpointError(
            f"{src.name}: tensor {t.name} has quant type {name}, which the quantized kernels do not take "
            f"({', '.join(quant.TYPES)}); serve it dequantised (llm_quantized: false)"
        )
    data = np.ascontiguousarray(t.data).view(np.uint8)
    rows = int(t.shape[-1]) if len(t.shape) > 1 else 1
    return torch.from_numpy(data.reshape(rows, -1).copy()), quant.TYPES[name]


@torch.no_grad()
def load_quantized(
    model_dir: str | Path, gguf_path: str | Path, dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """The text LM of a GGUF served on the GGUF's quantized blocks, loaded without its float weights.

    The model is built on the meta device (no memory), its projections and embedding are swapped for
    :class:`QuantLinear` / :class:`QuantEmbedding` holding the GGUF's blocks, and only what stays float
    (norms, q/k/v biases, a projection the GGUF keeps float) is read from the import ``model_dir``
    (:func:`.gguf_import.cached_import`, which also gives the config). The peak memory is the quantized
    model's (Qwen2.5-Coder-1.5B Q4_K_M: 1.5 GB resident, 3.0 GB peak with the GGUF's pages, against
    7.9 GB when the float import was loaded first and then swapped).

    Args:
        model_dir: the GGUF's import (``config.json`` + safetensors).
        gguf_path: the GGUF file.
        dtype: the activation dtype (norm weights; biases stay fp32 as in :class:`QuantLinear`).

    Raises:
        CheckpointError: not a text LM; unreadable GGUF, a quant type the kernels do not take, or shapes that
            do not match the config (one line naming the file); a float tensor missing from the import.
        QuantBuildError: the C++ kernels cannot be built here.
    """
    t0 = time.perf_counter()
    model_dir, src = Path(model_dir), Path(gguf_path)
    raw = read_config(model_dir)
    arch = architecture_of(raw, model_dir)
    family = model_family_of(arch)
    if family is None or family.name != "text-lm" or family.build_random is None:
        raise CheckpointError(f"{model_dir}: {arch} is not a text LM; a GGUF serves a text LM")
    with building_on("meta", dtype):
        out = family.build_random(raw, arch, ("thinker",), model_dir)
    thinker = out.thinker
    merged = merged_sources(thinker)  # before the swap: a QuantLinear no longer names its parts
    counts = _swap_quantized(thinker, src)
    _fill_float(thinker, weight_files(model_dir), merged, model_dir)
    thinker.eval().requires_grad_(False)
    fused = register_decode_layers(thinker)
    out.load_seconds = time.perf_counter() - t0
    log.info(
        "%s: quantized modules %s (kernels: %s; %d layers decode in one call), loaded in %.1f s",
        src.name, counts, quant.isa(), fused, out.load_seconds,
    )
    return out


def _fill_float(thinker: nn.Module, files: dict[str, Path], merged: dict, model_dir: Path) -> None:
    """Read every tensor of ``thinker`` still on the meta device from the checkpoint ``files`` (a merged
    projection's parts concatenated, as :func:`~omniduplex.models.checkpoint.load_state_dict_into`; tied
    tensors read once), in the meta tensor's dtype; RoPE tables are recomputed.

    Raises:
        CheckpointError: a tensor missing from the checkpoint or of the wrong shape.
    """
    done: dict[int, torch.Tensor] = {}
    for mod_name, mod in thinker.named_modules():
        if isinstance(mod, RotaryEmbedding) and mod.inv_freq.is_meta:
            mod.inv_freq = rope_inv_freq(mod.head_dim, mod.theta, device="cpu")
        own = f"{mod_name}." if mod_name else ""
        for attr, t in list(mod._parameters.items()) + list(mod._buffers.items()):
            if t is None or not t.is_meta:
                continue
            name = own + attr
            if id(t) not in done:
                srcs = [s for s, _ in merged[name]] if name in merged else [name]
                missing = [s for s in srcs if s not in files]
                if missing:
                    raise CheckpointError(f"{model_dir}: missing tensor '{missing[0]}' for {name}")
                loaded = torch.cat([v for _, v in iter_tensors(files, srcs)])
                if loaded.shape != t.shape:
                    raise CheckpointError(
                        f"{model_dir}: tensor {name} has shape {list(loaded.shape)}, "
                        f"the config implies {list(t.shape)}"
                    )
                done[id(t)] = loaded.to(t.dtype)
            if attr in mod._parameters:
                mod._parameters[attr] = nn.Parameter(done[id(t)], requires_grad=False)
            else:
                mod._buffers[attr] = done[id(t)]


def _swap_quantized(thinker: nn.Module, src: Path) -> dict[str, int]:
    """Replace ``thinker``'s projections, LM head and embedding with the GGUF's quantized blocks in place
    (a projection any of whose parts is a float tensor in the GGUF keeps its float module); the count of
    swapped modules per GGML type."""
    quant.load()
    reader = _open(src)
    arch = str(reader.fields["general.architecture"].contents())
    tensors = {t.name: t for t in reader.tensors}
    cfg = thinker.cfg
    dtype = thinker.model.norm.weight.dtype
    counts: dict[str, int] = {}

    def grab(name: str, heads: int | None = None):
        t = tensors.get(name)
        if t is None:
            raise CheckpointError(f"{src.name}: GGUF has no tensor {name}")
        got = _blocks(t, src)
        if got is not None and heads is not None and arch in _PERMUTED_ROPE:
            got = (unpermute_rope_rows(got[0], heads), got[1])
        return got

    def swap(parent: nn.Module, attr: str, names: list[tuple[str, int | None]]) -> None:
        old = getattr(parent, attr)
        parts = [grab(n, h) for n, h in names]
        if any(p is None for p in parts):
            return
        if sum(p[0].shape[0] for p in parts) != old.out_features:
            raise CheckpointError(f"{src.name}: {names[0][0]} rows do not match the loaded model")
        groups: list[tuple[torch.Tensor, int]] = []
        for w, t in parts:  # consecutive parts of one type: one kernel call
            if groups and groups[-1][1] == t:
                groups[-1] = (torch.cat([groups[-1][0], w]), t)
            else:
                groups.append((w, t))
        bias = None if getattr(old, "bias", None) is None else old.bias.float()
        setattr(parent, attr, QuantLinear(groups, old.in_features, bias, dtype))
        for _, t in groups:
            name = next(k for k, v in quant.TYPES.items() if v == t)
            counts[name] = counts.get(name, 0) + 1

    for i, layer in enumerate(thinker.model.layers):
        b = f"blk.{i}."
        attn = layer.self_attn
        qkv = [
            (b + "attn_q.weight", cfg.num_attention_heads),
            (b + "attn_k.weight", cfg.num_key_value_heads),
            (b + "attn_v.weight", None),
        ]
        swap(attn, "qkv_proj", qkv)
        swap(attn, "o_proj", [(b + "attn_output.weight", None)])
        if hasattr(layer.mlp, "gate_up_proj") and isinstance(layer.mlp.gate_up_proj, nn.Linear):
            swap(layer.mlp, "gate_up_proj", [(b + "ffn_gate.weight", None), (b + "ffn_up.weight", None)])
            swap(layer.mlp, "down_proj", [(b + "ffn_down.weight", None)])
    out_name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    if cfg.tie_word_embeddings:  # untie, then swap (a meta module: its weight is replaced at once)
        thinker.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta")
        thinker.lm_head.weight = thinker.model.embed_tokens.weight
    swap(thinker, "lm_head", [(out_name, None)])
    emb = grab("token_embd.weight")
    if emb is not None:
        thinker.model.embed_tokens = QuantEmbedding(emb[0], emb[1], cfg.hidden_size, dtype)
    return counts


def register_decode_layers(thinker: nn.Module) -> int:
    """Register each layer whose projections are all :class:`QuantLinear` (no per-head q/k norm, a dense
    SwiGLU MLP, a head size the C++ decode attention takes) with ``omniduplex_cpu::register_quant_layer``,
    so its decode steps run as one C++ call (:meth:`~omniduplex.models.layers.DecoderLayer.forward`); prefill
    keeps the per-op path. Returns the number of layers registered (0 where the C++ ops are unavailable, e.g.
    ``OMNIDUPLEX_CPU_OPS=0``, or the model is not on the CPU). The model must not change afterwards."""
    from omniduplex.kernels import cpu_ops

    if thinker.model.norm.weight.device.type != "cpu" or not cpu_ops.available():
        return 0
    n = 0
    for layer in thinker.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projs = [attn.qkv_proj, attn.o_proj, getattr(mlp, "gate_up_proj", None)]
        projs.append(getattr(mlp, "down_proj", None))
        if attn.q_norm is not None or not all(isinstance(m, QuantLinear) for m in projs):
            continue
        if attn.head_dim % 16 or not 16 <= attn.head_dim <= 128:
            continue

        def parts(m: QuantLinear) -> tuple[list[torch.Tensor], list[int]]:
            return [getattr(m, f"qweight{i}") for i in range(len(m.types))], list(m.types)

        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        layer.quant_key = torch.ops.omniduplex_cpu.register_quant_layer(
            ln1.weight.detach(), ln2.weight.detach(), ln1.eps,
            *parts(attn.qkv_proj), _bias(attn.qkv_proj), *parts(attn.o_proj), _bias(attn.o_proj),
            *parts(mlp.gate_up_proj), *parts(mlp.down_proj),
            attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale,
        )
        n += 1
    return n


def _bias(m: QuantLinear) -> torch.Tensor | None:
    return None if m.bias is None else m.bias.detach()
