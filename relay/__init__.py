"""Relay: streams named tensors between pipeline stages (separate processes, possibly other hosts).

Per directed edge, a ZMQ control plane carries small typed messages (:mod:`.messages`) and a data
plane of pre-allocated slots carries the bytes: shared memory on one host (:mod:`.shm_pool`), ZMQ
frames over TCP (:mod:`.tcp`), or CUDA IPC (:mod:`.cuda_ipc`). Credits (free slots) bound memory:
the producer blocks when the consumer falls behind. Entry points: :class:`EdgeProducer`,
:class:`EdgeConsumer`, :class:`EdgeConfig`. This package knows nothing of models.
"""

from omniduplex.relay.consumer import EdgeConsumer
from omniduplex.relay.cuda_ipc import cuda_ipc_available
from omniduplex.relay.edge import EdgeConfig, EdgeStats, Message, ipc_address
from omniduplex.relay.errors import (
    AttachTimeout,
    BackpressureTimeout,
    ConsumerDied,
    EdgeClosed,
    EdgeTimeout,
    ProducerDied,
    ProtocolError,
    RelayError,
)
from omniduplex.relay.producer import EdgeProducer
from omniduplex.relay.shm_pool import list_segments, sweep_orphans
from omniduplex.relay.tcp import tcp_address

__all__ = [
    "AttachTimeout", "BackpressureTimeout", "ConsumerDied", "EdgeClosed", "EdgeConfig", "EdgeConsumer",
    "EdgeProducer", "EdgeStats", "EdgeTimeout", "Message", "ProducerDied", "ProtocolError", "RelayError",
    "cuda_ipc_available", "ipc_address", "list_segments", "sweep_orphans", "tcp_address",
]
