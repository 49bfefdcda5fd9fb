"""CUDA graphs per batch-size bucket, with a CPU twin: the capture/replay scheme of vLLM's model runner
(``vllm/v1/worker/gpu_model_runner.py``, ``capture_model``).

A :class:`GraphRunner` captures one callable per bucket (batch sizes 1, 2, 4, 8, …, :func:`bucket_sizes`).
The callable reads only static input buffers, allocated once for the largest bucket and updated in place
before each replay, and its outputs are static too: a replay rewrites the tensors the capture returned. A
batch of ``n`` rows is padded to the smallest bucket ``>= n`` by its caller (padding rows must be harmless:
the engine's write no KV, :mod:`.decode_graphs`) and its outputs are read back sliced to ``n``; a batch with
no bucket is a miss and runs eagerly.

Capture is a backend of the runner:

* :class:`CudaGraphBackend`: ``torch.cuda.CUDAGraph``. Each callable is first run on a side stream (lazy
  initialisations, cuBLAS workspaces and Triton compilation happen outside the capture), then captured; the
  largest bucket first, all into one memory pool shared by every runner of the backend, so the smaller
  graphs reuse the largest one's memory (``torch.cuda.graph(..., pool=...)``).
* :class:`TwinBackend` (CPU): the same callable on the same static buffers, run again at each replay, its
  results copied into the outputs of the first run. Every line of a runner and its callers runs on the
  CPU except the capture call itself, so the CPU suite tests what the GPU replays: the padding, the static
  buffers (their data pointers never change), the bucket choice, and equality with the eager step.

Host-side metadata a callable reads (a sequence-length bound, a batch size) is fixed when it is captured,
never read from the device: the CUDA capture forbids host syncs, and the twin keeps the same discipline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

GRAPH_MODES = ("auto", "cuda", "twin", "off")
"""``auto``: CUDA graphs on a CUDA device, none elsewhere (serving); ``cuda`` / ``twin``: that backend
(``twin``: the CPU tests and the benchmark's dry run); ``off``: every step eager."""

MAX_BUCKET = 512
"""Largest batch-size bucket captured by default (vLLM's default capture sizes end at 512)."""


def bucket_sizes(max_size: int, cap: int = MAX_BUCKET) -> list[int]:
    """Batch-size buckets ``1, 2, 4, 8, …`` below ``min(max_size, cap)``, then that size itself.

    Raises:
        ValueError: ``max_size < 1``.
    """
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    top = min(max_size, cap)
    sizes, b = [], 1
    while b < top:
        sizes.append(b)
        b *= 2
    return sizes + [top]


def pick_bucket(buckets: Sequence[int], n: int) -> int | None:
    """The smallest bucket ``>= n`` (``buckets`` ascending), or ``None`` when ``n`` exceeds them all."""
    for b in buckets:
        if b >= n:
            return b
    return None


def resolve_mode(mode: str, device: torch.device) -> str:
    """``auto`` → ``cuda`` on a CUDA device, else ``off``; others unchanged.

    Raises:
        ValueError: an unknown mode, or ``cuda`` on a device that is not CUDA.
    """
    if mode not in GRAPH_MODES:
        raise ValueError(f"graph mode {mode!r}; expected one of {', '.join(GRAPH_MODES)}")
    if mode == "auto":
        return "cuda" if device.type == "cuda" else "off"
    if mode == "cuda" and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, not {device.type}")
    return mode


Output = Any
"""What a captured callable returns: a tensor, or a tuple/list of tensors."""


def _tensors(out: Output) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)


class TwinBackend:
    """The CPU twin of :class:`CudaGraphBackend`: "capture" runs the callable once and keeps its outputs;
    a replay runs it again and copies the results into those outputs."""

    name = "twin"

    def capture(self, fn: Callable[[], Output]) -> tuple[Callable[[], None], Output]:
        """``fn`` run once; returns ``(replay, outputs)``."""
        out = fn()
        static = _tensors(out)

        def replay() -> None:
            for dst, src in zip(static, _tensors(fn())):
                dst.copy_(src)

        return replay, out

    def memory_bytes(self) -> int:
        """Device memory in use (the twin has none of its own: 0)."""
        return 0


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` capture into one memory pool shared by every runner of this backend.

    Args:
        device: the CUDA device.
        warmup: eager runs of a callable on the side stream before its capture.
    """

    name = "cuda"

    def __init__(self, device: torch.device, warmup: int = 2) -> None:
        self.device, self.warmup = device, warmup
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(device)

    def capture(self, fn: Callable[[], Output]) -> tuple[Callable[[], None], Output]:
        """Warm ``fn`` up on the side stream, then capture it; returns ``(graph.replay, outputs)``."""
        main = torch.cuda.current_stream(self.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            for _ in range(self.warmup):
                fn()
        main.wait_stream(self.side)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph.replay, out

    def memory_bytes(self) -> int:
        """Device memory in use (``total − free``), so a capture's cost is a difference of two readings."""
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free


def make_backend(mode: str, device: torch.device) -> TwinBackend | CudaGraphBackend | None:
    """The backend of a resolved mode (:func:`resolve_mode`): ``None`` for ``off``."""
    mode = resolve_mode(mode, device)
    if mode == "off":
        return None
    return CudaGraphBackend(device) if mode == "cuda" else TwinBackend()


class GraphRunner:
    """One callable captured per bucket and replayed; hit and miss counts.

    Args:
        name: what runs (``"thinker decode"``), for the log line.
        backend: :class:`CudaGraphBackend` or :class:`TwinBackend`.
        buckets: the batch sizes to capture (ascending, e.g. :func:`bucket_sizes`).

    Counters: ``hits`` (replays), ``misses`` (batches the caller ran eagerly: no bucket fits, or the caller's
    own limits), ``capture_s`` and ``capture_bytes`` (device memory the captures took; 0 on the twin).
    """

    def __init__(self, name: str, backend: TwinBackend | CudaGraphBackend, buckets: Sequence[int]) -> None:
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets must be ascending positive sizes, got {list(buckets)}")
        self.name, self.backend, self.buckets = name, backend, list(buckets)
        self.graphs: dict[int, tuple[Callable[[], None], Output]] = {}
        self.hits = self.misses = 0
        self.capture_s = 0.0
        self.capture_bytes = 0

    def capture(self, make_fn: Callable[[int], Callable[[], Output]]) -> None:
        """Capture ``make_fn(b)()`` for every bucket ``b``, largest first; logs one line (time, memory)."""
        t0, m0 = time.perf_counter(), self.backend.memory_bytes()
        for b in sorted(self.buckets, reverse=True):
            self.graphs[b] = self.backend.capture(make_fn(b))
        self.capture_s = time.perf_counter() - t0
        self.capture_bytes = max(0, self.backend.memory_bytes() - m0)
        log.info(
            "%s: %s graphs for batch sizes %s captured in %.2f s, %.1f MiB",
            self.name,
            self.backend.name,
            ",".join(map(str, self.buckets)),
            self.capture_s,
            self.capture_bytes / 2**20,
        )

    def bucket_for(self, n: int) -> int | None:
        """The bucket a batch of ``n`` rows replays in, or ``None`` (a miss)."""
        return pick_bucket(self.buckets, n)

    def replay(self, bucket: int) -> Output:
        """Replay the graph of ``bucket`` (its inputs already written); returns its static outputs."""
        run, out = self.graphs[bucket]
        run()
        self.hits += 1
        return out

    def miss(self) -> None:
        """Count a batch run eagerly."""
        self.misses += 1

    def stats(self) -> dict[str, int]:
        """``{"cuda_graph_hits": …, "cuda_graph_misses": …}``."""
        return {"cuda_graph_hits": self.hits, "cuda_graph_misses": self.misses}
