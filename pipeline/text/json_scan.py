"""Where a JSON value streamed character by character ends, without parsing it (RFC 8259 §2, §7).

Shared by the speakable-text filter (:class:`~.speakable.BlockFilter`, a JSON object in reply text) and
the tool-call parser (:mod:`omniduplex.pipeline.stages.tool_calls`, a call's arguments): each feeds one
character at a time and stops where :meth:`JsonValueEnd.step` says the value closed.
"""

from __future__ import annotations


class JsonValueEnd:
    """Nesting of the JSON value read so far: ``depth`` of open objects and arrays, and whether the last
    character left us inside a string (after a backslash: ``escaped``, so ``\\"`` does not close it).

    Only brackets and string quotes are tracked; a literal (``true``, ``12``) has no closing character of
    its own, so a top-level literal never ends here (callers read it whole)."""

    __slots__ = ("depth", "escaped", "in_string")

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped = 0, False, False

    def step(self, c: str) -> bool:
        """Read character ``c``; whether it ends the value: the ``}`` or ``]`` that closes the outermost
        bracket (a stray closer at depth 0 too), or the ``"`` that closes a top-level string."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
                return self.depth == 0
        elif c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth <= 0
        return False
