"""Intra-op threads that follow the CPU other processes leave free: steady throughput on a shared host.

An OpenMP parallel region ends at a barrier, so it runs at the pace of its slowest thread. When another
process keeps a core busy, one of our threads is descheduled for whole scheduler slices while the others
wait at the barrier (spinning, by the OpenMP default), and every one of the hundreds of small regions of a
decode step pays for it: measured here, 2 threads beside one busy process fall to a fraction of 1 thread's
speed. :class:`ThreadGovernor` samples how much CPU the rest of the host used (``/proc/stat`` minus this
process's own CPU time) about twice a second and sets ``torch.set_num_threads`` to the cores left free,
between 1 and the count the process was configured with. The policy is the pure :func:`pick_threads`.
"""

from __future__ import annotations

import os
import time

import torch

SAMPLE_EVERY_S = 0.5
"""Seconds between two readings of ``/proc/stat`` (a reading costs ~20 µs)."""


def pick_threads(max_threads: int, num_cpus: int, others_busy_cpus: float) -> int:
    """Intra-op threads for a process allowed ``max_threads``, on ``num_cpus`` cores of which other
    processes kept ``others_busy_cpus`` (a float, cores' worth) busy in the last interval.

    A core counts as free when others used less than 3/4 of it (so one busy process on 2 cores leaves 1).
    """
    free = num_cpus - others_busy_cpus
    return max(1, min(max_threads, int(free + 0.25)))


def _host_busy_seconds() -> float | None:
    """CPU seconds all cores of the host spent busy since boot (``/proc/stat``); ``None`` if unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user
    vals = [int(x) for x in fields[1:9]]
    busy = sum(vals) - vals[3] - vals[4]
    return busy / os.sysconf("SC_CLK_TCK")


class ThreadGovernor:
    """Keeps ``torch``'s intra-op thread count at the cores other processes leave free.

    Args:
        max_threads: the most threads to use (default: ``torch.get_num_threads()`` at construction).
        num_cpus: cores this process may run on (default: its CPU affinity).

    Call :meth:`update` once per engine step; it reads ``/proc/stat`` at most every
    :data:`SAMPLE_EVERY_S` and changes the thread count only when :func:`pick_threads` says so. Does
    nothing where ``/proc/stat`` is unreadable or ``max_threads`` is 1.
    """

    def __init__(self, max_threads: int | None = None, num_cpus: int | None = None) -> None:
        self.max_threads = max_threads or torch.get_num_threads()
        self.num_cpus = num_cpus or len(os.sched_getaffinity(0))
        self.threads = self.max_threads
        self.num_changes = 0
        self._last: tuple[float, float, float] | None = None
        self.enabled = self.max_threads > 1 and _host_busy_seconds() is not None

    def update(self) -> int:
        """Sample if due and set the thread count; returns the current count."""
        if not self.enabled:
            return self.threads
        now = time.perf_counter()
        if self._last is not None and now - self._last[0] < SAMPLE_EVERY_S:
            return self.threads
        host, own = _host_busy_seconds(), time.process_time()
        if host is None:
            return self.threads
        if self._last is not None:
            t0, host0, own0 = self._last
            others = max(0.0, (host - host0) - (own - own0)) / (now - t0)
            want = pick_threads(self.max_threads, self.num_cpus, others)
            if want != self.threads:
                torch.set_num_threads(want)
                self.threads = want
                self.num_changes += 1
        self._last = (now, host, own)
        return self.threads
