"""The cascade's LLM stage on vLLM (``backend: vllm`` in the stage graph): the same contract as
:class:`~.llm.LLMWorker` (see :mod:`.llm` for the messages in and out), with vLLM's V1 engine underneath.

Turns become prompts exactly as on our engine (:class:`~.chat_prompt.ChatPrompter`: same chat template, same
ids, same stop ids); vLLM gets the ids (``TokensPrompt``, ``skip_tokenizer_init``) and streams sampled ids
back (``RequestOutputKind.DELTA``); this worker detokenizes them itself (:class:`~.llm.TurnStream`), so the
text deltas and the stage messages are those of our engine. ``abort`` aborts the vLLM request (the engine core
frees its KV blocks at its next step); a request vLLM rejects or fails is reported through
:meth:`VLLMLLMWorker.pop_errors` (the stage fails that turn only); a dead engine raises from
:meth:`VLLMLLMWorker.step` (the stage process exits and is restarted).

Why ``AsyncLLM`` rather than the V1 engine core stepped from the stage loop: ``AsyncLLM`` is the engine
vLLM serves with (``vllm serve``). Its engine core runs its own busy loop in a child process (scheduling,
the forward pass and, on GPUs, asynchronous scheduling) and overlaps with this stage's relay I/O and
detokenization, and it is the one path on which tensor parallelism (``mp`` executor) and pipeline
parallelism across hosts (``ray``) work unchanged. Stepping the engine core in-process would match our
synchronous loop more literally, but would serialise the forward with the stage's I/O and needs
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, a mode the CPU backend discourages (it cannot bind its OpenMP
threads). The price is a thread: ``AsyncLLM`` runs on an asyncio loop in a daemon thread of the stage
process; :meth:`~VLLMLLMWorker.submit` and :meth:`~VLLMLLMWorker.abort` post to it, its outputs come
back on a thread-safe queue that :meth:`~VLLMLLMWorker.step` drains (waiting at most
:data:`STEP_WAIT_S` when nothing is ready, so neither backend spins a core while vLLM computes).

Processes: the stage process (frontend: this worker) → vLLM's ``EngineCore`` → on CPU one worker process
(vLLM's CPU backend always uses its ``mp`` executor), on GPUs one per tensor/pipeline rank. They are
spawned, not forked (``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unless set: this process has threads and ZMQ
sockets), so each imports vLLM afresh: the stage takes ~30-80 s to start on this 2-core machine. The stage
process is daemonic (the server's exit takes it down), and multiprocessing refuses children to daemonic
processes, so this worker clears the flag on its own process and turns SIGTERM into a normal exit, which
shuts vLLM's processes down with it; it also leads its own process group, which the process backend kills
when the stage dies outright (vLLM's engine core would outlive it).

Differences from our engine (documented, not hidden): vLLM's ``repetition_penalty`` also counts the
prompt's ids (ours only the generated ones), ``suppress_token_ids`` become ``logit_bias`` −100 (vLLM's
strongest ban, not a hard mask); greedy decoding (``temperature: 0``) is id-for-id the same in fp32
(tests/test_vllm_worker.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
from pathlib import Path

import torch

from omniduplex.models.checkpoint import read_config
from omniduplex.pipeline.config import StageConfig
from omniduplex.pipeline.engine.request import SamplingParams
from omniduplex.pipeline.messages import PartialTranscript, StageMessage
from omniduplex.pipeline.runtime.stage_engines import require_vllm
from omniduplex.pipeline.stages.chat_prompt import ChatPrompter, ChatTurn
from omniduplex.pipeline.stages.contract import WorkerBase
from omniduplex.pipeline.stages.llm import TurnStream, drain

STEP_WAIT_S = 0.002
"""Longest :meth:`VLLMLLMWorker.step` waits for vLLM's next output when none is ready (s)."""
CPU_DEFAULT_KV_GIB = 1.0
"""KV cache per worker on vLLM's CPU backend when the graph gives no ``kv_cache_gib`` (GiB)."""
GIB = 1 << 30
SHUTDOWN_S = 2.0
"""How long :meth:`VLLMLLMWorker.close` lets vLLM's processes exit before they are killed (s): its CPU worker
does not exit on its own within vLLM's default 5 s, and a stopping stage has 5 s in all."""


def engine_kwargs(model_dir: Path, cfg: StageConfig, dtype: torch.dtype, cpu: bool) -> dict:
    """vLLM ``AsyncEngineArgs`` keyword arguments for stage settings ``cfg`` (see :class:`.StageConfig`).

    ``dtype``: the resolved torch dtype (``auto`` already decided by :func:`..graph.auto_dtype`). ``cpu``:
    vLLM runs on its CPU backend (the KV default is then :data:`CPU_DEFAULT_KV_GIB`). The tokenizer stays
    with us (``skip_tokenizer_init``); stats reach :class:`VLLMLLMWorker` through its own stat logger only.
    """
    kv_gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else (CPU_DEFAULT_KV_GIB if cpu else None)
    return {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "dtype": str(dtype).removeprefix("torch."),
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_model_len": cfg.max_model_len,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "distributed_executor_backend": cfg.distributed_executor_backend,
        "kv_cache_memory_bytes": None if kv_gib is None else int(kv_gib * GIB),
        "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
        "seed": 0,
    }


def sampling_kwargs(sp: SamplingParams) -> dict:
    """vLLM ``SamplingParams`` keyword arguments for our :class:`SamplingParams` (ids out, no text).

    ``ignore_eos`` runs to ``max_tokens`` with the stop ids masked, as on our engine (vLLM's
    ``min_tokens = max_tokens`` masks them); ``suppress_token_ids`` → ``logit_bias`` −100.
    """
    kw = {
        "temperature": sp.temperature,
        "top_k": sp.top_k,
        "top_p": sp.top_p,
        "repetition_penalty": sp.repetition_penalty,
        "max_tokens": sp.max_tokens,
        "stop_token_ids": list(sp.stop_token_ids),
        "seed": sp.seed,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if sp.ignore_eos:
        kw.update(ignore_eos=True, min_tokens=sp.max_tokens)
    if sp.suppress_token_ids:
        kw["logit_bias"] = {int(i): -100.0 for i in sp.suppress_token_ids}
    return kw


def _describe(e: BaseException) -> str:
    """The root cause of a failed vLLM request, ``"<ExceptionType>: <message>"``."""
    while e.__cause__ is not None and not str(e):
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


def _allow_children() -> None:
    """Let this (daemonic) stage process start vLLM's processes, exit cleanly on SIGTERM so that vLLM's
    finalizers stop them, and lead a process group of its own: vLLM's engine core does not notice its
    frontend's death, so a stage killed outright would leave it running; the process backend kills the group
    of a dead stage (:func:`..process_backend.kill_leftovers`)."""
    proc = multiprocessing.current_process()
    if not proc.daemon:  # in-process backend: the server's own process and signal handlers stay as they are
        return
    proc.daemon = False
    os.setpgid(0, 0)  # vLLM's processes join this stage's own group: the backend kills it if the stage dies
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


class VLLMLLMWorker(WorkerBase):
    """The cascade LLM stage on vLLM's ``AsyncLLM``: ``submit`` / ``abort`` / ``step`` / ``has_work`` as
    :class:`~.llm.LLMWorker`, plus ``pop_errors`` (failed turns), ``stats`` and ``close``.

    Args:
        model_dir: an HF-layout checkpoint vLLM supports (``config.json``, ``*.safetensors``), holding
            ``tokenizer.json`` and optionally a chat template (the cascade's GGUF is imported into such a
            folder first: :func:`omniduplex.models.cascade.manifest.resolve_llm`).
        cfg: the stage's settings (``backend: vllm`` keys, :class:`.StageConfig`).
        dtype: the weights' and activations' dtype.

    Raises:
        VLLMUnavailableError: vLLM is not installed.
        CheckpointError: no ``tokenizer.json`` / eos token.
        Exception: whatever vLLM raises when its engine cannot start (unsupported model, too little memory).
    """

    def __init__(self, model_dir: str | Path, cfg: StageConfig, dtype: torch.dtype = torch.float32) -> None:
        model_dir = Path(model_dir)
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            require_vllm("llm", cause=str(e))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        self.chat = ChatPrompter(model_dir, read_config(model_dir))
        self.tokenizer, self.stop_ids = self.chat.tokenizer, self.chat.stop_ids
        cpu = current_platform.is_cpu()
        self.args = AsyncEngineArgs(**engine_kwargs(model_dir, cfg, dtype, cpu))
        if cpu:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override the graph's kv_cache_gib
        # a forked engine core would inherit this process's threads and ZMQ sockets
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        _allow_children()

        self.turns: dict[str, TurnStream] = {}
        self.tasks: dict[str, concurrent.futures.Future] = {}  # each turn's generate() on the loop
        self._ready: list[StageMessage] = []  # skipped turns, emitted at the next step
        self._errors: list[tuple[str, str]] = []
        self._out: queue.SimpleQueue = queue.SimpleQueue()  # (request id, new ids, finish reason, error)
        self.sched: dict[str, float] = {}  # the engine core's last scheduler stats (see stats())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-frontend", daemon=True)
        self._thread.start()
        try:
            self.llm = self._call(self._start())
        except BaseException:
            self._stop_loop()
            raise
        self.block_size = int(self.llm.vllm_config.cache_config.block_size)
        self.num_blocks = int(self.llm.vllm_config.cache_config.num_gpu_blocks or 0)

    # -- the asyncio side (the "vllm-frontend" thread) -------------------------------------------------
    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self):
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(self.args, stat_loggers=[self._stat_logger_factory()])

    def _stat_logger_factory(self):
        """A vLLM per-engine stat logger that keeps the scheduler's gauges in :attr:`sched`."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        worker = self

        class Gauges(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                if scheduler_stats is not None:
                    worker.sched = {
                        "running": scheduler_stats.num_running_reqs,
                        "waiting": scheduler_stats.num_waiting_reqs,
                        "kv_cache_usage": scheduler_stats.kv_cache_usage,
                    }

            def log_engine_initialized(self) -> None:
                pass

        return lambda vllm_config, engine_index=0: Gauges(vllm_config, engine_index)

    async def _generate(self, rid: str, turn: ChatTurn) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        try:
            sp = VSamplingParams(**sampling_kwargs(turn.sampling), output_kind=RequestOutputKind.DELTA)
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=turn.ids), sp, request_id=rid):
                c = out.outputs[0]
                self._out.put((rid, list(c.token_ids), c.finish_reason if out.finished else None, None))
        except asyncio.CancelledError:  # our abort: generate() has aborted the request in vLLM
            raise
        except Exception as e:
            self._out.put((rid, [], None, _describe(e)))

    # -- the stage loop's side -----------------------------------------------------------------------
    def submit(self, msg: StageMessage) -> None:
        """Queue a turn (fields: :mod:`.llm`); vLLM sees it at once.

        Raises:
            ValueError: bad input for this turn (as :meth:`.LLMWorker.submit`) or a duplicate id.
        """
        rid = msg.request_id
        if isinstance(msg.meta, PartialTranscript):
            return  # a prefill hint (see .llm): vLLM's own prefix caching sees the turn's prompt at its end
        if rid in self.turns or any(m.request_id == rid for m in self._ready):
            raise ValueError(f"turn {rid}: already running")
        turn = self.chat.prepare(msg)
        if isinstance(turn, StageMessage):
            self._ready.append(turn)
            return
        self.turns[rid] = TurnStream(turn, self.tokenizer, self.stop_ids)
        self.tasks[rid] = asyncio.run_coroutine_threadsafe(self._generate(rid, turn), self._loop)

    def abort(self, request_id: str) -> None:
        """Drop a turn wherever it is; the abort has reached vLLM's engine core client when this returns (the
        engine core frees the request's KV blocks before its next step). No-op when unknown."""
        self._ready = [m for m in self._ready if m.request_id != request_id]
        self._errors = [e for e in self._errors if e[0] != request_id]
        task = self.tasks.pop(request_id, None)
        if self.turns.pop(request_id, None) is not None or task is not None:
            if task is not None:
                task.cancel()  # a generate() not yet past add_request never adds it
            self._call(self.llm.abort(request_id), timeout=30)

    def has_work(self) -> bool:
        """Turns in flight, or a dead engine (:meth:`step` then raises: the stage restarts)."""
        return bool(self._ready or self.turns) or self.llm.errored

    def step(self) -> list[StageMessage]:
        """The messages of every id vLLM sampled since the last call (in order per turn), plus skipped
        turns' single message; waits up to :data:`STEP_WAIT_S` when nothing is ready.

        Raises:
            RuntimeError: vLLM's engine died (every turn in flight is lost; the stage restarts).
        """
        outs, self._ready = self._ready, []
        items = drain(self._out, STEP_WAIT_S if self.turns and not outs else 0.0)
        for rid, ids, finish_reason, error in items:
            stream = self.turns.get(rid)
            if stream is None:  # aborted meanwhile
                continue
            if error is not None or finish_reason == "abort":
                self.turns.pop(rid)
                self.tasks.pop(rid, None)
                self._errors.append((rid, f"vLLM request failed: {error or 'aborted by the engine'}"))
                continue
            if not ids and finish_reason is None:
                continue
            for i, tok in enumerate(ids or [None]):  # no new id: the finish alone closes the stream
                outs += stream.messages(rid, tok, finish_reason if i == len(ids) - 1 or not ids else None)
                if outs[-1].last:
                    break
            if outs and outs[-1].request_id == rid and outs[-1].last:
                self.turns.pop(rid)
                task = self.tasks.pop(rid, None)
                if finish_reason is None:  # the reply ended itself (text budget, call limit)
                    if task is not None:
                        task.cancel()
                    self._call(self.llm.abort(rid), timeout=30)  # its KV blocks are free when step returns
        if self.llm.errored:
            raise RuntimeError(f"vLLM engine died: {self.llm.dead_error}")
        return outs

    def pop_errors(self) -> list[tuple[str, str]]:
        """Turns vLLM failed since the last call, as ``(request_id, error)``; the stage fails each one."""
        errors, self._errors = self._errors, []
        return errors

    def stats(self) -> dict[str, int]:
        """Gauges as :func:`..stage_stats.worker_stats` reports them, from the scheduler stats vLLM's engine
        core sent with its last outputs (it sends none while idle): ``queue_depth``, ``batch_size`` and the
        KV cache in vLLM's blocks (``block_size`` tokens each)."""
        usage = float(self.sched.get("kv_cache_usage", 0.0))
        used = round(usage * self.num_blocks)
        return {
            "queue_depth": int(self.sched.get("waiting", 0)),
            "batch_size": int(self.sched.get("running", 0)),
            "kv_blocks_used": used,
            "kv_blocks_free": self.num_blocks - used,
        }

    def close(self) -> None:
        """Abort every turn and shut vLLM's engine down (its processes exit)."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout=60)
        self._stop_loop()

    async def _shutdown(self) -> None:
        if self.turns:
            await self.llm.abort(list(self.turns))
        self.turns.clear()
        self.llm.shutdown(timeout=SHUTDOWN_S)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
