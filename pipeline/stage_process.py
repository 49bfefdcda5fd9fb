"""The main loop of one stage process: receive on the input edge, step the worker, send downstream.

Wiring (all ``ipc://`` under one run directory): each edge's producer binds, its consumer connects
(the relay). A control bus (ZMQ PUB → SUB) carries ``abort <id>`` / ``stop`` from the orchestrator;
a status bus (PUSH → PULL) carries ``ready`` and per-request errors back to it. Request ids are
ints on the wire and strings inside the workers.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass

import torch
import zmq

from omniduplex.relay import ConsumerDied, EdgeConfig, EdgeConsumer, EdgeProducer, RelayError

from .config import PipelineConfig
from .messages import StageMessage
from .topology import Topology

META_KEY = "__meta__"
POLL_BUSY_S = 0.0002
"""Shortest wait on an input edge (s). Not 0: the relay consumer handles (re)connection events only
while it waits, so a zero timeout would never attach to a producer that binds later."""


@dataclass
class Wiring:
    """Addresses of one pipeline run: ``run_dir`` holds the ipc sockets."""

    run_dir: str

    def edge(self, src: str, dst: str) -> str:
        return f"ipc://{self.run_dir}/{src}-{dst}.sock"

    @property
    def control(self) -> str:
        return f"ipc://{self.run_dir}/control.sock"

    @property
    def status(self) -> str:
        return f"ipc://{self.run_dir}/status.sock"


def edge_config(pcfg: PipelineConfig, src: str, dst: str) -> EdgeConfig:
    e = pcfg.edges.get(f"{src}->{dst}")
    return EdgeConfig(slots=e.slots, slot_bytes=e.slot_bytes) if e else EdgeConfig(slots=16)


def pack(msg: StageMessage, edge: tuple[str, str], topo: Topology) -> dict[str, torch.Tensor]:
    """Tensors of ``msg`` that travel on ``edge`` (``topo.edge_tensors``), plus its meta as a JSON byte
    tensor."""
    keep = topo.edge_tensors[edge]
    out = {k: v.contiguous() for k, v in msg.tensors.items() if keep is None or k in keep}
    if msg.meta:
        out[META_KEY] = torch.frombuffer(bytearray(json.dumps(msg.meta).encode()), dtype=torch.uint8)
    return out


def unpack(request_id: int, tensors: dict[str, torch.Tensor], last: bool) -> StageMessage:
    meta = json.loads(bytes(tensors.pop(META_KEY).numpy()).decode()) if META_KEY in tensors else {}
    return StageMessage(str(request_id), tensors, meta, last)


def stage_main(stage: str, pcfg_json: str, run_dir: str) -> None:
    """Entry point of a stage process (``multiprocessing`` spawn target)."""
    from .graph import build_worker

    pcfg = PipelineConfig.model_validate_json(pcfg_json)
    topo = pcfg.topology()
    scfg = pcfg.stage(stage)
    torch.set_num_threads(scfg.torch_threads)
    wiring = Wiring(run_dir)
    ctx = zmq.Context.instance()
    status = ctx.socket(zmq.PUSH)
    status.connect(wiring.status)
    control = ctx.socket(zmq.SUB)
    control.connect(wiring.control)
    control.setsockopt(zmq.SUBSCRIBE, b"")
    producers = {
        dst: EdgeProducer(f"{stage}-{dst}", wiring.edge(stage, dst), edge_config(pcfg, stage, dst))
        for dst in topo.out_edges(stage)
    }
    src = topo.upstream(stage)
    consumer = EdgeConsumer(f"{src}-{stage}", wiring.edge(src, stage))
    worker = build_worker(stage, pcfg.model, scfg, pcfg.chunking, pcfg.side_asr)
    status.send_json({"kind": "ready", "stage": stage, "pid": os.getpid()})
    seqs: dict[tuple[str, str], int] = {}

    def fail(rid: str, error: str) -> None:
        worker.abort(rid)
        status.send_json({"kind": "error", "stage": stage, "request_id": int(rid), "error": error})

    while True:
        while control.poll(0):
            cmd = control.recv_string()
            if cmd == "stop":
                for p in producers.values():
                    p.close()
                consumer.close()
                return
            if cmd.startswith("abort "):
                rid = cmd.split()[1]
                worker.abort(rid)
                consumer.abort(int(rid))
                for p in producers.values():
                    p.abort(int(rid))
        busy = worker.has_work()
        try:
            m = consumer.recv(timeout_s=POLL_BUSY_S if busy else 0.005)
            while m is not None:
                msg = unpack(m.request_id, m.tensors, m.last)
                try:
                    worker.submit(msg)
                except Exception as e:  # bad input for this request only
                    fail(msg.request_id, f"{stage}: {e}")
                m = consumer.recv(timeout_s=0)
        except RelayError:
            # upstream stage stopped or died: its turns are failed by the orchestrator, which restarts
            # it; our consumer re-attaches when the new producer binds.
            time.sleep(0.01)
        if not worker.has_work():
            continue
        for msg in worker.step():
            for dst in producers:
                tensors = pack(msg, (stage, dst), topo)
                if not (set(tensors) - {META_KEY}) and not msg.last:
                    continue  # nothing for this edge in this message
                key = (msg.request_id, dst)
                seq = seqs.get(key, 0)
                seqs[key] = seq + 1
                try:
                    try:
                        producers[dst].send(int(msg.request_id), tensors, seq=seq, last=msg.last)
                    except ConsumerDied:
                        # reported once, at the first send after the consumer died (its turns were failed
                        # by the orchestrator): this chunk was not sent; send it to the restarted consumer
                        producers[dst].send(int(msg.request_id), tensors, seq=seq, last=msg.last)
                except RelayError as e:
                    fail(msg.request_id, f"{stage}->{dst}: {e}")
                if msg.last:
                    seqs.pop(key, None)


def run_stage(stage: str, pcfg_json: str, run_dir: str) -> None:
    """``stage_main`` with a last-resort report of an unexpected crash on stderr."""
    try:
        stage_main(stage, pcfg_json, run_dir)
    except Exception:
        traceback.print_exc()
        raise
