"""Reading Hugging Face checkpoints: ``config.json`` + ``*.safetensors`` (single file or sharded index).

Errors name the file or tensor at fault. Tensors are read lazily through ``safetensors.safe_open``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the offending file or tensor."""


def read_config(model_dir: str | Path) -> dict:
    """Parse ``model_dir/config.json``.

    Raises:
        CheckpointError: the directory or file is missing, or the JSON does not parse.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in {model_dir}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON ({e})") from e


def config_value(model_dir: str | Path, key: str) -> Any:
    """``config.json``'s value for ``key``: ``None`` when the key is absent or the file is missing or
    unreadable (what the family checks ``is_<family>`` need: they answer False for such a folder)."""
    try:
        return read_config(model_dir).get(key)
    except CheckpointError:
        return None


def parameter_counts(loaded: object, parts: tuple[str, ...]) -> dict[str, int]:
    """Parameter count per loaded part: ``{name: numel}`` for each attribute of ``loaded`` named in
    ``parts`` that holds a module (a part left ``None`` is absent). A parameter shared between modules of
    one part counts once (``Module.parameters`` yields it once)."""
    return {
        name: sum(p.numel() for p in m.parameters())
        for name in parts
        if (m := getattr(loaded, name)) is not None
    }


def config_architecture(model_dir: str | Path) -> str | None:
    """The first entry of ``config.json``'s ``architectures`` list (the Hugging Face convention): ``None``
    when the list is absent or empty, or the file is missing or unreadable (see :func:`config_value`)."""
    return (config_value(model_dir, "architectures") or [None])[0]


@dataclass
class LoadedParts:
    """Base of a family's loaded-checkpoint dataclass: ``class Higgs(LoadedParts, parts=PARTS)`` names the
    attributes that hold its modules (a part not asked for is ``None``). Keyword-only fields: ``parts``,
    the parts asked for; ``load_seconds``, the wall-clock seconds the load took (s)."""

    part_names: ClassVar[tuple[str, ...]] = ()
    load_seconds: float = field(default=0.0, kw_only=True)
    parts: tuple[str, ...] = field(default_factory=tuple, kw_only=True)

    def __init_subclass__(cls, parts: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.part_names = parts

    def num_parameters(self) -> dict[str, int]:
        """Parameter count per loaded part (:func:`parameter_counts`)."""
        return parameter_counts(self, self.part_names)


def weight_files(model_dir: str | Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it.

    Raises:
        CheckpointError: no weights, a shard listed in the index is missing, or a file is unreadable
            (truncated or corrupt).
    """
    d = Path(model_dir)
    index = d / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({e})") from e
        files = {name: d / fname for name, fname in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise CheckpointError(f"shard {f.name} listed in {INDEX_FILE} is missing from {d}")
        _check_headers(set(files.values()))
        return files
    single = sorted(d.glob("*.safetensors"))
    if not single:
        raise CheckpointError(f"no *.safetensors weights in {d}")
    _check_headers(set(single))
    files = {}
    for f in single:
        with _open(f) as st:
            files.update(dict.fromkeys(st.keys(), f))  # noqa: SIM118 (safe_open is not iterable)
    return files


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # safetensors raises its own SafetensorError types
        raise CheckpointError(f"{path.name}: unreadable safetensors file ({e})") from e


def _check_headers(paths: set[Path]) -> None:
    """Reject truncated files: the header's largest data offset must fit in the file."""
    for p in sorted(paths):
        with p.open("rb") as fh:  # the header only: a 6 GB shard is not read into memory to check it
            raw = fh.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{p.name}: truncated safetensors file (no header)")
            n = int.from_bytes(raw, "little")
            size = p.stat().st_size
            if 8 + n > size:
                raise CheckpointError(
                    f"{p.name}: truncated safetensors file (header claims {n} bytes, file {size})"
                )
            try:
                header = json.loads(fh.read(n))
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{p.name}: corrupt safetensors header ({e})") from e
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise CheckpointError(
                f"{p.name}: truncated safetensors file: data needs {8 + n + end} bytes, file has {size}"
            )


def iter_tensors(
    files: dict[str, Path], names: list[str] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for ``names`` (default: all), opening each file once."""
    by_file: dict[Path, list[str]] = {}
    for name in names if names is not None else files:
        by_file.setdefault(files[name], []).append(name)
    for f, fnames in by_file.items():
        with _open(f) as st:
            for name in fnames:
                yield name, st.get_tensor(name)


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_expert_names(names: list[str]) -> dict[str, list[str]]:
    """Group published per-expert names into our fused parameters.

    ``...mlp.experts.{e}.gate_proj.weight`` + ``up_proj`` → ``...mlp.experts.gate_up_proj`` ``[E, 2I, H]``
    (gate rows first); ``...down_proj.weight`` → ``...mlp.experts.down_proj`` ``[E, H, I]``. Returns
    ``{fused name: [source names in stacking order]}``; gate_up lists all gates then all ups.
    """
    groups: dict[tuple[str, str], dict[int, str]] = {}
    for n in names:
        m = _EXPERT.match(n)
        if m:
            groups.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = n
    fused: dict[str, list[str]] = {}
    for (prefix, kind), by_e in groups.items():
        ordered = [by_e[e] for e in sorted(by_e)]
        if kind == "down_proj":
            fused[f"{prefix}.down_proj"] = ordered
        else:
            fused.setdefault(f"{prefix}.gate_up_proj", [])
            fused[f"{prefix}.gate_up_proj"] = (
                ordered + fused[f"{prefix}.gate_up_proj"]
                if kind == "gate_proj"
                else fused[f"{prefix}.gate_up_proj"] + ordered
            )
    return fused


def merged_sources(module: torch.nn.Module) -> dict[str, list[tuple[str, int]]]:
    """Our merged projection parameters → their published parts, from every :class:`~.layers.MergedLinear`.

    ``{"layers.0.self_attn.qkv_proj.weight": [("layers.0.self_attn.q_proj.weight", 512), ("...k_proj.weight",
    256), ("...v_proj.weight", 256)], ...}``: the parts' tensors, concatenated along dim 0 in this order, are
    the merged tensor; the ints are each part's rows.
    """
    from omniduplex.models.layers import (
        MergedLinear,  # local: layers imports kernels, which checkpoint users may not need
    )

    out: dict[str, list[tuple[str, int]]] = {}
    for mod_name, mod in module.named_modules():
        if isinstance(mod, MergedLinear):
            parent = mod_name.rsplit(".", 1)[0] + "." if "." in mod_name else ""
            own = f"{mod_name}." if mod_name else ""
            for leaf in ("weight", "bias") if mod.bias is not None else ("weight",):
                out[own + leaf] = [(f"{parent}{part}.{leaf}", rows) for part, rows in mod.parts]
    return out


def published_shapes_of(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Published tensor name → shape of every tensor of ``module``'s state dict, with merged projections
    and fused experts split back into the names of the published checkpoints (the inverse of
    :func:`load_state_dict_into`'s mapping)."""
    merged = merged_sources(module)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, t in module.state_dict().items():
        prefix = name.rsplit(".", 1)[0]
        if name in merged:
            shapes.update({src: (rows, *t.shape[1:]) for src, rows in merged[name]})
        elif name.endswith("experts.gate_up_proj"):
            e, two_i, h = t.shape
            for kind in ("gate_proj", "up_proj"):
                shapes.update({f"{prefix}.{i}.{kind}.weight": (two_i // 2, h) for i in range(e)})
        elif name.endswith("experts.down_proj"):
            shapes.update({f"{prefix}.{i}.down_proj.weight": tuple(t.shape[1:]) for i in range(t.shape[0])})
        else:
            shapes[name] = tuple(t.shape)
    return shapes


def load_state_dict_into(
    module: torch.nn.Module,
    files: dict[str, Path],
    prefix: str = "",
    ignore: tuple[str, ...] = (),
    dtype: torch.dtype | None = None,
) -> None:
    """Copy checkpoint tensors ``prefix + name`` into ``module``'s parameters, strictly.

    Per-expert MoE tensors are fused (see :func:`fuse_expert_names`) and the parts of merged projections
    concatenated (see :func:`merged_sources`). Tensor names starting with one of ``ignore`` (e.g.
    ``thinker.visual.``) are skipped.

    Raises:
        CheckpointError: a tensor is missing, has the wrong shape, or the checkpoint holds a tensor under
            ``prefix`` that the config does not account for (config contradicts weights).
    """
    ours = module.state_dict()
    tied = {n for n, p in module.named_parameters(remove_duplicate=False)} - {
        n for n, _ in module.named_parameters()
    }
    avail = [n[len(prefix) :] for n in files if n.startswith(prefix) and not n.startswith(ignore)]
    fused = fuse_expert_names(avail)
    merged = merged_sources(module)
    fused.update({name: [src for src, _ in parts] for name, parts in merged.items()})
    consumed = {s for srcs in fused.values() for s in srcs}
    plain = set(avail) - consumed
    unexpected = sorted((plain - set(ours)) | {f for f in fused if f not in ours})
    if unexpected:
        raise CheckpointError(
            f"checkpoint tensor '{prefix}{unexpected[0]}' is not part of the model the config "
            f"describes ({len(unexpected)} such tensors) — config and weights disagree"
        )
    have = set(avail)
    for name, param in ours.items():
        if name in tied and name not in plain:
            continue
        if name in plain:
            ((_, t),) = iter_tensors(files, [prefix + name])
        elif name in merged:
            srcs = [src for src, _ in merged[name]]
            missing = [s for s in srcs if s not in have]
            if missing:
                rows = dict(merged[name])[missing[0]]
                raise CheckpointError(
                    f"missing tensor '{prefix}{missing[0]}' (expected shape {[rows, *param.shape[1:]]})"
                )
            parts = dict(iter_tensors(files, [prefix + s for s in srcs]))
            pieces = [parts[prefix + s] for s in srcs]
            for (src, rows), piece in zip(merged[name], pieces):
                if tuple(piece.shape) != (rows, *param.shape[1:]):
                    raise CheckpointError(
                        f"tensor '{prefix}{src}' in {files[prefix + src]} has shape {list(piece.shape)}, "
                        f"the config implies {[rows, *param.shape[1:]]}"
                    )
            t = torch.cat(pieces)
        elif name in fused:
            srcs = fused[name]
            parts = dict(iter_tensors(files, [prefix + s for s in srcs]))
            t = _stack_experts(name, [parts[prefix + s] for s in srcs])
        else:
            raise CheckpointError(f"missing tensor '{prefix}{name}' (expected shape {list(param.shape)})")
        if tuple(t.shape) != tuple(param.shape):
            raise CheckpointError(
                f"tensor '{prefix}{name}' in {files.get(prefix + name, 'checkpoint')} has shape "
                f"{list(t.shape)}, the config implies {list(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(t.to(dtype or param.dtype))


def _stack_experts(name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    if name.endswith("down_proj"):
        return torch.stack(tensors)
    half = len(tensors) // 2
    return torch.cat((torch.stack(tensors[:half]), torch.stack(tensors[half:])), dim=1)
