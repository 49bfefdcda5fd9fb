"""livekit-agents' AgentSession with an agent's ``@function_tool`` through our in-process realtime plugin
(in-memory room audio, no LiveKit server; the pipeline scripted at the session ↔ pipeline seam): the tool's
schema reaches the pipeline, the model's call comes out as an ``llm.FunctionCall`` the framework runs, the
call and its output come back through ``update_chat_ctx`` into the history the spoken reply is made from."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, function_tool  # noqa: E402
from livekit_io import MicInput, SpeakerOutput  # noqa: E402
from livekit_scripted import CHUNK_S, WORDS, ScriptedPipeline  # noqa: E402

from omniduplex.app.core.replies import ReplyDone  # noqa: E402
from omniduplex.app.core.tools import CallArgumentsDelta, CallDone, CallStarted  # noqa: E402
from omniduplex.app.surfaces.livekit.local_model import PipelineRealtimeModel  # noqa: E402


class ToolPipeline(ScriptedPipeline):
    """Calls ``get_weather`` when tools are offered and no output is in the history yet; else speaks."""

    def start(self, turn_id, waveform, history, options=None):
        options = options or {}
        answered = any(isinstance(h, dict) and h["type"] == "function_call_output" for h in history)
        if not options.get("tools") or options.get("tool_choice") == "none" or answered:
            return super().start(turn_id, waveform, history, options)
        self.started.append((turn_id, history, options))
        q = self.queues[turn_id] = asyncio.Queue()
        args = '{"city": "Paris"}'
        for ev in (CallStarted("call_lk1", "get_weather", 0), CallArgumentsDelta("call_lk1", args[:8]),
                   CallArgumentsDelta("call_lk1", args[8:]), CallDone("call_lk1", "get_weather", args),
                   ReplyDone({})):
            q.put_nowait(ev)


class WeatherAgent(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You tell the weather.")
        self.calls: list[str] = []

    @function_tool
    async def get_weather(self, city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: the city, e.g. Paris
        """
        self.calls.append(city)
        return "sunny, 21 degrees"


def test_an_agent_function_tool_is_called_and_its_result_spoken():
    async def main():
        pipeline = ToolPipeline(words=WORDS[:3])
        model = PipelineRealtimeModel(responder=pipeline, user_transcription=True)
        session = AgentSession(llm=model, aec_warmup_duration=None)
        session.input.audio, session.output.audio = MicInput(), SpeakerOutput()
        speaker, agent = session.output.audio, WeatherAgent()
        await model.start()
        await session.start(agent)
        rt = next(iter(model.sessions))
        session.generate_reply(user_input="What's the weather in Paris?")
        async with asyncio.timeout(30):
            while not (len(pipeline.started) >= 2 and speaker.reports):
                await asyncio.sleep(0.02)
        history = rt.session.history.snapshot()
        lk_items = [(i.type, getattr(i, "name", None)) for i in session.history.items]
        await session.aclose()
        return pipeline, agent, speaker, history, lk_items

    pipeline, agent, speaker, history, lk_items = asyncio.run(main())
    # the agent's tool reached the pipeline as an OpenAI function tool (the schema LiveKit derives)
    first = pipeline.started[0][2]
    (tool,) = first["tools"]
    assert tool["name"] == "get_weather" and tool["parameters"]["required"] == ["city"]
    assert first.get("tool_choice", "auto") == "auto"
    # the framework ran the call with the model's arguments
    assert agent.calls == ["Paris"]
    # the reply to the tool result was started over the call and its output, and spoken in full
    _, second_history, second = pipeline.started[1]
    call = next(h for h in second_history if isinstance(h, dict) and h["type"] == "function_call")
    output = next(h for h in second_history if isinstance(h, dict) and h["type"] == "function_call_output")
    assert (call["call_id"], call["name"], json.loads(call["arguments"])) == ("call_lk1", "get_weather",
                                                                               {"city": "Paris"})
    assert output["call_id"] == "call_lk1" and "sunny, 21 degrees" in output["output"]
    assert second.get("user_text") == ""  # it answers the conversation as it stands
    assert speaker.reports[0] == (pytest.approx(3 * CHUNK_S, abs=0.01), False)
    # our history and the framework's both hold the call and its output
    kinds = [h["type"] if isinstance(h, dict) else h[0] for h in history]
    assert kinds[:3] == ["user", "function_call", "function_call_output"] and kinds[-1] == "assistant"
    assert ("function_call", "get_weather") in lk_items
    assert ("function_call_output", "get_weather") in lk_items
