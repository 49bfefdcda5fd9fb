"""Stage workers: the logic of one pipeline stage, independent of how messages reach it.

Each worker has ``submit(msg)``, ``abort(request_id)``, ``step() -> list[StageMessage]`` and
``has_work()``; the stage process (or an in-process loop in tests) feeds it and forwards its outputs.
"""
