"""Give freed heap memory back to the OS after a session ends, so a long-running server's RSS tracks the
sessions it holds rather than the most it ever held.

glibc keeps freed blocks in its arenas (one per thread that allocated: the event loop, uvicorn, aiortc's
codec threads); ``malloc_trim(0)`` returns their free pages (``man 3 malloc_trim``). Elsewhere (musl,
macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

_libc = None
_last = 0.0
MIN_INTERVAL_S = 1.0
"""At most one trim per this many seconds (a trim walks every arena: ~1 ms per 100 MB here)."""


def release_free_memory() -> bool:
    """``malloc_trim(0)`` if glibc is there and the last trim is ``MIN_INTERVAL_S`` old; True if it ran."""
    global _libc, _last
    now = time.monotonic()
    if now - _last < MIN_INTERVAL_S:
        return False
    _last = now
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True
