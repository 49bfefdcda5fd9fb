"""The Realtime API's session ``voice`` travels with every reply to the pipeline (turn meta ``voice``), where
a Qwen3-TTS cascade stage speaks that speaker (tests/test_qwen3_tts_cascade.py)."""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from omniduplex.app.core.replies import OrchestratorResponder, ReplyDone
from omniduplex.app.server import ServerConfig, create_app
from omniduplex.pipeline.messages import TurnOptions


class RecordingResponder:
    """Records each turn's options; every reply ends at once."""

    output_rate = 24000

    def __init__(self) -> None:
        self.options: list[dict] = []

    def start(self, turn_id, waveform, history, options=None):
        self.options.append(dict(options or {}))

    async def events(self, turn_id):
        yield ReplyDone()

    def cancel(self, turn_id):
        pass


def _reply(ws) -> None:
    ws.send_json(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        }
    )
    ws.send_json({"type": "response.create"})
    while ws.receive_json()["type"] != "response.done":
        pass


def test_session_voice_goes_with_each_reply():
    resp = RecordingResponder()
    app = create_app(ServerConfig(max_sessions=2), responder=resp)
    with TestClient(app) as c, c.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        _reply(ws)  # before any session.update: the server's voice
        update = {"type": "realtime", "audio": {"output": {"voice": "aiden"}}}
        ws.send_json({"type": "session.update", "session": update})
        while (e := ws.receive_json())["type"] != "session.updated":
            pass
        assert e["session"]["audio"]["output"]["voice"] == "aiden"
        _reply(ws)
    assert "voice" not in resp.options[0] and resp.options[1]["voice"] == "aiden"


def test_orchestrator_responder_puts_the_voice_in_the_turn_meta():
    class Orch:
        output_rate = 24000

        def submit(self, waveform, meta, request_id=None):
            self.meta = meta

    orch = Orch()
    r = OrchestratorResponder(orch, TurnOptions(sampling={"max_tokens": 4}))
    r.start("t1", np.zeros(0, np.float32), [], {"voice": "serena"})
    assert orch.meta.voice == "serena" and orch.meta.sampling == {"max_tokens": 4}
    r.start("t2", np.zeros(0, np.float32), [], {})
    assert orch.meta.voice is None and orch.meta.sampling == {"max_tokens": 4}
