"""Progress of the one-time steps of a first start (a C++ kernel build, a model import or conversion into
the cache): one line on stderr when a step starts and one with its duration when it ends, so a first run that
takes minutes says what it is doing. Later runs find the result cached and print nothing."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _say(line: str) -> None:
    print(f"omniduplex: {line}", file=sys.stderr, flush=True)


def announce(what: str, where: str = "") -> Callable[[], None]:
    """Print that the step ``what`` starts (``where``: where its result is cached); returns the function that
    prints that it is done, with its duration in seconds."""
    _say(f"{what} (once{f'; cached in {where}' if where else ''})...")
    t0 = time.monotonic()
    return lambda: _say(f"{what}: done in {time.monotonic() - t0:.1f} s")


@contextmanager
def one_time_step(what: str, where: str = "") -> Iterator[None]:
    """:func:`announce` around the ``with`` block (nothing more is printed when the block raises: its error
    says why)."""
    done = announce(what, where)
    yield
    done()
