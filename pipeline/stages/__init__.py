"""Stage workers: the logic of one pipeline stage, independent of how messages reach it.

Every worker implements :class:`.contract.StageWorker` (``submit``, ``abort``, ``has_work``, ``step``,
``stats``, ``pop_errors``, ``close``); the stage process (or the in-process loop) feeds it and forwards its
outputs. :mod:`omniduplex.pipeline.workers` builds the worker of each stage kind.
"""
