"""Our C++ CPU kernels of a decode step (``csrc/cpu_ops.cpp``), built once per machine, loaded as torch ops.

Ops (namespace ``torch.ops.omniduplex_cpu``):

- ``paged_decode_attention(q [S, Hq, D], k_cache, v_cache [NB, 16, Hkv, D], block_tables int32 [S, MB],
  seq_lens int32 [S], scale) -> [S, Hq, D]``: one query per sequence over the paged cache (layout of
  :mod:`.paged_attention_ref`), fp32 accumulation; the dtype of ``q`` (fp32, bf16 or fp16).
- ``write_kv_cache(k_cache, v_cache, k, v, slot_mapping)``: in place, as :func:`.paged_attention_ref
  .write_kv_cache` (slot ``-1`` writes nothing); raises on a slot outside the cache.
- ``register_packed(packed) -> key`` / ``packed_linear(x [T, in], key, bias, out_features) -> [T, out]``:
  a oneDNN-packed weight (:mod:`.cpu_linear`) kept by key, so compiled graphs can name it.
- ``moe_experts(x [T, H], gate_up_proj [E, 2I, H], down_proj [E, H, I], weights [T, k], ids [T, k],
  packed_key) -> [T, H]``: as :func:`omniduplex.kernels.moe.moe_experts`, summed in fp32.
- ``rms_norm(x [..., H], w [H], eps)``, ``add_rms_norm(x, delta, w, eps) -> (x + delta, rms_norm(...))``,
  ``rotary_(q [T, Hq, D], k [T, Hkv, D], cos, sin fp32 [T, D])`` (rotate-half RoPE in place, bit-equal to
  :func:`omniduplex.models.layers.apply_rotary`), ``silu_and_mul(x [T, 2I]) -> [T, I]`` (bit-equal to
  ``F.silu(gate) * up``): the glue between a layer's GEMMs, one call each instead of ~100 ATen calls a layer
  (vLLM's CPU backend fuses the same: ``rms_norm``, ``fused_add_rms_norm``, ``rotary_embedding``,
  ``silu_and_mul``). RMSNorm sums the squares in another order than ATen (results within ~1 ulp).
- ``register_quant_layer(...) -> key`` / ``quant_decode_layer(x [S, H], key, cos, sin, k_cache, v_cache,
  slot_mapping, block_tables, seq_lens) -> [S, H]``: a layer whose projections are GGUF blocks
  (:mod:`omniduplex.models.cascade.gguf_quantized`) runs a decode-only step (one token per sequence) as one
  call: the per-op path's kernels in its order, so the same result, without ~30 Python calls a layer.

They replace Python glue that cost more than the GEMMs it joins (measured in the issue-17 note). The
extension is compiled with ``torch.utils.cpp_extension.load`` (g++ and ninja, ``-O3 -march=native``, one
build per CPU kind and source, ~15 s on two cores, cached under ``$TORCH_EXTENSIONS_DIR`` or
``~/.cache/torch_extensions``; processes starting together wait for the first one's build). Where it cannot
be built (no compiler), or with ``OMNIDUPLEX_CPU_OPS=0``, :func:`available` is ``False`` and the callers keep
their plain-torch paths.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from pathlib import Path

import torch

from omniduplex.kernels.once import announce

log = logging.getLogger(__name__)

ENV = "OMNIDUPLEX_CPU_OPS"
"""``0`` turns the C++ kernels off (plain-torch paths everywhere), e.g. to compare the two."""

SOURCE = Path(__file__).with_name("csrc") / "cpu_ops.cpp"
SOURCES = (SOURCE, SOURCE.with_name("decode_gqa.cpp"))
"""Compiled into one extension: the ops above, and the q_len = 1 GQA decode fast path (``decode_gqa.cpp``)."""
_lock = threading.Lock()
_state: dict[str, bool | str] = {}


class CpuOpsBuildError(RuntimeError):
    """The C++ extension could not be compiled or loaded (message: the compiler's reason)."""


def _cpu_flags() -> set[str]:
    """The CPU's ISA flags (``/proc/cpuinfo``); empty where unreadable."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    return set(next((ln for ln in lines if ln.startswith("flags")), "").split())


def _build_tag() -> str:
    """Short hash of the CPU's ISA flags and of the source: ``-march=native`` code of one CPU kind may not run
    on another, and two checkouts with different sources must not rebuild one shared library in turn."""
    h = hashlib.sha1(" ".join(sorted(_cpu_flags())).encode())
    for src in SOURCES:
        h.update(src.read_bytes())
    return h.hexdigest()[:10]


def _isa_flags() -> list[str]:
    """``-DCPU_CAPABILITY_*`` for ATen's ``at::vec::Vectorized`` (as Inductor's C++ builds pass it): AVX-512
    or AVX2 where the CPU has it, else none (scalar vectors)."""
    flags = _cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return ["-DCPU_CAPABILITY_AVX512"]
    if {"avx2", "fma"} <= flags:
        return ["-DCPU_CAPABILITY_AVX2"]
    return []


def build_extension(name: str, sources: list[str], cflags: list[str], what: str) -> None:
    """Build (unless ``name``'s ``.so`` is cached) and load the torch C++ extension ``name`` from ``sources``
    with ``cflags`` (plus OpenMP linking), under ``$TORCH_EXTENSIONS_DIR`` (default
    ``~/.cache/torch_extensions``); ``what`` is the progress line of a first build.

    Stage processes start together and the first one builds. Our lock is an flock, which the kernel drops
    when its holder dies; torch's own lock is a file that a build killed midway leaves behind, after which
    every later start would wait on it forever, so it is cleared under ours.

    Raises:
        OSError, RuntimeError, ImportError: compiler or ninja missing, or the build failed.
    """
    from torch.utils.cpp_extension import load as build

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    build_dir = Path(root) / name
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "omniduplex.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        built = (build_dir / f"{name}.so").is_file()
        done = None if built else announce(what, str(root))
        build(
            name=name,
            sources=sources,
            extra_cflags=cflags,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
        if done is not None:
            done()


def load() -> None:
    """Build (first call on this machine) and load the extension; idempotent and thread-safe.

    Raises:
        CpuOpsBuildError: compiler or ninja missing, or the build failed.
    """
    with _lock:
        if _state.get("loaded"):
            return
        if hasattr(torch.ops.omniduplex_cpu, "moe_experts"):  # loaded by another copy of this module
            _state["loaded"] = True
            return
        name = f"omniduplex_cpu_ops_{_build_tag()}"
        try:
            build_extension(
                name, [str(src) for src in SOURCES], ["-O3", "-march=native", "-fopenmp", *_isa_flags()],
                "building the C++ CPU kernels",
            )
        except (OSError, RuntimeError, ImportError) as e:
            raise CpuOpsBuildError(f"building {SOURCE.name} failed: {e}") from e
        _register_fakes()
        _state["loaded"] = True


def available() -> bool:
    """``True`` when the ops are loaded (building them on first call); ``False`` with ``OMNIDUPLEX_CPU_OPS=0``
    or when the build fails (logged once, with the reason)."""
    if not enabled() or _state.get("failed"):
        return False
    if _state.get("loaded"):
        return True
    try:
        load()
    except CpuOpsBuildError as e:
        _state["failed"] = True
        log.warning("C++ CPU kernels unavailable, using the plain-torch paths: %s", e)
        return False
    return True


def fits_decode_kernel(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether ``paged_decode_attention`` takes these tensors: ``q`` and the cache of one dtype, a head size
    that is a multiple of 16 up to 128 (whole fp32 vectors of AVX-512 or AVX2, at most 16 of them); others
    stay on the torch path."""
    head_dim = q.shape[-1]
    return k_cache.dtype == q.dtype and head_dim % 16 == 0 and 16 <= head_dim <= 128


def enabled() -> bool:
    """``False`` when ``OMNIDUPLEX_CPU_OPS=0`` turns the C++ kernels off."""
    return os.environ.get(ENV, "1").strip() != "0"


def loaded() -> bool:
    """``True`` once the ops are loaded and :func:`enabled` (never builds them)."""
    return bool(_state.get("loaded")) and enabled()


def attach(model: torch.nn.Module) -> bool:
    """Switch the paged KV write, the MoE dispatch, RMSNorm, RoPE and SiLU·up of ``model``'s layers (modules
    with a ``use_cpu_ops`` attribute) onto the C++ ops when ``model`` is on the CPU and :func:`available`;
    returns whether it did. Decode attention needs no switch: the dispatcher of :mod:`.attention` takes
    the C++ kernel whenever it is loaded."""
    params = next(model.parameters(), None)
    on = params is not None and params.device.type == "cpu" and available()
    for mod in model.modules():
        if hasattr(mod, "use_cpu_ops"):
            mod.use_cpu_ops = on
    return on


def _register_fakes() -> None:
    """Shape functions for ``torch.compile`` (the C++ ops have CPU kernels only)."""
    lib = "omniduplex_cpu::"

    @torch.library.register_fake(lib + "paged_decode_attention")
    def _(q, k_cache, v_cache, block_tables, seq_lens, scale):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake(lib + "write_kv_cache")
    def _(k_cache, v_cache, k, v, slot_mapping):
        return None

    @torch.library.register_fake(lib + "packed_linear")
    def _(x, key, bias, out_features):
        return x.new_empty((x.shape[0], out_features))

    @torch.library.register_fake(lib + "moe_experts")
    def _(x, gate_up_proj, down_proj, weights, ids, packed_key):
        return torch.empty_like(x, memory_format=torch.contiguous_format)
