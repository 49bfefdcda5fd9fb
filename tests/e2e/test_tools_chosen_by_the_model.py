"""Tools the model chooses by itself (``tool_choice: "auto"``) on ``omniduplex serve --mcp
orders[order_status]=...`` run as a user runs it (a child process, no ``OMNIDUPLEX_*`` variable:
tests/served.py; Qwen2.5-Coder-0.5B: the 135M default model is not relied on to choose a tool):

* ``POST /v1/chat/completions`` with the ``openai`` SDK: the weather question comes back as ``tool_calls``.

(A spoken question on ``auto`` — Realtime or a Twilio call — was tried here too: the 0.5B model answered in
words instead of calling, so those run with a forced choice: tests/e2e/test_realtime_tools_e2e.py, and on
this same server, started with ``--tool-choice required`` for its voice sessions,
tests/e2e/test_phone_mcp_served.py; the requests here name their own ``tool_choice``.)

No request leaves a traceback in the server's log.
"""

from __future__ import annotations

import json

import openai
import pytest
from test_realtime_tools_e2e import WEATHER

pytestmark = pytest.mark.slow
WEATHER_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
"""The Realtime ``get_weather`` tool in the Chat Completions shape."""
LISBON = [{"role": "user", "content": "What's the weather like in Lisbon right now?"}]


def no_traceback(server) -> None:
    log = server.log()
    assert "Traceback" not in log, log[-4000:]


def test_auto_tool_call_chosen_by_the_model(mcp_server):
    """``tool_choice: "auto"``: the default 0.5B model decides to call the tool itself."""
    client = openai.OpenAI(base_url=mcp_server.url("/v1"), api_key="unused", timeout=300, max_retries=0)
    r = client.chat.completions.create(
        model="omniduplex", messages=LISBON, tools=[WEATHER_TOOL], tool_choice="auto"
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    city = json.loads(call.function.arguments)["city"]
    assert "lisbo" in city.lower(), city  # "Lisbon" (or the model's "Lisboa")
    no_traceback(mcp_server)

