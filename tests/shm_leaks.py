"""Which relay segments a test left behind, on a machine where other pipelines may be running."""

from __future__ import annotations

import os

from omniduplex.relay.shm_pool import _NAME, list_segments, pid_alive


def left_behind(before: set[str]) -> set[str]:
    """Segments in /dev/shm that were not there in ``before`` and are either ours (this process) or owned by
    a process that has exited: what a stopped pipeline of this test leaked. Segments of other live processes
    (another pipeline or test run on the machine) are not ours to count."""
    out = set()
    for name in set(list_segments()) - before:
        owner = int(_NAME.match(name).group(1))
        if owner == os.getpid() or not pid_alive(owner):
            out.add(name)
    return out
