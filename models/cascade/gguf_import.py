"""Import a llama.cpp GGUF file (``general.architecture`` ``llama`` or ``qwen2``) as an HF-layout checkpoint.

GGUF (spec: ``ggml/docs/gguf.md`` in the ggml repository) holds typed metadata key/values and tensors in
ggml order (``shape[0]`` is the fastest axis, so a ``[in, out]`` GGUF shape is a ``[out, in]`` matrix),
possibly block-quantised (Q4_1, Q8_0, K-quants, ...). The ``gguf`` package reads the file
(``GGUFReader``) and dequantises blocks (``gguf.quants.dequantize``); this module only renames, reorders
and writes:

* ``config.json``: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` config from the ``<arch>.*`` and
  ``tokenizer.ggml.*`` keys (``qwen2``: q/k/v biases, no o_proj bias, rope theta from the GGUF).
* ``model.safetensors`` (or shards of at most :data:`SHARD_BYTES` with their index, written one at a time):
  float32 tensors under the Hugging Face names. llama.cpp's converter
  (``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders the rows of ``q_proj``/``k_proj`` of every
  head from rotate-half order ``[2, head_dim/2]`` to interleaved pairs ``[head_dim/2, 2]`` for its
  GPT-J-style RoPE; :func:`unpermute_rope_rows` undoes that, since our attention rotates halves.
  ``qwen2`` is converted without that permutation (llama.cpp runs it with NEOX, i.e. rotate-half, RoPE).
* ``tokenizer.json``: a byte-level BPE (``tokenizers``) from ``tokenizer.ggml.tokens/merges/token_type``
  and the pre-tokenizer split llama.cpp uses for ``tokenizer.ggml.pre`` (``src/llama-vocab.cpp``).
* ``tokenizer_config.json`` (``chat_template``, bos/eos/pad strings) and ``gguf_source.json`` (source
  path and sha256).

Everything is written into a temporary sibling directory and renamed into place, so a reader never sees
a half-written checkpoint. :func:`cached_import` does this once per GGUF content.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from omniduplex.kernels.once import one_time_step
from omniduplex.models.cascade.gguf_tokenizer import GGUFMeta, build_tokenizer, token_ids
from omniduplex.models.checkpoint import INDEX_FILE, CheckpointError
from omniduplex.models.weights import sha256_file

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
"""``general.architecture`` → the HF architecture we write (loaded by :mod:`omniduplex.models.registry`)."""
_PERMUTED_ROPE = frozenset({"llama"})
"""Architectures whose q/k rows llama.cpp's converter permutes for GPT-J-style RoPE."""
SOURCE_FILE = "gguf_source.json"
_REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", SOURCE_FILE)

# Per-layer GGUF tensor names (gguf ``tensor_mapping``) → HF ``LlamaForCausalLM`` names.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_TOP = re.compile(r"^([a-z_]+)\.(weight|bias)$")


def _f32(v: float) -> float:
    """A GGUF float32 as the shortest decimal that round-trips it (``1e-05``, not ``9.99999974e-06``)."""
    return float(str(np.float32(v)))


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row permutation of a q or k projection.

    ``convert_hf_to_gguf.py`` stores, per head, row ``2*i + j`` of the GGUF tensor from HF row
    ``j*head_dim/2 + i`` (``j`` in {0, 1}: first or second half), i.e. it views the rows as
    ``[heads, 2, head_dim/2]`` and swaps the last two axes. This inverse views them as
    ``[heads, head_dim/2, 2]`` and swaps back.

    Args:
        w: weight ``[heads * head_dim, in]`` or bias ``[heads * head_dim]`` in GGUF row order.
        n_heads: query heads for ``q_proj``, key/value heads for ``k_proj``.

    Returns:
        The tensor in HF rotate-half row order, same shape and dtype.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise CheckpointError(f"cannot un-permute {rows} rope rows over {n_heads} heads")
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _dequantize(t, path: Path) -> torch.Tensor:
    import gguf

    try:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as e:
        raise CheckpointError(
            f"{path.name}: tensor {t.name} has quant type {t.tensor_type.name}, which gguf "
            f"{getattr(gguf, '__version__', '')} cannot dequantise ({e})"
        ) from e
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(shape)
    return torch.from_numpy(arr if arr.flags.writeable else arr.copy())  # F32 tensors are read-only memmaps


def _hf_name(name: str, path: Path) -> str:
    m = _BLOCK.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = _TOP.match(name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    if name == "rope_freqs.weight":
        raise CheckpointError(f"{path.name}: rope_freqs (Llama-3 RoPE frequency scaling) is not supported")
    raise CheckpointError(f"{path.name}: GGUF tensor {name!r} has no HF decoder counterpart")


def _config(meta: GGUFMeta, path: Path, vocab: int, tied: bool, attn_bias: bool, tok: dict) -> dict:
    a = meta.need("general.architecture")
    heads = int(meta.need(f"{a}.attention.head_count"))
    hidden = int(meta.need(f"{a}.embedding_length"))
    head_dim = int(meta.get(f"{a}.attention.key_length", hidden // heads))
    rope_dims = int(meta.get(f"{a}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise CheckpointError(f"{path.name}: partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    scaling = meta.get(f"{a}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise CheckpointError(f"{path.name}: RoPE scaling {scaling!r} is not supported")
    if int(meta.get(f"{a}.expert_count", 0) or 0):
        raise CheckpointError(f"{path.name}: MoE {a} (expert_count > 0) is not supported")
    theta = _f32(meta.get(f"{a}.rope.freq_base", 10000.0))
    cfg = {
        "architectures": [ARCHITECTURES[a]],
        "model_type": a,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(meta.need(f"{a}.feed_forward_length")),
        "num_hidden_layers": int(meta.need(f"{a}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{a}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.get(f"{a}.context_length", 2048)),
        "rms_norm_eps": _f32(meta.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": attn_bias and a == "llama",  # qwen2: q/k/v biases only, implied by the type
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in tok:
            cfg[key] = tok[key]
    return cfg


def import_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Dequantise a llama GGUF into an HF-layout float32 checkpoint at ``out_dir`` (replaced if present).

    Writes ``config.json``, ``model.safetensors`` (float32, HF names, q/k rows un-permuted, no
    ``lm_head.weight`` when the GGUF has no ``output.weight``: tied embeddings), ``tokenizer.json``,
    ``tokenizer_config.json`` and ``gguf_source.json`` (``source``, ``sha256``, ``tensor_types``,
    ``import_seconds``) into a temporary sibling, then renames it into place.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        CheckpointError: missing or unreadable GGUF, ``general.architecture`` other than ``llama``, a
            tensor or quant type we cannot map or dequantise, an unsupported tokenizer or RoPE variant
            (one line naming the file).
    """
    return _import(Path(gguf_path), Path(out_dir), sha256=None, replace=True)


def _import(src: Path, out_dir: Path, sha256: str | None, replace: bool) -> Path:
    t0 = time.perf_counter()
    reader = _open(src)
    meta = GGUFMeta(reader, src)
    arch = meta.need("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{src.name}: GGUF architecture {arch!r} is not supported (only {', '.join(ARCHITECTURES)})"
        )
    tokenizer = build_tokenizer(meta, src)
    names = {_hf_name(t.name, src): t for t in reader.tensors}
    if "model.embed_tokens.weight" not in names:
        raise CheckpointError(f"{src.name}: GGUF has no token_embd.weight")
    tok_ids = token_ids(meta)
    vocab = int(names["model.embed_tokens.weight"].shape[-1])  # ggml order: [hidden, vocab]
    tied = "lm_head.weight" not in names
    attn_bias = "model.layers.0.self_attn.q_proj.bias" in names
    config = _config(meta, src, vocab, tied, attn_bias, tok_ids)
    tokens = list(meta.need("tokenizer.ggml.tokens"))
    if len(tokens) > vocab:
        raise CheckpointError(f"{src.name}: {len(tokens)} tokenizer tokens but {vocab} embedding rows")

    def tok_str(key: str) -> str | None:
        i = tok_ids.get(key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok_str("bos_token_id"),
        "eos_token": tok_str("eos_token_id"),
        "pad_token": tok_str("pad_token_id"),
        "unk_token": tok_str("unk_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        tok_config["chat_template"] = template

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        kinds = _write_shards(names, meta, src, tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
        source = {
            "source": str(src.resolve()),
            "sha256": sha256 or sha256_file(src),
            "tensor_types": dict(kinds),
            "import_seconds": round(time.perf_counter() - t0, 3),
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2))
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the cache may be shared
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if replace:
            _move_into_place(tmp, out_dir)
        else:
            _claim(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _open(src: Path):
    import gguf

    if not src.is_file():
        raise CheckpointError(f"{src}: no such GGUF file")
    try:
        return gguf.GGUFReader(str(src))
    except Exception as e:  # gguf raises ValueError/IndexError/struct errors on bad files
        raise CheckpointError(f"{src.name}: not a readable GGUF file ({type(e).__name__}: {e})") from e


SHARD_BYTES = 1 << 30
"""Largest float32 shard written (bytes): an import holds one shard's tensors at a time, so a 1.5B GGUF is
not dequantised into 6 GB of memory at once (Hugging Face's ``max_shard_size`` layout and index)."""


def _write_shards(names: dict, meta: GGUFMeta, src: Path, out: Path) -> Counter:
    """Dequantise the GGUF tensors ``names`` (HF name → GGUF tensor) into ``out`` as float32 safetensors,
    one shard of at most :data:`SHARD_BYTES` in memory at a time: ``model.safetensors`` when one shard holds
    them all, else ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``. Returns the count
    of source tensors per GGML type."""
    arch = meta.need("general.architecture")
    heads = int(meta.need(f"{arch}.attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    permuted = arch in _PERMUTED_ROPE
    sizes = {name: 4 * int(np.prod([int(n) for n in t.shape.tolist()])) for name, t in names.items()}
    shards: list[list[str]] = [[]]
    size = 0
    for name, nbytes in sizes.items():
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    kinds: Counter = Counter()
    weight_map: dict[str, str] = {}
    for k, group in enumerate(shards, 1):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        part: dict[str, torch.Tensor] = {}
        for name in group:
            t = names[name]
            w = _dequantize(t, src)
            if permuted and ".self_attn.q_proj." in name:
                w = unpermute_rope_rows(w, heads)
            elif permuted and ".self_attn.k_proj." in name:
                w = unpermute_rope_rows(w, kv_heads)
            part[name] = w
            weight_map[name] = fname
            kinds[t.tensor_type.name] += 1
        save_file(part, str(out / fname), metadata={"format": "pt"})
        del part
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return kinds


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``; an existing ``out_dir`` is moved aside first and then deleted."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _claim(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir`` unless another writer's complete copy is there (then drop ours)."""
    try:
        if out_dir.exists() and not is_complete(out_dir):
            shutil.rmtree(out_dir)  # leftovers of an interrupted manual copy; ours are never partial
        tmp.rename(out_dir)
    except OSError:
        if not is_complete(out_dir):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def is_complete(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds every file :func:`import_gguf` writes."""
    weights = (model_dir / "model.safetensors").is_file() or (model_dir / INDEX_FILE).is_file()
    return weights and all((model_dir / f).is_file() for f in _REQUIRED_FILES)


def cached_import(gguf_path: str | Path, cache_root: str | Path) -> Path:
    """The imported checkpoint of ``gguf_path`` under ``cache_root/<stem>-<sha256[:12]>/``, importing once.

    The key is the file's content hash, so an updated GGUF at the same path is imported again. When two
    processes import at once, the first rename wins and the other's copy is discarded.

    Raises:
        CheckpointError: see :func:`import_gguf`.
    """
    src = Path(gguf_path)
    if not src.is_file():
        raise CheckpointError(f"{src}: no such GGUF file")
    digest = sha256_file(src)
    target = Path(cache_root) / f"{src.stem}-{digest[:12]}"
    if is_complete(target):
        return target
    with one_time_step(f"importing {src.name}", str(Path(cache_root))):
        return _import(src, target, sha256=digest, replace=False)
