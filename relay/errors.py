"""Errors raised by the relay. Every failure of an edge surfaces as a subclass of :class:`RelayError`."""

from __future__ import annotations


class RelayError(Exception):
    """Base class of every relay error."""


class ProtocolError(RelayError):
    """A control message could not be decoded or broke the edge protocol (a bug or a foreign peer)."""


class EdgeClosed(RelayError):
    """The peer closed the edge cleanly (it sent ``Bye``), or this end was already closed."""


class ConsumerDied(EdgeClosed):
    """The consumer of an edge vanished (process died, connection lost, or it was replaced by a restart).

    Raised by the producer. The in-flight slots of the edge have been reclaimed when this is raised;
    chunks that were in flight are lost and must be re-sent by whoever owns the request.
    """


class ProducerDied(EdgeClosed):
    """The producer of an edge vanished (process died or connection lost). Raised by the consumer.

    Messages not yet returned by ``recv`` are dropped; the consumer re-attaches by itself when a
    producer binds the same address again.
    """


class EdgeTimeout(RelayError, TimeoutError):
    """Base class of the relay's timeouts."""


class BackpressureTimeout(EdgeTimeout):
    """The producer waited ``timeout_s`` for a free slot (credit) and none came back."""


class AttachTimeout(EdgeTimeout):
    """The producer waited ``timeout_s`` for a consumer to attach to the edge and none did."""
