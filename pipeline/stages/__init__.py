"""Stage workers: the logic of one pipeline stage, independent of how messages reach it.

Each worker has ``submit(msg)``, ``abort(request_id)``, ``step() -> list[StageMessage]`` and
``has_work()``; the stage process (or an in-process loop in tests) feeds it and forwards its outputs.
Optional, for workers that need them: ``pop_errors() -> [(request_id, error)]`` (requests the worker's
engine failed on its own; the stage fails each turn, read by :func:`failed_requests` after every step),
``stats() -> dict`` (its own gauges, :func:`..stage_stats.worker_stats`) and ``close()`` (release
resources of its own when the stage stops). The LLM stage on vLLM (:mod:`.vllm_llm`) has all three.
"""


def failed_requests(worker) -> list[tuple[str, str]]:
    """``(request_id, error)`` of the requests ``worker`` failed since the last call (its ``pop_errors``);
    ``[]`` for workers without one."""
    pop = getattr(worker, "pop_errors", None)
    return pop() if callable(pop) else []
